"""JobSpec validation: every field checked, normalised with its default, or refused by name."""
from __future__ import annotations

import re
from typing import Any

from gpulayer.protocol import MAX_ARRAY, MAX_ARRAY_INDEX, array_ranges, array_text
from gpulayer.server.config import PRIORITY_CLASSES, SERVICE_MAX_ATTEMPTS
from gpulayer.server.errors import InvalidRequest
from gpulayer.server.validators import digest, fail as _fail, integer, labels, mapping, number, relative_path, string

# Used with .fullmatch() and ending in \Z, as validators.py's patterns (docs/security.md, issue 22 item 8).
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}\Z")
RETRY_REASONS = ("worker_lost", "worker_revoked", "failed", "timed_out", "start_timeout")

MAX_ARGS = 4096
MAX_ARG_BYTES = 128 * 1024
MAX_WIDTH = 1024          # replicas or nodes
MAX_GPUS = 1024
MAX_PATHS = 10_000
MAX_AFTER = 100           # dependencies of one job
AFTER_CONDITIONS = ("ok", "notok", "any")

JOB_FIELDS = {"command", "name", "env", "accelerator", "gpus", "cpus", "memory_mb", "labels", "retry",
              "timeout_seconds", "silence_timeout_seconds", "source", "inputs", "outputs", "nodes",
              "service", "priority", "secrets", "array", "max_running", "after", "preemptible"}
SERVICE_FIELDS = {"replicas", "port", "restart", "max_restarts", "health", "weights"}
HEALTH_FIELDS = {"http_path", "interval_s", "failures"}
RETRY_FIELDS = {"max_attempts", "retry_on"}


