"""Build JobSpecs (docs/protocol.md, `JobSpec`) from Python keyword arguments.

`gl.job()` and `gl.service()` only shape a dict: the server validates it. A
setting left out (or None) is left out of the spec, so the server's default
applies. `source`, `inputs` and `weights` may name local paths; `Client.submit`
uploads those and puts their digests in their place.
"""
from __future__ import annotations

import difflib
import hashlib
import re
import shlex
from typing import Any, Iterable

from gpulayer.protocol import array_ranges, parse_duration
from gpulayer.protocol.fields import names, wire_fields
from gpulayer.protocol.jobspec import (AFTER_CONDITIONS, GPU_LINKS, INGRESS_ACCESS, RESTART_POLICIES, JobSpec,
                                      ServiceSpec)

#: The JobSpec's fields (gpulayer/protocol/jobspec.py) but `command` (the first argument) and `service`
#: (`service()`), and `retry_on`: `retry`'s, on its own.
JOB_SETTINGS = (*(f.name for f in wire_fields(JobSpec) if f.name not in ("command", "service")), "retry_on")
#: Settings whose type is checked here, so that a job file's `gpus = "two"` is refused by --dry-run too
#: (the server checks their bounds, and every other field): the integer ones.
WHOLE_SETTINGS = tuple(f.name for f in wire_fields(JobSpec) if set(f.kinds) <= {int, type(None)})
#: Settings that take a duration: seconds, or text as every duration option reads it ("1h", "1:00:00").
DURATION_SETTINGS = ("timeout_seconds", "silence_timeout_seconds", "checkpoint_every_seconds", "grace_seconds",
                     "idle_timeout_seconds")


#: Slurm's `--mem` units (powers of 1024, as Slurm reads them) in MB; a bare number is MB.
MEMORY_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
_MEMORY = re.compile(r"([0-9]{1,12}(?:\.[0-9]{1,6})?)\s*([KMGT])?(?:i?B)?", re.IGNORECASE)


def memory_mb(text: str) -> int:
    """A memory size as Slurm's `--mem` takes it, in whole MB (rounded up): 512 (MB), 512M, 10G, 1.5T,
    2048K; ValueError naming the forms otherwise."""
    found = _MEMORY.fullmatch(str(text).strip())
    if not found:
        raise ValueError(f"{text!r} is not a memory size: write a number of MB (512) or one with a unit, "
                         "K, M, G or T (512M, 10G, 1.5T)")
    mb = float(found[1]) * MEMORY_UNITS[(found[2] or "M").upper()]
    return int(mb) if mb.is_integer() else int(mb) + 1


#: `service()`'s settings: the service block's fields (gpulayer/protocol/jobspec.py), `health` as its `http_path`.
SERVICE_SETTINGS = (*("health_path" if name == "health" else name for name in names(ServiceSpec)), "ingress_key")


def refuse_unknown(what: str, given: Iterable[str], known: Iterable[str]) -> None:
    """TypeError naming each of `given` that is not `known`, with the known one it was likely meant as
    (`gpu`: did you mean `gpus`?), then every known one."""
    known = list(known)
    unknown = sorted(set(given) - set(known))
    if not unknown:
        return
    named = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        named.append(f"{name} (did you mean {close[0]}?)" if close else name)
    raise TypeError(f"unknown {what} setting{'s' if len(unknown) > 1 else ''}: {', '.join(named)}; "
                    f"known: {', '.join(known)}")


def job(command: str | Iterable[str], **settings: Any) -> dict:
    """A JobSpec dict for `command` (an argv list; a string is split like a shell would).

    Settings: name, env, accelerator, gpus, gpu_fraction (a share of one GPU, 0 < f < 1), gpu_memory_mb
    (a share of one GPU's memory: MB, or text such as "10G"), gpu_link ("nvlink": the GPUs must be joined
    by NVLink), cpus, memory_mb, labels, same (label keys every rank of a multi-node job shares the value
    of: "rack", ["rack", "ib-switch"]; "rack=r1" pins the value too, as a label), retry (int
    = max attempts, or a dict), retry_on (list of reasons), timeout_seconds and
    silence_timeout_seconds (seconds, or text: "30m", "12h", "1:00:00",
    "2-00:00:00"), source (digest or directory), inputs (dict path -> digest or
    local path, or a list of local paths), outputs, nodes, priority
    (a number, or a class of the server such as "low", "normal", "high"),
    preemptible (True: may be stopped and requeued for higher-priority work),
    backfill (False: never started in room a reservation holds for another job),
    idle_timeout_seconds ("30m"), idle_below_pct (5 or "5%") and idle_action
    ("notify", "requeue", "cancel"): the job's idle policy (docs/workers.md),
    secrets; array ("0-999%16", "1,5,9-12", or indices such as range(1000)),
    max_running (the array's cap on elements running at once), after (jobs this
    one runs after: Job objects or ids, each ending ok; "ID:ok|notok|any"; or
    (job, condition) pairs). Raises TypeError for an unknown setting, ValueError
    for a bad value.
    """
    refuse_unknown("job", settings, JOB_SETTINGS)
    spec: dict[str, Any] = {"command": _argv(command)}
    retry = _retry(settings.pop("retry", None), settings.pop("retry_on", None))
    if retry is not None:
        spec["retry"] = retry
    for key in JOB_SETTINGS:
        value = settings.get(key)
        if value is not None:
            spec[key] = _normalise(key, value)
    _wiring(spec)
    return spec


