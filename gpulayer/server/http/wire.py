"""Request bodies of the worker and admin endpoints: parsed, checked, or refused by field.

The worker's requests (register, heartbeat, finish, finish-many) are declared in gpulayer/protocol/
(registration.py, heartbeat.py, finish.py) and read here through their declarations (server/declared.py):
what a field's type and bounds say is checked there; what they cannot say (a relative path, a digest,
each index once, a message of its own) is here. (The JobSpec has its own module, scheduler/spec.py.)
"""
from __future__ import annotations

import json
import re

from gpulayer.protocol import parse_duration
from gpulayer.protocol.fields import field_of, names, wire_fields
from gpulayer.protocol.finish import (
    MAX_CHECKPOINT_FILES, MAX_FINISHES, MAX_LOG_LINES, MAX_LOG_TEXT, MAX_SIGNALS, OUTCOMES, SIGNAL_WHYS, STREAMS,
    CheckpointFile, Finish, Finished, FinishItem, FinishMany,
)
from gpulayer.protocol.heartbeat import MAX_GPU_SAMPLES, Heartbeat, TaskReport
from gpulayer.protocol.jobspec import IDLE_ACTIONS
from gpulayer.protocol.registration import MAX_GPU_INDEX, MAX_WORKER_GPUS, Isolation, Register, Resources
from gpulayer.server.config import MAX_JSON_BODY
from gpulayer.server.declared import checked, fields, flag as _flag, records, unknown as _unknown
from gpulayer.server.errors import BodyTooLarge, InvalidJSON, InvalidRequest
from gpulayer.server.scheduler import sessions
from gpulayer.server.scheduler.teams import ROLES, VISIBILITIES, check_name
from gpulayer.server.validators import digest, integer, labels, mapping, number, relative_path, string

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
    """POST /v1/workers/register: a `Register` (gpulayer/protocol/registration.py)."""
    return fields(body, Register, "", {"labels": labels, "resources": _resources, "isolation": isolation,
                                       "relay": sessions.relay_field, "gpus": _gpu_reports,
                                       "gpu_topology": _gpu_topology, "advertise_address": _advertise_address})


def _gpu_topology(value) -> list[dict] | None:
    """Register's `gpu_topology` (agent/gpu/topology.py): one record per GPU, its peers device indices."""
    if value is None:
        return None

    def peers(raw, field: str) -> list[int]:
        if not isinstance(raw, list) or len(raw) > MAX_WORKER_GPUS:
            raise InvalidRequest(f"{field}: must be a list of at most {MAX_WORKER_GPUS} device indices")
        return [integer(p, f"{field}[{k}]", 0, MAX_GPU_INDEX) for k, p in enumerate(raw)]
    return records(value, field_of(Register, "gpu_topology"), "gpu_topology",
                   f"must be a list of at most {MAX_WORKER_GPUS} objects", {"nvlink_peers": peers})


def _resources(value) -> dict:
    res = mapping(value, "resources")
    models = res.get("gpu_models", [])
    if not isinstance(models, list) or any(not isinstance(m, str) or len(m) > 256 for m in models):
        raise InvalidRequest("resources.gpu_models: must be a list of strings")
    return fields(res, Resources, "resources.", {"gpu_models": lambda _: models[:MAX_WORKER_GPUS]})


def _advertise_address(value) -> str | None:
    """Absent or empty: None (the control plane takes the address it sees)."""
    return checked(field_of(Register, "advertise_address"), value, "advertise_address") if value else None


#: What a worker may say of its isolation (agent/sandbox/bwrap.py, Sandbox.isolation), each a short string or a bool.
ISOLATION_KEYS = {f.name: bool if bool in f.kinds else str for f in wire_fields(Isolation)}


def isolation(value) -> dict:
    """The register call's `isolation` (optional: {} when absent); 400 for anything but its known keys."""
    if value is None:
        return {}
    found = mapping(value, "isolation")
    out = {}
    for key, item in found.items():
        kind = ISOLATION_KEYS.get(key)
        if kind is None:
            raise InvalidRequest(f"isolation.{key}: unknown; expected {', '.join(ISOLATION_KEYS)}")
        if item is None:
            continue
        if not isinstance(item, kind) or (isinstance(item, str) and len(item) > 512):
            raise InvalidRequest(f"isolation.{key}: must be {'a string of at most 512 characters' if kind is str else 'true or false'}")
        out[key] = item
    return out


