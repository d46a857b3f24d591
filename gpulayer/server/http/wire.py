"""Request bodies of the worker and admin endpoints: parsed, checked, or refused by field.

(The JobSpec has its own module, spec.py.)
"""
from __future__ import annotations

import json
import re

from gpulayer.server.config import MAX_JSON_BODY
from gpulayer.server.errors import BodyTooLarge, InvalidJSON, InvalidRequest
from gpulayer.server.scheduler.spec import digest, integer, labels, mapping, number, relative_path, string

OUTCOMES = ("succeeded", "failed", "cancelled", "timed_out")
STREAMS = ("stdout", "stderr", "system")
MAX_LOG_LINES = 10_000
MAX_LOG_TEXT = 64 * 1024
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def read_json(req, *, limit: int = MAX_JSON_BODY, allow_empty: bool = False) -> dict:
    """The request's JSON object; 413 past `limit` bytes, 400 for anything but a JSON object."""
    length = req.content_length
    if length is not None and length > limit:
        raise BodyTooLarge(f"request body of {length} bytes is over the limit of {limit}")
    # A chunked body has no Content-Length: read the server's stream, which ends with the last chunk.
    raw = (req.bounded_stream if length is not None else req.stream).read(limit + 1)
    if len(raw) > limit:
        raise BodyTooLarge(f"request body is over the limit of {limit} bytes")
    if not raw.strip():
        if allow_empty:
            return {}
        raise InvalidJSON("the request needs a JSON object body")
    try:
        # Decoded here, strictly: json.loads on bytes would let UTF-8-encoded surrogates through.
        text = raw.decode("utf-8-sig")
        body = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidJSON(f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidJSON("the body is nested too deeply") from None
    if not isinstance(body, dict):
        raise InvalidJSON("the body must be a JSON object")
    if _SURROGATE_ESCAPE.search(text):  # the only way left to a lone surrogate; most bodies skip the walk
        check_text(body)
    return body


def check_text(value, field: str = "") -> None:
    """Refuse (400 invalid_field) any string, key or value, that does not encode to UTF-8.

    JSON's `\\ud800` escape decodes to a lone surrogate: SQLite, the JSON
    renderer and the explorer would all fail on it later, after the write.
    read_json walks every body here, before any route sees it.
    """
    stack = [(field, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, dict):
            for key, val in item.items():
                _encodable(key, f"{where} key" if where else "a key")
                stack.append((f"{where}.{key}" if where else key, val))
        elif isinstance(item, list):
            stack.extend((f"{where}[{i}]", val) for i, val in enumerate(item))
        elif isinstance(item, str):
            _encodable(item, where)


def _encodable(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest(f"{where}: is not valid Unicode (a lone surrogate such as \\ud800)") from None


def register(body: dict) -> dict:
    """POST /v1/workers/register."""
    res = mapping(body.get("resources", {}), "resources")
    models = res.get("gpu_models", [])
    if not isinstance(models, list) or any(not isinstance(m, str) or len(m) > 256 for m in models):
        raise InvalidRequest("resources.gpu_models: must be a list of strings")
    address = body.get("advertise_address")
    return {
        "name": string(body.get("name"), "name", limit=256),
        "labels": labels(body.get("labels", {})),
        "resources": {"cpus": number(res.get("cpus", 0), "resources.cpus", 0, 1_000_000),
                      "gpus": integer(res.get("gpus", 0), "resources.gpus", 0, 1024),
                      "memory_mb": integer(res.get("memory_mb", 0), "resources.memory_mb", 0, 1 << 40),
                      "gpu_models": models[:1024]},
        "advertise_address": string(address, "advertise_address", limit=256) if address else None,
        "version": string(body.get("version", "unknown"), "version", limit=64),
        "slots": integer(body.get("slots", 1), "slots", 1, 1024),
    }


def heartbeat(body: dict) -> list[dict]:
    """POST /v1/worker/heartbeat: the tasks the worker runs now."""
    tasks = body.get("tasks", [])
    if not isinstance(tasks, list) or len(tasks) > 10_000:
        raise InvalidRequest("tasks: must be a list")
    out = []
    for i, task in enumerate(tasks):
        task = mapping(task, f"tasks[{i}]")
        endpoint = task.get("endpoint")
        out.append({"task_id": integer(task.get("task_id"), f"tasks[{i}].task_id", 1, 1 << 62),
                    "state": string(task.get("state", "running"), f"tasks[{i}].state", limit=32),
                    "endpoint": None if endpoint is None else string(endpoint, f"tasks[{i}].endpoint", limit=300),
                    "restarts": integer(task.get("restarts", 0) or 0, f"tasks[{i}].restarts", 0, 1 << 31)})
    return out


def wait_seconds(body: dict) -> float:
    """POST /v1/worker/acquire: the long-poll wait."""
    return number(body.get("wait_s", 0) or 0, "wait_s", 0, 3600)


def max_tasks(body: dict) -> int | None:
    """`max_tasks` of acquire and finish: how many assignments one answer may carry; None when absent."""
    value = body.get("max_tasks")
    return None if value is None else integer(value, "max_tasks", 1, 1024)


def start(body: dict) -> int | None:
    pid = body.get("pid")
    return None if pid is None else integer(pid, "pid", 0, 1 << 31)


def log_lines(body: dict) -> list[dict]:
    """POST /v1/worker/tasks/{id}/logs."""
    lines = body.get("lines")
    if not isinstance(lines, list) or len(lines) > MAX_LOG_LINES:
        raise InvalidRequest(f"lines: must be a list of at most {MAX_LOG_LINES} lines")
    out = []
    for i, line in enumerate(lines):
        line = mapping(line, f"lines[{i}]")
        stream = line.get("stream", "stdout")
        if stream not in STREAMS:
            raise InvalidRequest(f"lines[{i}].stream: must be one of {', '.join(STREAMS)}")
        text = line.get("text")
        if not isinstance(text, str):
            raise InvalidRequest(f"lines[{i}].text: must be a string")
        n = line.get("n")  # optional (protocol-v1.md): without it the line goes after the task's last
        out.append({"n": None if n is None else integer(n, f"lines[{i}].n", 0, 1 << 62), "stream": stream,
                    "at": number(line.get("at", 0), f"lines[{i}].at", 0, 1e12), "text": text[:MAX_LOG_TEXT]})
    return out


def rendezvous(body: dict) -> tuple[str, int]:
    return string(body.get("address"), "address", limit=256), integer(body.get("port"), "port", 1, 65535)


def finish(body: dict) -> dict:
    """POST /v1/worker/tasks/{id}/finish."""
    outcome = body.get("outcome")
    if outcome not in OUTCOMES:
        raise InvalidRequest(f"outcome: must be one of {', '.join(OUTCOMES)}")
    code = body.get("exit_code")
    outputs = mapping(body.get("outputs") or {}, "outputs")
    reason = body.get("reason")
    return {"exit_code": None if code is None else integer(code, "exit_code", -(1 << 31), 1 << 31),
            "outcome": outcome,
            "outputs": {relative_path(k, "outputs key"): digest(v, f"outputs.{k}", allow_none=False)
                        for k, v in outputs.items()},
            "reason": None if reason is None else string(reason, "reason", limit=2048),
            "lines": log_lines(body) if body.get("lines") is not None else [],
            "next": _flag(body.get("next", False), "next"), "max_tasks": max_tasks(body)}


def _flag(value, field: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequest(f"{field}: must be true or false")
    return value


def token_request(body: dict) -> dict:
    """POST /v1/tokens: a join token bound to a name and labels."""
    unknown = set(body) - {"name", "labels", "expires_in_s", "kind"}
    if unknown:
        raise InvalidRequest(f"unknown field {sorted(unknown)[0]}")
    kind = body.get("kind", "join")
    if kind not in ("join", "metrics"):
        raise InvalidRequest("kind: must be 'join' or 'metrics'")
    expires = body.get("expires_in_s", 365 * 86400)
    return {"name": string(body.get("name"), "name", limit=128), "labels": labels(body.get("labels", {})),
            "expires_in_s": number(expires, "expires_in_s", 1, 100 * 365 * 86400, allow_none=True), "kind": kind}


def query_int(req, name: str, default: int | None, lo: int, hi: int) -> int | None:
    """An integer query parameter, or 400 naming it."""
    raw = req.get_param(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequest(f"{name}: must be an integer") from None
    return integer(value, name, lo, hi)


def query_float(req, name: str, default: float, lo: float, hi: float) -> float:
    raw = req.get_param(name)
    if raw is None or raw == "":
        return default
    try:
        return number(float(raw), name, lo, hi)
    except ValueError:
        raise InvalidRequest(f"{name}: must be a number") from None