def _wiring(spec: dict) -> None:
    """`gpu_link` and `same` checked against the spec's size (as the server checks them), `same` split into
    its keys and the values it pins (labels)."""
    gpus = spec.get("gpus", 1 if spec.get("accelerator") == "cuda" else 0)
    if "gpu_link" in spec and (not isinstance(gpus, int) or gpus < 2):
        raise ValueError(f"gpu_link: GPUs joined by NVLink are two or more: give gpus 2 or more, not {gpus}")
    if "same" in spec:
        spec["same"], pinned = same_labels(spec["same"])
        if pinned:
            spec["labels"] = {**spec.get("labels", {}), **pinned}
        if not isinstance(spec.get("nodes", 1), int) or spec.get("nodes", 1) < 2:
            raise ValueError("same: ranks that share a label's value are those of a multi-node job: give nodes 2 or more")


def same_labels(given: str | Iterable[str]) -> tuple[list[str], dict[str, str]]:
    """`same` as the CLI's `--same` and `job(same=...)` take it: label keys ("rack"), or KEY=VALUE
    ("rack=r1": that value pinned as a label too); the keys and the pinned labels. ValueError for an empty
    key or a key given twice with two values."""
    keys: list[str] = []
    pinned: dict[str, str] = {}
    for entry in [given] if isinstance(given, str) else list(given):
        key, eq, value = str(entry).partition("=")
        if not key.strip() or (eq and not value):
            raise ValueError(f"same: {entry!r} is a label key (rack) or KEY=VALUE (rack=r1), not empty")
        if eq and pinned.get(key, value) != value:
            raise ValueError(f"same: {key} is given two values ({pinned[key]}, {value})")
        if eq:
            pinned[key] = value
        if key not in keys:
            keys.append(key)
    return keys, pinned


def service(command: str | Iterable[str], replicas: int = 1, port: bool = True,
            restart: str = "always", max_restarts: int | None = None,
            health_path: str | None = None, weights: str | None = None, ingress: str | None = None,
            ingress_key: str | None = None, autoscale: dict | None = None, **job_settings: Any) -> dict:
    """A JobSpec for a long-running service: `job()` plus the `service` block.

    `port=True` has the worker pick a free port and set $PORT; `restart` is
    "always" or "on_failure"; `health_path` turns on HTTP health checks;
    `weights` is an artifact digest or a local file (uploaded at submit);
    `ingress` ("token", "key" or "public") a URL on the control plane that proxies HTTP to the replicas
    (docs/access.md, "Ingress"), `ingress_key` the service's key (only its SHA-256 is sent); `autoscale`
    ({"min", "max", "target_concurrency", "up_after_s", "down_after_s", "cold_start_timeout_s", ...}, needs an
    ingress) replicas that follow the requests in flight through it, `replicas` then the starting count
    (docs/services.md, "Autoscaling").
    """
    refuse_unknown("service", job_settings, (*SERVICE_SETTINGS, *JOB_SETTINGS))
    if restart not in RESTART_POLICIES:
        raise ValueError(f"restart must be one of {', '.join(RESTART_POLICIES)}, not {restart!r}")
    if int(replicas) < 1:
        raise ValueError("replicas must be at least 1")
    spec = job(command, **job_settings)
    spec["service"] = {
        "replicas": int(replicas),
        "port": bool(port),
        "restart": restart,
        "max_restarts": max_restarts,
        "health": {"http_path": health_path} if health_path else None,
        "weights": weights,
    }
    block = _ingress(ingress, ingress_key)
    if block is not None:  # absent otherwise: a server before the ingress knows no such field
        spec["service"]["ingress"] = block
    if autoscale is not None:  # the server checks its fields (min <= max, a target above 0)
        if not isinstance(autoscale, dict):
            raise ValueError(f"autoscale is a dict (min, max, target_concurrency, ...), not {autoscale!r}")
        if block is None:
            raise ValueError("autoscale scales on the requests through the service's ingress: give ingress= too")
        spec["service"]["autoscale"] = dict(autoscale)
        if "replicas" not in autoscale and int(replicas) == 1:  # the starting count: min, at least one
            spec["service"].pop("replicas")
    return spec


#: The shortest `ingress_key` taken (its SHA-256 is in the job's spec, which whoever may see the job reads).
MIN_INGRESS_KEY = 32