def heartbeat(body: dict) -> list[dict]:
    """POST /v1/worker/heartbeat: the tasks the worker runs now (a `Heartbeat`'s `tasks`, each a `TaskReport`)."""
    tasks = body.get("tasks", [])
    if not isinstance(tasks, list) or len(tasks) > MAX_REPORTED_TASKS:
        raise InvalidRequest("tasks: must be a list")
    out = []
    for i, task in enumerate(tasks):
        task = mapping(task, f"tasks[{i}]")
        where = f"tasks[{i}]"
        out.append({"task_id": checked(_TASK_ID, task.get("task_id"), f"{where}.task_id"),
                    "state": checked(_STATE, task.get("state", _STATE.default), f"{where}.state"),
                    "endpoint": checked(_ENDPOINT, task.get("endpoint"), f"{where}.endpoint"),
                    "restarts": checked(_RESTARTS, task.get("restarts", 0) or 0, f"{where}.restarts"),
                    **_assignment_echo(task, where)})
    return out


MAX_REPORTED_TASKS = field_of(Heartbeat, "tasks").declared.max_items or 0
_TASK_ID, _STATE, _ENDPOINT, _RESTARTS = (field_of(TaskReport, n) for n in ("task_id", "state", "endpoint", "restarts"))


def _assignment_echo(task: dict, where: str) -> dict:
    """`job_id`, `attempt`, `gpus` of a heartbeat's task (optional): what its Assignment said, for reconciliation;
    `timeout_seconds` (optional, null for none): the time limit its agent enforces now. Each only when sent."""
    out: dict = {}
    if "timeout_seconds" in task:
        out["timeout_seconds"] = checked(field_of(TaskReport, "timeout_seconds"), task["timeout_seconds"],
                                         f"{where}.timeout_seconds")
    for name in ("job_id", "attempt"):
        if task.get(name) is not None:
            out[name] = checked(field_of(TaskReport, name), task[name], f"{where}.{name}")
    gpus = task.get("gpus")
    if gpus is not None:
        if not isinstance(gpus, list) or len(gpus) > MAX_WORKER_GPUS:
            raise InvalidRequest(f"{where}.gpus: must be a list of device indices")
        out["gpus"] = [integer(g, f"{where}.gpus[{k}]", 0, MAX_GPU_INDEX) for k, g in enumerate(gpus)]
        if len(set(out["gpus"])) != len(out["gpus"]):
            raise InvalidRequest(f"{where}.gpus: each index at most once")
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
    """POST /v1/worker/tasks/{id}/finish: a `Finish` (gpulayer/protocol/finish.py)."""
    return fields(body, Finish, "", _FINISHED)


def _outcome(value) -> str:
    if value not in OUTCOMES:
        raise InvalidRequest(f"outcome: must be one of {', '.join(OUTCOMES)}")
    return value


def _outputs(value) -> dict[str, str]:
    outputs = mapping(value or {}, "outputs")
    return {relative_path(k, "outputs key"): digest(v, f"outputs.{k}", allow_none=False) for k, v in outputs.items()}


def _checkpoint(value) -> list[dict] | None:
    return None if value is None else checkpoint_files(mapping(value, "checkpoint").get("files"), "checkpoint.files")


#: The checks of a `Finished`'s fields that its declaration alone does not say (a finish's, a finish-many item's).
_FINISHED = {"outcome": _outcome, "outputs": _outputs, "checkpoint": _checkpoint,
             "lines": lambda value: [] if value is None else log_lines({"lines": value}),
             "signals": lambda value: signals_sent(value)}


def checkpoint_files(value, field: str) -> list[dict]:
    """A checkpoint's manifest: a list of {path, digest, size, mode}, each path at most once, normalised
    (`a/./b` is `a/b`)."""
    if not isinstance(value, list) or len(value) > MAX_CHECKPOINT_FILES:
        raise InvalidRequest(f"{field}: must be a list of at most {MAX_CHECKPOINT_FILES} files")
    files, seen = [], set()
    for i, item in enumerate(value):
        item = mapping(item, f"{field}[{i}]")
        unknown = set(item) - _CHECKPOINT_FILE
        if unknown:
            raise InvalidRequest(f"{field}[{i}]: unknown field {sorted(unknown)[0]}")
        path = "/".join(p for p in relative_path(item.get("path"), f"{field}[{i}].path").split("/") if p not in ("", "."))
        if not path or path in seen:
            raise InvalidRequest(f"{field}[{i}].path: {path!r} is empty or named twice")
        seen.add(path)
        files.append({"path": path, "digest": digest(item.get("digest"), f"{field}[{i}].digest", allow_none=False),
                      "size": integer(item.get("size"), f"{field}[{i}].size", 0, 1 << 50),
                      "mode": integer(item.get("mode", 0o644), f"{field}[{i}].mode", 0, 0o7777)})
    return files


