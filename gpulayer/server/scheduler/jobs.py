"""Jobs: submit and cancel as transactions, and how a job reads on the wire."""
from __future__ import annotations

import json

from gpulayer.server.scheduler import events

from gpulayer.server.scheduler import outcomes
from gpulayer.server.errors import InvalidRequest, NotFound
from gpulayer.server.scheduler.spec import referenced_digests
from gpulayer.server.store.queries import row, rows


def submit(conn, spec: dict, now: float) -> int:
    """Insert a validated (normalised) spec and its first attempt's tasks; returns the job id."""
    missing = [name for name in spec["secrets"] if row(conn, "get_secret", name=name) is None]
    if missing:
        raise InvalidRequest(f"secrets: no secret named {missing[0]!r} (set it with `gpulayer secret set`)",
                             code="unknown_secret")
    for digest in sorted(referenced_digests(spec)):
        if row(conn, "touch_artifact", digest=digest, now=now) is None:
            raise InvalidRequest(f"artifact {digest} is not stored on the control plane: upload it first "
                                 "(PUT /v1/artifacts/{digest})", code="unknown_artifact")
    service = spec["service"]
    width = service["replicas"] if service else spec["nodes"]
    job_id = row(conn, "insert_job", name=spec["name"], spec=json.dumps(spec), kind="service" if service else "batch",
                 priority=spec["priority"], labels=json.dumps(spec["labels"]), secrets=json.dumps(spec["secrets"]),
                 accelerator=spec["accelerator"],
                 gpus=spec["gpus"], cpus=spec["cpus"], memory_mb=spec["memory_mb"], width=width,
                 gang=int(spec["nodes"] > 1), max_attempts=spec["retry"]["max_attempts"],
                 retry_on=json.dumps(spec["retry"]["retry_on"]), now=now)["id"]
    for index in range(width):
        row(conn, "insert_task", job_id=job_id, index=index, attempt=1, priority=spec["priority"], now=now)
    events.record(conn, now, "job_submitted", job_id=job_id, name=spec["name"], width=width)
    return job_id


def cancel(conn, job_id: int, now: float) -> bool:
    """Cancel a job: queued tasks end now, running ones through their worker's heartbeat.

    Returns False when the job had already ended (cancel is then a no-op). Raises NotFound.
    """
    job = row(conn, "get_job", job_id=job_id)
    if job is None:
        raise NotFound(f"no job {job_id}")
    if job["state"] not in ("queued", "running"):
        return False
    for task in rows(conn, "cancel_queued_tasks", job_id=job_id, now=now):
        events.record(conn, now, "task_cancelled", job_id=job_id, task_id=task["id"])
    for task in rows(conn, "cancel_running_tasks", job_id=job_id):
        events.record(conn, now, "task_cancel_requested", job_id=job_id, task_id=task["id"],
                      worker_id=task["worker_id"])
    outcomes.finish(conn, now, job_id, "cancelled", None, "cancelled")
    return True


def _task_view(task: dict) -> dict:
    task = dict(task)
    task["outputs"] = json.loads(task["outputs"])
    task["index"] = task.pop("index")
    return task


def render(conn, job_id: int) -> dict:
    """The Job as the API returns it (NotFound when there is none)."""
    job = row(conn, "get_job", job_id=job_id)
    if job is None:
        raise NotFound(f"no job {job_id}")
    return _render(conn, job)


def _render(conn, job: dict) -> dict:
    tasks = [_task_view(t) for t in rows(conn, "job_tasks", job_id=job["id"])]
    return {"id": job["id"], "name": job["name"], "state": job["state"], "kind": job["kind"],
            "attempt": job["attempt"], "created_at": job["created_at"], "finished_at": job["finished_at"],
            "exit_code": job["exit_code"], "reason": job["reason"], "waiting_reason": waiting_reason(conn, job),
            "spec": json.loads(job["spec"]), "tasks": tasks}


def waiting_reason(conn, job: dict) -> str | None:
    """Why a queued job is not placed: what no online worker has (labels, size, secrets' labels), else
    that the workers that fit are busy; None when a worker could take it now."""
    if job["state"] != "queued":
        return None
    found = row(conn, "job_waiting_reason", job_id=job["id"])
    return (found["reason"] or found["busy"]) if found else None


def listing(conn, state: str | None, limit: int, before: int | None) -> list[dict]:
    """Jobs newest first."""
    return [_render(conn, job) for job in rows(conn, "list_jobs", state=state, limit=limit, before=before)]


def outputs(conn, job_id: int) -> dict[str, str]:
    """{path: digest} collected by the job's succeeded tasks (latest attempt wins)."""
    found: dict[str, str] = {}
    for task in reversed(rows(conn, "job_tasks", job_id=job_id)):
        if task["state"] == "succeeded":
            found.update(json.loads(task["outputs"]))
    return found


def endpoints(conn, job_id: int) -> dict:
    """The current attempt's replica endpoints; ready when every replica has one.

    Only a running service serves: once the job has ended (cancelled, a replica
    ended for good) the list is empty, even while its workers are still
    stopping replicas that have not cleared their endpoint yet.
    """
    job = row(conn, "get_job", job_id=job_id)
    if job is None:
        raise NotFound(f"no job {job_id}")
    if job["state"] != "running":
        return {"endpoints": [], "ready": False}
    replicas = rows(conn, "job_endpoints", job_id=job_id)
    found = [r["endpoint"] for r in replicas if r["endpoint"] and r["state"] == "running"]
    return {"endpoints": found, "ready": bool(replicas) and len(found) == len(replicas)}


def events_of(conn, job_id: int) -> list[dict]:
    """A job's events, oldest first (NotFound when there is no such job)."""
    if row(conn, "get_job", job_id=job_id) is None:
        raise NotFound(f"no job {job_id}")
    return [{**e, "data": json.loads(e["data"])} for e in rows(conn, "job_events", job_id=job_id)]


def log_lines(conn, job_id: int, after: int, limit: int) -> list[dict]:
    """Log lines of a job after sequence number `after`."""
    return rows(conn, "job_logs", job_id=job_id, after=after, limit=limit)


def job_ended(conn, job_id: int) -> bool:
    """True once the job is finished (succeeded, failed, cancelled or lost)."""
    job = row(conn, "get_job", job_id=job_id)
    return job is not None and job["finished_at"] is not None