def _known(obj: dict, allowed: set[str], field: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        where = f"{field}." if field else ""
        raise InvalidRequest(f"unknown field {where}{unknown[0]} (known: {', '.join(sorted(allowed))})")


def _command(value: Any) -> list[str]:
    if not isinstance(value, list) or not value:
        raise _fail("command", "must be a non-empty list of strings (argv)")
    if len(value) > MAX_ARGS:
        raise _fail("command", f"at most {MAX_ARGS} arguments")
    for i, arg in enumerate(value):
        string(arg, f"command[{i}]", limit=MAX_ARG_BYTES)
    if not value[0]:
        raise _fail("command", "the program name (command[0]) is empty")
    return list(value)


def _env(value: Any) -> dict[str, str]:
    obj = mapping(value, "env")
    for key, val in obj.items():
        if not ENV_NAME.fullmatch(key):
            raise _fail("env", f"{key!r} is not a valid environment variable name")
        string(val, f"env.{key}")
    return dict(obj)


def _paths_map(value: Any, field: str) -> dict[str, str]:
    obj = mapping(value, field)
    if len(obj) > MAX_PATHS:
        raise _fail(field, f"at most {MAX_PATHS} entries")
    return {relative_path(k, f"{field} key"): digest(v, f"{field}.{k}", allow_none=False) for k, v in obj.items()}


def _outputs(value: Any) -> list[str]:
    if not isinstance(value, list):
        raise _fail("outputs", "must be a list of relative paths")
    if len(value) > MAX_PATHS:
        raise _fail("outputs", f"at most {MAX_PATHS} paths")
    return [relative_path(p, f"outputs[{i}]") for i, p in enumerate(value)]


def _retry(value: Any, is_service: bool) -> dict:
    obj = mapping({} if value is None else value, "retry")
    _known(obj, RETRY_FIELDS, "retry")
    default = SERVICE_MAX_ATTEMPTS if is_service else 1
    attempts = integer(obj.get("max_attempts", default), "retry.max_attempts", 1, 1000)
    retry_on = obj.get("retry_on", ["worker_lost"])
    if not isinstance(retry_on, list) or any(r not in RETRY_REASONS for r in retry_on):
        raise _fail("retry.retry_on", f"must be a list drawn from {', '.join(RETRY_REASONS)}")
    return {"max_attempts": attempts, "retry_on": list(dict.fromkeys(retry_on))}


def _health(value: Any) -> dict | None:
    if value is None:
        return None
    obj = mapping(value, "service.health")
    _known(obj, HEALTH_FIELDS, "service.health")
    path = string(obj.get("http_path"), "service.health.http_path", limit=2048)
    if not path.startswith("/"):
        raise _fail("service.health.http_path", "must start with /")
    return {"http_path": path,
            "interval_s": number(obj.get("interval_s", 10), "service.health.interval_s", 0.1, 3600),
            "failures": integer(obj.get("failures", 3), "service.health.failures", 1, 100)}


def _service(value: Any) -> dict | None:
    if value is None:
        return None
    obj = mapping(value, "service")
    _known(obj, SERVICE_FIELDS, "service")
    restart = obj.get("restart", "always")
    if restart not in ("always", "on_failure"):
        raise _fail("service.restart", "must be 'always' or 'on_failure'")
    port = obj.get("port", True)
    if not isinstance(port, bool):
        raise _fail("service.port", "must be true or false")
    max_restarts = obj.get("max_restarts")
    return {"replicas": integer(obj.get("replicas", 1), "service.replicas", 1, MAX_WIDTH),
            "port": port,
            "restart": restart,
            "max_restarts": None if max_restarts is None else integer(max_restarts, "service.max_restarts", 0, 1_000_000),
            "health": _health(obj.get("health")),
            "weights": digest(obj.get("weights"), "service.weights")}


def _secret_names(value: Any) -> list[str]:
    if not isinstance(value, list) or any(not isinstance(v, str) or not ENV_NAME.fullmatch(v) for v in value):
        raise _fail("secrets", "must be a list of secret names (letters, digits and _)")
    return list(dict.fromkeys(value))


def array_indices(value: Any) -> list[int]:
    """An array's indices, ascending: from "0-999", "1,5,9-12", "0-15:4" (a step) or a list of integers.

    Raises InvalidRequest naming `array` for a malformed, repeated or out-of-range index, or
    more than MAX_ARRAY of them.
    """
    if isinstance(value, list):
        found = [integer(v, f"array[{i}]", 0, MAX_ARRAY_INDEX) for i, v in enumerate(value[:MAX_ARRAY + 1])]
    elif isinstance(value, str):
        try:
            found = array_ranges(value)
        except ValueError as exc:
            raise _fail("array", str(exc)) from None
    else:
        raise _fail("array", f"must be a string like \"0-999\" or a list of indices, not {type(value).__name__}")
    if not found:
        raise _fail("array", "names no index")
    if len(found) > MAX_ARRAY:
        raise _fail("array", f"at most {MAX_ARRAY} elements")
    ordered = sorted(set(found))
    if len(ordered) != len(found):
        seen: set[int] = set()
        twice = next(i for i in found if i in seen or seen.add(i))  # type: ignore[func-returns-value]
        raise _fail("array", f"index {twice} appears twice")
    return ordered


def _array(spec: dict) -> tuple[str | None, int | None]:
    """The array (normalised to ranges) and its running cap, from `array` ("0-999%16") and `max_running`."""
    value, cap = spec.get("array"), spec.get("max_running")
    cap = None if cap is None else integer(cap, "max_running", 1, MAX_ARRAY)
    if value is None:
        if cap is not None:
            raise _fail("max_running", "caps an array's running elements: give `array` too")
        return None, None
    if isinstance(value, str) and "%" in value:
        value, _, limit = value.partition("%")
        if _whole(limit.strip()) is None:
            raise _fail("array", f"%{limit}: the running cap after % is a whole number (0-999%16)")
        inline = integer(_whole(limit.strip()), "array (its %N)", 1, MAX_ARRAY)
        if cap is not None and cap != inline:
            raise _fail("max_running", f"is {cap} but array says %{inline}: give one")
        cap = inline
    return array_text(array_indices(value)), cap


def _whole(text: str) -> int | None:
    """`text` as a whole number when it is one in ASCII digits (at most 19 of them), else None."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 19 else None


def _after(value: Any) -> list[dict]:
    """Dependencies: each an id (ends ok), "ID[:ok|notok|any]" or {"job": ID, "condition": ...}."""
    if not isinstance(value, list):
        raise _fail("after", "must be a list of job ids, \"ID:ok|notok|any\" strings or {job, condition} objects")
    if len(value) > MAX_AFTER:
        raise _fail("after", f"at most {MAX_AFTER} dependencies")
    found: dict[int, str] = {}
    for i, entry in enumerate(value):
        field = f"after[{i}]"
        if isinstance(entry, str):
            job, _, condition = entry.strip().partition(":")
            if _whole(job) is None:
                raise _fail(field, f"{entry!r} is not a job id, ID:ok, ID:notok or ID:any")
            job_id, condition = _whole(job), condition or "ok"
        elif isinstance(entry, dict):
            _known(entry, {"job", "condition"}, field)
            job_id, condition = entry.get("job"), entry.get("condition", "ok")
        else:
            job_id, condition = entry, "ok"
        job_id = integer(job_id, f"{field}.job" if isinstance(entry, dict) else field, 1, 1 << 62)
        if condition not in AFTER_CONDITIONS:
            raise _fail(field, f"the condition is one of {', '.join(AFTER_CONDITIONS)}, not {condition!r}")
        if found.get(job_id, condition) != condition:
            raise _fail(field, f"job {job_id} is named twice with different conditions")
        found[job_id] = condition
    return [{"job": job_id, "condition": condition} for job_id, condition in found.items()]


def _priority(value: Any, classes: dict[str, int] | None) -> int:
    """A priority number, or the number of a named class (`high`) of the server's config."""
    classes = PRIORITY_CLASSES if classes is None else classes
    if isinstance(value, str):
        if value not in classes:
            known = ", ".join(f"{name}={number}" for name, number in sorted(classes.items(), key=lambda c: c[1]))
            raise _fail("priority", f"{value!r} is no priority class of this server (known: {known}) nor a number")
        return classes[value]
    return integer(value, "priority", -1_000_000, 1_000_000)


def _flag(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(field, "must be true or false")
    return value


def validate_job(raw: Any, priority_classes: dict[str, int] | None = None) -> dict:
    """The normalised JobSpec; raises InvalidRequest naming the first bad field.

    `priority` may name one of `priority_classes` (the server's; default low, normal, high).
    """
    spec = mapping(raw, "job")
    _known(spec, JOB_FIELDS, "")
    service = _service(spec.get("service"))
    accelerator = spec.get("accelerator")
    if accelerator not in (None, "cuda"):
        raise _fail("accelerator", "must be 'cuda' or null")
    gpus = spec.get("gpus")
    gpus = (1 if accelerator == "cuda" else 0) if gpus is None else integer(gpus, "gpus", 0, MAX_GPUS)
    nodes = integer(spec.get("nodes", 1), "nodes", 1, MAX_WIDTH)
    if service and nodes > 1:
        raise _fail("nodes", "a service runs replicas; multi-node (nodes > 1) is for jobs")
    array, max_running = _array(spec)
    if array is not None and (service or nodes > 1):
        raise _fail("array", "an array's elements are single tasks: not with `service` or `nodes` > 1")
    return {
        "command": _command(spec.get("command")),
        "name": string(spec.get("name"), "name", limit=256, allow_none=True),
        "env": _env(spec.get("env", {})),
        "accelerator": accelerator,
        "gpus": gpus,
        "cpus": number(spec.get("cpus", 0), "cpus", 0, 1_000_000),
        "memory_mb": integer(spec.get("memory_mb", 0), "memory_mb", 0, 1 << 40),
        "labels": labels(spec.get("labels", {})),
        "retry": _retry(spec.get("retry"), service is not None),
        "timeout_seconds": number(spec.get("timeout_seconds"), "timeout_seconds", 0.001, 10**9, allow_none=True),
        "silence_timeout_seconds": number(spec.get("silence_timeout_seconds"), "silence_timeout_seconds",
                                           0.001, 10**9, allow_none=True),
        "source": digest(spec.get("source"), "source"),
        "inputs": _paths_map(spec.get("inputs", {}), "inputs"),
        "outputs": _outputs(spec.get("outputs", [])),
        "nodes": nodes,
        "service": service,
        "priority": _priority(spec.get("priority", 0), priority_classes),
        "preemptible": _flag(spec.get("preemptible", False), "preemptible"),
        "secrets": _secret_names(spec.get("secrets", [])),
        "array": array,
        "max_running": max_running,
        "after": _after(spec.get("after", [])),
    }


def referenced_digests(spec: dict) -> set[str]:
    """Every artifact a (normalised) spec names: source, inputs, service weights."""
    found = set(spec.get("inputs", {}).values())
    if spec.get("source"):
        found.add(spec["source"])
    weights = (spec.get("service") or {}).get("weights")
    if weights:
        found.add(weights)
    return found