_CHECKPOINT_FILE = set(names(CheckpointFile))


def checkpoint(body: dict) -> dict:
    """POST /v1/worker/checkpoint: `task_id`, `attempt` (optional fence) and `files`."""
    unknown = set(body) - {"task_id", "attempt", "files"}
    if unknown:
        raise InvalidRequest(f"unknown field {sorted(unknown)[0]}")
    return {"task_id": integer(body.get("task_id"), "task_id", 1, 1 << 62),
            "attempt": None if body.get("attempt") is None else integer(body["attempt"], "attempt", 1, 1 << 31),
            "files": checkpoint_files(body.get("files"), "files")}


def signals_sent(value) -> list[dict]:
    """A finish's `signals`: what the agent sent the task's process, each a `SignalSent` (at most 16)."""
    if value is None:
        return []
    return records(value, field_of(Finished, "signals"), "signals",
                   f"must be a list of at most {MAX_SIGNALS} {{signal, why, at}}", {"why": _signal_why})


def _signal_why(value, field: str) -> str:
    if value not in SIGNAL_WHYS:
        raise InvalidRequest(f"{field}: must be one of {', '.join(SIGNAL_WHYS)}")
    return value


def lease_ahead(body: dict) -> tuple[bool, list[int]]:
    """`prefetch` (the agent takes elements leased ahead) and `held` (those it holds) of acquire and finish-many."""
    return _flag(body.get("prefetch", False), "prefetch"), task_ids(body, "held")


def task_ids(body: dict, field: str, limit: int = MAX_FINISHES) -> list[int]:
    """A list of at most `limit` distinct task ids (`held`, `release`); [] when absent."""
    return _task_ids(body.get(field), field, limit)


def _task_ids(value, field: str, limit: int = MAX_FINISHES) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > limit:
        raise InvalidRequest(f"{field}: must be a list of at most {limit} task ids")
    ids = [integer(v, f"{field}[{i}]", 1, 1 << 62) for i, v in enumerate(value)]
    if len(set(ids)) != len(ids):
        raise InvalidRequest(f"{field}: each task id at most once")
    return ids


def finish_many(body: dict, limit: int = MAX_FINISHES) -> dict:
    """POST /v1/worker/finish-many: a `FinishMany` (gpulayer/protocol/finish.py), each of its `finishes` a
    `FinishItem`: a finish's fields with its `task_id` and `attempt`, and optionally `run_s`."""
    _unknown(body, FinishMany)
    items = body.get("finishes", [])
    if not isinstance(items, list) or len(items) > limit:
        raise InvalidRequest(f"finishes: must be a list of at most {limit} finishes")
    finishes = []
    for i, item in enumerate(items):
        item = mapping(item, f"finishes[{i}]")
        try:
            finishes.append(fields(item, FinishItem, "", _FINISHED))
        except InvalidRequest as exc:
            raise InvalidRequest(f"finishes[{i}].{exc.message}") from None
    if len({f["task_id"] for f in finishes}) != len(finishes):
        raise InvalidRequest("finishes: each task at most once")
    return fields(body, FinishMany, "", {"finishes": lambda _: finishes,
                                         "held": lambda value: _task_ids(value, "held"),
                                         "release": lambda value: _task_ids(value, "release")})


def token_request(body: dict) -> dict:
    """POST /v1/tokens: a join or metrics token bound to a name and labels, or a client token of `user` (its
    name, when none is given: None here, the user's name once the route knows whose it is)."""
    unknown = set(body) - {"name", "labels", "expires_in_s", "kind", "user"}
    if unknown:
        raise InvalidRequest(f"unknown field {sorted(unknown)[0]}")
    kind = body.get("kind", "join")
    if kind not in ("join", "metrics", "client"):
        raise InvalidRequest("kind: must be 'join', 'metrics' or 'client'")
    if body.get("user") is not None and kind != "client":
        raise InvalidRequest("user: only a client token belongs to a user")
    expires = body.get("expires_in_s", 365 * 86400)
    name = None if kind == "client" and body.get("name") is None else string(body.get("name"), "name", limit=128)
    return {"name": name, "labels": labels(body.get("labels", {})),
            "expires_in_s": number(expires, "expires_in_s", 1, 100 * 365 * 86400, allow_none=True), "kind": kind,
            "user": None if body.get("user") is None else string(body["user"], "user", limit=64)}


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


