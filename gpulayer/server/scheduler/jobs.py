"""Jobs: submit and cancel as transactions (how a job reads on the wire is views.py's)."""
from __future__ import annotations

import json
import re
from typing import Any

import apsw

from gpulayer.protocol.fields import names, to_wire
from gpulayer.protocol.jobspec import JobSpec
from gpulayer.server.scheduler import events, outcomes
from gpulayer.server.errors import InvalidRequest, NotFound, TooManyQueued
from gpulayer.server.scheduler.spec import ValidSpec, array_indices, referenced_digests
from gpulayer.server.store.queries import QUERIES, one, row, rows

#: The JobSpec fields with a column of their own name in `jobs`: the fields `insert_job` takes as
#: parameters (:gpus), each written from the spec's attribute by `_column` (docs/architecture.md,
#: "Adding a field": a column is added to schema.sql, a migration and that query, and to nothing here).
COLUMN_FIELDS = tuple(name for name in names(JobSpec) if name in set(re.findall(r":(\w+)", QUERIES["insert_job"])))


def _column(value: Any) -> Any:
    """A field's value as its column holds it: a bool as 0 or 1, a list or an object as JSON, else itself."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return value


def submit(conn: apsw.Connection, spec: ValidSpec, now: float, user_id: int = 1, project_id: int = 1) -> int:
    """Insert a validated spec (spec.validate_job) and its first attempt's tasks, owned by `user_id` in
    `project_id` (teams.submit_owner); returns the job id."""
    missing = [name for name in spec.secrets
               if row(conn, "get_secret", project_id=project_id, name=name) is None]
    if missing:
        raise InvalidRequest(f"secrets: no secret named {missing[0]!r} in the job's project "
                             "(set it with `gpulayer secret set --project`)",
                             code="unknown_secret")
    for digest in sorted(referenced_digests(spec)):
        if row(conn, "touch_artifact", digest=digest, now=now) is None:
            raise InvalidRequest(f"artifact {digest} is not stored on the control plane: upload it first "
                                 "(PUT /v1/artifacts/{digest})", code="unknown_artifact")
    after = [(dep, _dependency(conn, dep.job)) for dep in spec.after]
    later = spec.begin_at is not None and spec.begin_at > now
    waiting = any(state in outcomes.ACTIVE_JOB for _, state in after) or spec.hold or later
    width = spec.service.replicas if spec.service else spec.nodes
    indices = elements(spec)
    job_id = one(conn, "insert_job", **{name: _column(getattr(spec, name)) for name in COLUMN_FIELDS},
                 spec=json.dumps(to_wire(spec)), kind="service" if spec.service else "batch", width=width,
                 gang=int(spec.nodes > 1), max_attempts=spec.retry.max_attempts,
                 retry_on=json.dumps(spec.retry.retry_on), now=now, state="waiting" if waiting else "queued",
                 array_size=len(indices) if spec.array else None, user_id=user_id, project_id=project_id)["id"]
    if len(indices) <= outcomes.BATCH:  # one statement for every task; held ones stay out of task_queue
        conn.execute(QUERIES["insert_tasks"], {"job_id": job_id, "indices": json.dumps(indices), "now": now,
                                               "priority": spec.priority, "offset": 0,
                                               "released": 0 if waiting else (spec.max_running or len(indices))})
    else:  # a big array: BATCH elements a write, all held until the last is in (outcomes.insert_step)
        outcomes.insert_step(conn, now, job_id, 0)
    for dep, _ in after:
        row(conn, "insert_dependency", job_id=job_id, after_job_id=dep.job, condition=dep.condition)
    extra: dict = {"array_size": len(indices)} if spec.array else {}
    if waiting:
        extra["waiting_for"] = [dep.job for dep, state in after if state in outcomes.ACTIVE_JOB]
        extra.update({"held": True} if spec.hold else {}, **({"begin_at": spec.begin_at} if later else {}))
    events.record(conn, now, "job_submitted", job_id=job_id, name=spec.name, width=width, **extra)
    failed = next(((dep, state) for dep, state in after
                   if state not in outcomes.ACTIVE_JOB and not outcomes.dependency_met(dep.condition, state)), None)
    if failed is not None:  # it can never run: cancelled at once, as if that dependency had just ended
        outcomes.cancel_dependent(conn, now, job_id, failed[0].job, failed[1], first_step=True)
    return job_id


def elements(spec: ValidSpec) -> list[int]:
    """The indices of a validated spec's tasks: an array's elements, else its replicas or ranks."""
    if spec.array:
        return array_indices(spec.array)
    return list(range(spec.service.replicas if spec.service else spec.nodes))


def check_queued_elements(conn: apsw.Connection, user: str, user_id: int, adding: int, cap: int) -> int:
    """The user's tasks not yet ended (queued, held, running; of jobs not being cancelled); TooManyQueued when
    the `adding` of a new job would pass `cap` with them (counted up to just past the cap)."""
    found = one(conn, "user_queued_elements", user_id=user_id, limit=cap + 1)["n"]
    if found + adding > cap:
        shown = f"{found:,}" if found <= cap else f"more than {cap:,}"
        raise TooManyQueued(f"user {user} has {shown} tasks (array elements) not yet ended; this job's "
                            f"{adding:,} would pass the cap of {cap:,} a user (`gpulayer server start "
                            f"--max-queued-elements`): wait until some have ended, or cancel some",
                            limit=cap, queued=found, adding=adding)
    return found


def _dependency(conn: apsw.Connection, job_id: int) -> str:
    """The state of a job named in `after`; InvalidRequest when there is none (so no cycle can be made)."""
    found = row(conn, "get_job", job_id=job_id)
    if found is None:
        raise no_dependency(job_id)
    return found["state"]


def no_dependency(job_id: int) -> InvalidRequest:
    """The answer to an `after` that names no job, and (teams.submit) one the submitter may not see: the same."""
    return InvalidRequest(f"after: no job {job_id} (a job runs after jobs that exist)", code="unknown_job")


def cancel(conn: apsw.Connection, job_id: int, now: float) -> bool:
    """Cancel a job: queued tasks end now, running ones through their worker's heartbeat; a big array's
    in bounded steps (outcomes.end_step), the job ending `cancelled` after its last.

    Returns False when the job had already ended (cancel is then a no-op). Raises NotFound.
    """
    job = row(conn, "get_job", job_id=job_id)
    if job is None:
        raise NotFound(f"no job {job_id}")
    if job["state"] not in outcomes.ACTIVE_JOB:
        return False
    outcomes.cancel(conn, now, job_id, "cancelled")
    return True


def cancel_element(conn: apsw.Connection, job_id: int, index: int, now: float) -> bool:
    """Cancel one element of an array: queued (held or not) or assigned, it ends now; running, through its
    worker's heartbeat. False when the element (or the array) had already ended. Raises NotFound, or
    InvalidRequest for a job that is no array."""
    job = row(conn, "job_for_update", job_id=job_id)
    if job is None:
        raise NotFound(f"no job {job_id}")
    if job["array_size"] is None:
        raise InvalidRequest(f"index: job {job_id} is no array (to cancel the whole job, send no index)")
    if not rows(conn, "element_tasks", job_id=job_id, index=index):
        raise NotFound(f"job {job_id} has no element {index}")
    if job["state"] not in outcomes.ACTIVE_JOB:
        return False
    task = row(conn, "cancel_element", job_id=job_id, index=index, now=now)
    if task is None:
        return False
    if task["state"] == "running":
        events.record(conn, now, "task_cancel_requested", job_id=job_id, task_id=task["id"],
                      worker_id=task["worker_id"], index=index)
        return True
    events.record(conn, now, "task_cancelled", job_id=job_id, task_id=task["id"], index=index)
    # A held element frees no place under the cap; the array ends if it was the last element left.
    outcomes.settle_element(conn, now, job, {"id": task["id"], "state": "cancelled"}, freed=not task["held"])
    return True