def _ingress(access: str | None, key: str | None) -> dict | None:
    """The `service.ingress` block; ValueError for a bad `access` or key."""
    if access is None and key is None:
        return None
    access = access or "key"
    if access not in INGRESS_ACCESS:
        raise ValueError(f"ingress must be one of {', '.join(INGRESS_ACCESS)}, not {access!r}")
    if access == "key" and not key:
        raise ValueError("ingress='key' needs ingress_key (a secret of at least 32 characters)")
    if key is None:
        return {"access": access}
    if access != "key":
        raise ValueError(f"ingress_key goes with ingress='key', not ingress={access!r}")
    if not isinstance(key, str) or len(key) < MIN_INGRESS_KEY or not key.isascii() or not key.isprintable() or " " in key:
        raise ValueError(f"ingress_key must be at least {MIN_INGRESS_KEY} printable ASCII characters without spaces")
    return {"access": "key", "key_sha256": hashlib.sha256(key.encode()).hexdigest()}


def _argv(command: str | Iterable[str]) -> list[str]:
    argv = shlex.split(command) if isinstance(command, str) else [str(part) for part in command]
    if not argv:
        raise ValueError("a job needs a command: a non-empty list of strings")
    return argv


def _retry(retry: Any, retry_on: Any) -> dict | None:
    if retry is None and retry_on is None:
        return None
    if isinstance(retry, dict):
        block = dict(retry)
    elif retry is None:
        block = {}
    elif isinstance(retry, bool) or not isinstance(retry, int) or retry < 1:
        raise ValueError(f"retry is a number of attempts (at least 1) or a dict, not {retry!r}")
    else:
        block = {"max_attempts": retry}
    if retry_on is not None:
        block["retry_on"] = [retry_on] if isinstance(retry_on, str) else list(retry_on)
    return block


def _normalise(key: str, value: Any) -> Any:
    if key == "gpu_link" and value not in GPU_LINKS:
        raise ValueError(f"gpu_link is one of {', '.join(GPU_LINKS)}, not {value!r}")
    if key == "gpu_memory_mb" and isinstance(value, str):
        return memory_mb(value)  # "10G", as --gpu-memory takes it
    if key == "gpu_fraction" and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ValueError(f"gpu_fraction is a number, 0 < f < 1, not {value!r}")
    if key in WHOLE_SETTINGS and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"{key} is a whole number (0 or more), not {value!r}")
    if key == "cpus" and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
        raise ValueError(f"cpus is a number (0 or more), not {value!r}")
    if key in DURATION_SETTINGS:
        try:
            return parse_duration(value) if isinstance(value, str) else value  # a number: the server checks it
        except ValueError as exc:
            raise ValueError(f"{key}: {exc}") from None
    if key == "idle_below_pct":
        return percent(value)
    if key in ("preemptible", "backfill") and not isinstance(value, bool):
        raise ValueError(f"{key} is true or false, not {value!r}")
    if key in ("env", "labels"):
        return {str(k): str(v) for k, v in dict(value).items()}
    if key in ("outputs", "secrets"):
        return [value] if isinstance(value, str) else [str(v) for v in value]
    if key == "inputs" and isinstance(value, (list, tuple)):
        return {str(v): str(v) for v in value}  # local paths, uploaded by Client.submit
    if key == "inputs":
        return {str(k): str(v) for k, v in dict(value).items()}
    if key == "source":
        return str(value)
    if key == "array":
        return array_text(value)
    if key == "after":
        return [_after(v) for v in ([value] if isinstance(value, (int, str)) or hasattr(value, "id") else value)]
    return value


def percent(value: Any) -> float:
    """A percentage as `--idle-below` and `idle_below_pct` take it: 5, 5.0 or "5%" (0 to 100)."""
    try:
        number = float(value.strip().removesuffix("%")) if isinstance(value, str) else float(value)
    except (TypeError, ValueError):
        raise ValueError(f"idle_below_pct is a percentage (5 or \"5%\"), not {value!r}") from None
    if not 0 <= number <= 100:
        raise ValueError(f"idle_below_pct: {number:g}% is outside 0-100%")
    return number


def array_text(value: Any) -> str | list[int]:
    """An array as the JobSpec takes it: a string as given ("0-999%16"), a range as one ("0-999", "0-15:4"),
    other indices as a list (the server checks them all). ValueError for a string that names no
    indices (`abc`, `5-1`) or a bad `%N`."""
    if isinstance(value, str):
        indices, percent, cap = value.partition("%")
        try:
            array_ranges(indices)
        except ValueError as exc:
            raise ValueError(f"array: {exc}") from None
        if percent and not (re.fullmatch(r"\s*[0-9]{1,9}\s*", cap) and int(cap) >= 1):
            raise ValueError(f"array: %{cap}: the running cap after % is a whole number, 1 or more (0-999%16)")
        return value
    if isinstance(value, range) and value.step > 0 and len(value):
        last = value[-1]
        return f"{value.start}-{last}" if value.step == 1 else f"{value.start}-{last}:{value.step}"
    return [int(v) for v in value]


def _after(entry: Any) -> Any:
    """One dependency: a Job (its id, ending ok), an id, "ID:condition", or (job, condition)."""
    if isinstance(entry, tuple) and len(entry) == 2:
        job, condition = entry
        if condition not in AFTER_CONDITIONS:
            raise ValueError(f"after: the condition is one of {', '.join(AFTER_CONDITIONS)}, not {condition!r}")
        return {"job": int(job.id if hasattr(job, "id") else job), "condition": condition}
    if hasattr(entry, "id"):
        return int(entry.id)
    return entry