def query_float(req, name: str, default: float | None, lo: float, hi: float) -> float | None:
    raw = req.get_param(name)
    if raw is None or raw == "":
        return default
    try:
        return number(float(raw), name, lo, hi)
    except ValueError:
        raise InvalidRequest(f"{name}: must be a number") from None



def gpu_health(body: dict) -> list[dict] | None:
    """`gpus` of register and heartbeat: the agent's per-GPU health, or None when not sent (older agents)."""
    return _gpu_reports(body.get("gpus"))


def _gpu_reports(value) -> list[dict] | None:
    if value is None:
        return None
    out = records(value, field_of(Heartbeat, "gpus"), "gpus", f"must be a list of at most {MAX_WORKER_GPUS} objects")
    if len({g["index"] for g in out}) != len(out):
        raise InvalidRequest("gpus: each index at most once")
    return out


def gpu_samples(body: dict) -> list[dict] | None:
    """`gpu_samples` of a heartbeat: each GPU's mean utilization and peak memory over an interval (agent
    agent/gpu/stats.py), each a `GpuSample`; None when not sent (older agents). 400 naming the field for a bad one:
    none is kept."""
    samples = body.get("gpu_samples")
    if samples is None:
        return None
    return records(samples, field_of(Heartbeat, "gpu_samples"), "gpu_samples",
                   f"must be a list of at most {MAX_GPU_SAMPLES} objects")


def cordon(body: dict, *, drain: bool) -> dict:
    """POST /v1/workers/{worker}/cordon and /drain: `reason` (required), and for a drain `timeout_s`."""
    allowed = {"reason", "timeout_s"} if drain else {"reason"}
    unknown = set(body) - allowed
    if unknown:
        raise InvalidRequest(f"unknown field {sorted(unknown)[0]}")
    reason = string(body.get("reason"), "reason", limit=1024)
    if not reason.strip():
        raise InvalidRequest("reason: must say why (as Slurm's reason=), not be empty")
    out: dict = {"reason": reason.strip()}
    if drain:
        out["timeout_s"] = number(body.get("timeout_s"), "timeout_s", 0, 100 * 365 * 86400, allow_none=True)
    return out


def cancel_index(body: dict) -> int | None:
    """POST /v1/jobs/{id}/cancel: an empty body (the whole job) or `index` (one element of an array)."""
    unknown = sorted(set(body) - {"index"})
    if unknown:
        raise InvalidRequest(f"unknown field {unknown[0]} (known: index)")
    index = body.get("index")
    return None if index is None else integer(index, "index", 0, 1 << 62)


def empty_body(body: dict, what: str) -> None:
    """POST /v1/jobs/{id}/hold and /release: an empty body (or {})."""
    if body:
        raise InvalidRequest(f"unknown field {sorted(body)[0]} ({what} takes no fields)")


def requeue(body: dict) -> tuple[int | None, bool]:
    """POST /v1/jobs/{id}/requeue: optionally `index` (one element of an array) and `hold` (held after)."""
    unknown = sorted(set(body) - {"index", "hold"})
    if unknown:
        raise InvalidRequest(f"unknown field {unknown[0]} (known: index, hold)")
    index = body.get("index")
    return (None if index is None else integer(index, "index", 0, 1 << 62)), _flag(body.get("hold", False), "hold")


def job_update(body: dict) -> dict:
    """PATCH /v1/jobs/{id}: any of `name` (a string, or null for none), `priority` (a number; a class name is
    the server's to map: core), `timeout_seconds` (seconds or a duration's text, or null for none)."""
    unknown = sorted(set(body) - {"name", "priority", "timeout_seconds"})
    if unknown:
        raise InvalidRequest(f"unknown field {unknown[0]} (known: name, priority, timeout_seconds)")
    if not body:
        raise InvalidRequest("give at least one of name, priority, timeout_seconds")
    changes: dict = {}
    if "name" in body:
        changes["name"] = None if body["name"] is None else string(body["name"], "name", limit=256)
    if "priority" in body:
        changes["priority"] = body["priority"]  # checked (and a class name mapped) by core.update_job
    if "timeout_seconds" in body:
        value = body["timeout_seconds"]
        if value is not None:
            try:
                value = parse_duration(value)
            except ValueError as exc:
                raise InvalidRequest(f"timeout_seconds: {exc}") from None
            if not 0.001 <= value <= 10**9:
                raise InvalidRequest("timeout_seconds: must be from 0.001 to 1000000000 seconds")
        changes["timeout_seconds"] = value
    return changes


# -- teams (users, projects, memberships) ---------------------------------------

def _known(body: dict, fields: set[str]) -> None:
    unknown = set(body) - fields
    if unknown:
        raise InvalidRequest(f"unknown field {sorted(unknown)[0]}")


