"""The Kubernetes API through lightkube: a client for one namespace, and its failures as one exception.

`connect(kubeconfig, context, namespace)` reads the configuration (in-cluster service account, $KUBECONFIG,
~/.kube/config, or the named file); `call(what, fn, *args)` runs one request and turns every way it can fail
(the API's refusal with its Status, an unreachable server, a bad kubeconfig) into KubeError, whose text says
what was asked, the HTTP status and the API's own message, e.g. `create Pod gpulayer-k8s-a100-3: 403
Forbidden: pods "gpulayer-k8s-a100-3" is forbidden: exceeded quota: gpus`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

TIMEOUT_S = 15.0
# lightkube (and httpx2 under it) is imported at first use: a control plane without a kubernetes provisioner
# never loads it, and starts as fast as before.


class KubeError(Exception):
    """A Kubernetes API request failed; `code` is the HTTP status (0: no answer, or no usable configuration)."""

    def __init__(self, message: str, code: int = 0, reason: str = ""):
        super().__init__(message)
        self.code = code
        self.reason = reason


def connect(kubeconfig: str = "", context: str = "", namespace: str = "default") -> Any:
    """A client for `namespace`: the file `kubeconfig` (its `context`, else its current one), or, when empty,
    the in-cluster service account, then $KUBECONFIG, then ~/.kube/config. KubeError when none is usable."""
    import httpx2
    from lightkube import Client, KubeConfig
    where = kubeconfig or "the in-cluster service account, $KUBECONFIG or ~/.kube/config"
    try:
        config = KubeConfig.from_file(Path(kubeconfig).expanduser()) if kubeconfig else KubeConfig.from_env()
        single = config.get(context_name=context or None)
        if single is None:
            raise KubeError(f"kubeconfig {where}: no context {context!r}" if context else
                            f"kubeconfig {where}: no current context")
        return Client(config=single, namespace=namespace, timeout=httpx2.Timeout(TIMEOUT_S), field_manager="gpulayer",
                      trust_env=False)
    except KubeError:
        raise
    except Exception as exc:  # noqa: BLE001 - a kubeconfig fails in many ways (YAML, missing keys, files it names)
        raise KubeError(f"kubeconfig {where} is not usable: {type(exc).__name__}: {_first_line(exc)}") from None


def _first_line(exc: Exception) -> str:
    """An error's first line, and for a YAML error where it is: never the file's text (a token may be there),
    which a parse error quotes from the second line on; the error goes to last_error, which clients read."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return (f"{getattr(exc, 'context', None) or ''} {problem or ''}".strip() if problem else
            (str(exc).splitlines() or [""])[0]) + where


def call(what: str, fn: Callable[..., Any], *args, **kwargs) -> Any:
    """`fn(*args, **kwargs)`, with every failure raised as KubeError("<what>: ...")."""
    import httpx2
    from lightkube import ApiError
    try:
        return fn(*args, **kwargs)
    except KubeError:
        raise
    except ApiError as exc:
        status = exc.status
        code = int(status.code or (exc.response.status_code if exc.response is not None else 0))
        reason = status.reason or ""
        message = (status.message or "").strip() or "(no message)"
        raise KubeError(f"{what}: {code} {reason or 'refused'}: {message}", code, reason) from None
    except httpx2.HTTPError as exc:
        raise KubeError(f"{what}: the Kubernetes API did not answer: {type(exc).__name__}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - an answer lightkube cannot decode, a kubeconfig's token file gone
        raise KubeError(f"{what}: {type(exc).__name__}: {exc}") from None