def _limit(value, field: str) -> int | None:
    return None if value is None else integer(value, field, 0, 1_000_000)


def user_request(body: dict) -> dict:
    """POST /v1/users: name, admin, projects [{project, role}], max_running_jobs, reclaim (a removed user's
    name: bring its old account back)."""
    _known(body, {"name", "admin", "projects", "max_running_jobs", "reclaim"})
    projects = body.get("projects") or []
    if not isinstance(projects, list) or len(projects) > 100:
        raise InvalidRequest("projects: must be a list of {project, role}", field="projects")
    pairs = []
    for item in projects:
        if not isinstance(item, dict) or set(item) - {"project", "role"}:
            raise InvalidRequest("projects: each must be {project, role}", field="projects")
        role = item.get("role", "member")
        if role not in ROLES:
            raise InvalidRequest(f"projects: role must be one of {', '.join(ROLES)}", field="projects")
        pairs.append((check_name(item.get("project"), "projects"), role))
    return {"name": check_name(body.get("name"), "name"), "admin": _flag(body.get("admin", False), "admin"),
            "projects": pairs, "max_running_jobs": _limit(body.get("max_running_jobs"), "max_running_jobs"),
            "reclaim": _flag(body.get("reclaim", False), "reclaim")}


def user_update(body: dict) -> dict:
    """PATCH /v1/users/{name}: what is given of admin, max_running_jobs (null clears it)."""
    _known(body, {"admin", "max_running_jobs"})
    changes: dict = {}
    if "admin" in body:
        changes["admin"] = _flag(body["admin"], "admin")
    if "max_running_jobs" in body:
        changes["max_running_jobs"] = _limit(body["max_running_jobs"], "max_running_jobs")
    return changes


def project_request(body: dict, *, create: bool) -> dict:
    """POST /v1/projects (name and settings) or PATCH /v1/projects/{name} (what is given of the settings):
    visibility, gpus (nominal quota; null: none), borrow, weight (null: the quota), max_priority (the highest
    priority its members may ask for), its idle policy (idle_timeout_seconds, idle_below_pct, idle_action; null
    clears one: the fleet's then applies)."""
    settings = {"visibility", "gpus", "borrow", "weight", "max_priority", *IDLE_SETTINGS}
    _known(body, settings | {"name"} if create else settings)
    found: dict = {"name": check_name(body.get("name"), "name")} if create else {}
    if body.get("visibility") is not None:
        if body["visibility"] not in VISIBILITIES:
            raise InvalidRequest(f"visibility: must be one of {', '.join(VISIBILITIES)}", field="visibility")
        found["visibility"] = body["visibility"]
    if "gpus" in body:
        found["gpus"] = _limit(body["gpus"], "gpus")
    if body.get("borrow") is not None:
        found["borrow"] = integer(body["borrow"], "borrow", 0, 1_000_000)
    if "weight" in body:
        found["weight"] = None if body["weight"] is None else number(body["weight"], "weight", 1e-6, 1e6)
    if body.get("max_priority") is not None:
        found["max_priority"] = integer(body["max_priority"], "max_priority", -1_000_000, 1_000_000)
    return found | idle_settings(body)


IDLE_SETTINGS = ("idle_timeout_seconds", "idle_below_pct", "idle_action")


def idle_settings(body: dict) -> dict:
    """A project's idle policy as given (docs/teams.md): a timeout over 0 s, a threshold within 0-100 (%), an
    action; null clears one (the fleet default then applies)."""
    found: dict = {}
    if "idle_timeout_seconds" in body:
        given = body["idle_timeout_seconds"]
        found["idle_timeout_seconds"] = None if given is None else number(given, "idle_timeout_seconds", 1e-3, 1e9)
    if "idle_below_pct" in body:
        given = body["idle_below_pct"]
        found["idle_below_pct"] = None if given is None else number(given, "idle_below_pct", 0, 100)
    if "idle_action" in body:
        if body["idle_action"] not in (None, *IDLE_ACTIONS):
            raise InvalidRequest(f"idle_action: must be one of {', '.join(IDLE_ACTIONS)} or null", field="idle_action")
        found["idle_action"] = body["idle_action"]
    return found


def membership_request(body: dict) -> str:
    """PUT /v1/projects/{name}/members/{user}: the role (member unless said)."""
    _known(body, {"role"})
    role = body.get("role", "member")
    if role not in ROLES:
        raise InvalidRequest(f"role: must be one of {', '.join(ROLES)}", field="role")
    return role
