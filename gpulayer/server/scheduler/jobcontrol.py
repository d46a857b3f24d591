"""Job control as Slurm users know it (issue 27): the `why` of a signal, hold, release, requeue, update.

Each function is one transaction's work (the caller's write), checked by the caller's rights first
(teams.py): it changes nothing when it refuses.
"""

from __future__ import annotations

import json

import apsw

from gpulayer.server.errors import Conflict, InvalidRequest, NotFound
from gpulayer.server.scheduler import events, outcomes, teams
from gpulayer.server.store.queries import QUERIES, one, row, rows


def signal_why(conn: apsw.Connection, task: dict, sent: dict) -> str:
    """Why a signal the agent reports (a finish's `signals`) was sent, as its `task_signalled` event says it.

    The agent knows its own reasons (the time limit, a drain); a stop the control plane asked for it
    reports as `cancelled`, and the control plane knows which: a pending preemption (`preempted`),
    a requeue (`requeued`, the task's reason while its stop is asked), else a cancel.
    """
    if sent["why"] != "cancelled":
        return sent["why"]
    if row(conn, "pending_preemption", task_id=task["id"]) is not None:
        return "preempted"
    if task.get("reason") == "requeued":
        return "requeued"
    return "cancelled"


def heartbeat_fields(conn: apsw.Connection, worker_id: int) -> dict:
    """What a heartbeat answer adds for requeues: `requeued_task_ids`, those of its `cancel_task_ids` that stop
    to run again (`job requeue`), so that the agent logs a requeue, not a cancel; {} when none."""
    found = rows(conn, "worker_requeueing", worker_id=worker_id)
    return {"requeued_task_ids": [r["task_id"] for r in found]} if found else {}


# -- hold, release, begin ------------------------------------------------------

#: Jobs whose begin time came, released per upkeep round (the rest at the next).
BEGIN_BATCH = 100


def hold(conn: apsw.Connection, now: float, job_id: int) -> bool:
    """`job hold`: the job (or an array's elements not yet started) waits, reason `held`, until released.

    A job queued with nothing started waits (state `waiting`); an array with elements running keeps
    them and holds the rest. False when it was held already. Raises Conflict for a job that ended, or
    one whose every task has started (nothing is left to hold: requeue it instead)."""
    job = _active(conn, job_id, "hold")
    if job["hold"]:
        return False
    if job["state"] == "running" and job["array_size"] is None:
        raise Conflict(
            f"job {job_id} is running: hold keeps a job from starting (`gpulayer job requeue --hold` stops it and holds it)", code="job_running"
        )
    held = one(conn, "hold_job", job_id=job_id)
    conn.execute(QUERIES["hold_queued_tasks"], {"job_id": job_id})
    events.record(conn, now, "job_held", job_id=job_id, state=held["state"])
    return True


def release(conn: apsw.Connection, now: float, job_id: int) -> bool:
    """`job release`: a held job's hold ends; it is queued when it waits for nothing else (its
    dependencies, its begin time), and its tasks join the queue (as its %N cap allows). False when it
    was not held. Raises Conflict for a job that ended."""
    _active(conn, job_id, "release")
    released = row(conn, "unhold_job", job_id=job_id)
    if released is None:
        return False
    events.record(conn, now, "job_released_hold", job_id=job_id)
    _let_run(conn, now, released)
    return True


def begin_due(conn: apsw.Connection, now: float) -> int:
    """Upkeep: the waiting jobs whose begin time has come run, unless they wait for more; how many came."""
    due = rows(conn, "begin_due", now=now, n=BEGIN_BATCH)
    for job in due:
        events.record(conn, now, "job_begin_time", job_id=job["id"])
        _let_run(conn, now, one(conn, "get_job", job_id=job["id"]))
    return len(due)


def _let_run(conn: apsw.Connection, now: float, job: dict) -> None:
    """A job that waited (on hold, for its begin time) runs now if nothing else keeps it: a waiting job
    is queued (release_job checks its dependencies, hold and begin time), and its held tasks join the
    queue, an array's as its %N cap allows."""
    if job["state"] == "waiting":
        if not outcomes.elements_made(conn, one(conn, "get_job", job_id=job["id"])):
            return  # a big array still being made: its last insert_step releases it
        queued = row(conn, "release_job", job_id=job["id"], now=now)
        if queued is None:
            return
        events.record(conn, now, "job_released", job_id=job["id"])
        outcomes._follow(conn, now, ("release", job["id"], queued["max_running"] or -1))
    elif job["state"] in ("queued", "running"):
        cap = job["max_running"]
        left = -1 if cap is None else cap - one(conn, "job_released_active", job_id=job["id"])["n"]
        if left != 0:
            outcomes._follow(conn, now, ("release", job["id"], max(left, -1)))


def _active(conn: apsw.Connection, job_id: int, what: str) -> dict:
    """The job's row (job_for_update) while it has not ended and is not being cancelled; Conflict else."""
    job = row(conn, "job_for_update", job_id=job_id)
    if job is None:
        raise NotFound(f"no job {job_id}")
    if job["state"] not in outcomes.ACTIVE_JOB or job["reason"] is not None:
        raise Conflict(f"job {job_id} has ended ({job['state']}): there is nothing to {what}", code="job_ended")
    return job


# -- update --------------------------------------------------------------------


def update(conn: apsw.Connection, principal, now: float, job_id: int, changes: dict) -> dict:
    """`job update` (PATCH /v1/jobs/{id}): `name`, `priority` and `timeout_seconds`, each only when given,
    on a job not ended. The priority is bound by its project's ceiling unless an admin asks
    (teams.check_priority, as at submit); the time limit applies to running attempts too (their agents hear
    it in heartbeat answers, `time_limits`: leases.time_limits). Raises
    Conflict for a job that ended, Forbidden above the ceiling; changes nothing then. Returns what changed."""
    job = _active(conn, job_id, "update")
    found = one(conn, "get_job", job_id=job_id)
    spec = json.loads(found["spec"])
    if "priority" in changes:
        teams.check_priority(conn, principal, job["project_id"], changes["priority"])
        spec["priority"] = changes["priority"]
    if "name" in changes:
        spec["name"] = changes["name"]
    if "timeout_seconds" in changes:
        spec["timeout_seconds"] = changes["timeout_seconds"]
    row(
        conn,
        "update_job",
        job_id=job_id,
        set_name="name" in changes,
        name=changes.get("name"),
        priority=changes.get("priority"),
        spec=json.dumps(spec),
    )
    if "priority" in changes:
        conn.execute(QUERIES["update_task_priority"], {"job_id": job_id, "priority": changes["priority"]})
        conn.execute(QUERIES["update_queue_priority"], {"job_id": job_id, "priority": changes["priority"]})
    events.record(conn, now, "job_updated", job_id=job_id, **changes)
    return changes


# -- requeue -------------------------------------------------------------------


def requeue(conn: apsw.Connection, now: float, job_id: int, index: int | None = None, hold_after: bool = False) -> dict:
    """`job requeue` (POST /v1/jobs/{id}/requeue): run the job (an array's element `index`, else all of them)
    again, as a new attempt not counted against its retries (an `attempt_requeued` event each, which
    outcomes.retries_left counts: the job's max_attempts is not raised); `hold_after`: held once queued.

    A running job's running tasks are stopped as any planned stop is (its signal, its grace, SIGKILL:
    their worker hears `cancel_task_ids`) and keep their room until they ended; each one's finish
    comes to `requeued` (below), which queues the new attempt once the last has ended. A job that
    ended runs again now. Raises Conflict for a job that has not started (queued, waiting) or is being
    cancelled, NotFound for an element it has not; changes nothing then. Returns {"stopping": N}.
    """
    job = row(conn, "job_for_update", job_id=job_id)
    if job is None:
        raise NotFound(f"no job {job_id}")
    if job["array_size"] is None and index is not None:
        raise InvalidRequest(f"index: job {job_id} is no array (to requeue the whole job, send no index)")
    if index is not None and row(conn, "element_tasks", job_id=job_id, index=index) is None:
        raise NotFound(f"job {job_id} has no element {index}")
    if job["state"] in outcomes.ACTIVE_JOB:
        if job["reason"] is not None:
            raise Conflict(f"job {job_id} is being cancelled: it cannot be requeued", code="job_ended")
        stopping = rows(conn, "request_requeue", job_id=job_id, index=index)
        if job["state"] != "running" or (not stopping and job["array_size"] is None):
            raise Conflict(
                f"job {job_id} is {job['state']}: it has not started, so there is nothing to requeue (hold it with `gpulayer job hold`)",
                code="job_not_started",
            )
        for task in stopping:
            events.record(conn, now, "task_requeue_requested", job_id=job_id, task_id=task["id"], worker_id=task["worker_id"], index=task["index"])
        conn.execute(QUERIES["count_requeue"], {"job_id": job_id, "hold": int(hold_after)})
        again = _requeue_elements(conn, now, job, index) if job["array_size"] is not None else 0
        events.record(
            conn,
            now,
            "job_requeue_requested",
            job_id=job_id,
            stopping=len(stopping),
            hold=hold_after,
            **({"index": index} if index is not None else {}),
            **({"again": again} if again else {}),
        )
        return {"stopping": len(stopping)}
    stopping_task = row(conn, "job_task_stopping", job_id=job_id)
    if stopping_task is not None:
        raise Conflict(
            f"job {job_id} ended, but its task {stopping_task['id']} is still {stopping_task['state']} on its worker "
            "until the worker hears of it: requeue it once that task ended",
            code="job_stopping",
        )
    reopened = one(conn, "reopen_job", job_id=job_id, hold=int(hold_after))
    if job["array_size"] is not None:
        _requeue_elements(conn, now, {**job, **reopened, "hold": int(hold_after)}, index)
    else:
        _attempt_requeued(conn, now, job_id, reopened["attempt"])
        for i in range(reopened["width"]):
            row(conn, "insert_task", job_id=job_id, index=i, attempt=reopened["attempt"], priority=reopened["priority"], now=now)
    events.record(
        conn,
        now,
        "job_requeued",
        job_id=job_id,
        attempt=reopened["attempt"],
        was=job["state"],
        hold=hold_after,
        **({"index": index} if index is not None else {}),
    )
    if hold_after:
        _hold_now(conn, now, job_id)
    return {"stopping": 0}


def _requeue_elements(conn: apsw.Connection, now: float, job: dict, index: int | None) -> int:
    """An array's ended elements (`index` alone, if given) run again, as its %N cap allows; how many."""
    made = rows(conn, "requeue_elements", job_id=job["id"], index=index, priority=job["priority"], now=now)
    for task in made:
        _attempt_requeued(conn, now, job["id"], task["attempt"], task["index"])
    if made and not job["hold"]:
        _let_run(conn, now, one(conn, "get_job", job_id=job["id"]))
    return len(made)


def _attempt_requeued(conn: apsw.Connection, now: float, job_id: int, attempt: int, index: int | None = None) -> None:
    """A requeue made this attempt (of the job, or of array element `index`): it is not one of its retries
    (outcomes.retries_left counts these events; the job's max_attempts stays as submitted)."""
    events.record(conn, now, "attempt_requeued", job_id=job_id, attempt=attempt,
                  **({"index": index} if index is not None else {}))


def _hold_now(conn: apsw.Connection, now: float, job_id: int) -> None:
    held = one(conn, "hold_job", job_id=job_id)
    conn.execute(QUERIES["hold_queued_tasks"], {"job_id": job_id})
    events.record(conn, now, "job_held", job_id=job_id, state=held["state"])


def requeued(conn: apsw.Connection, worker_id: int, task: dict, exit_code: int | None, outcome: str, outputs: str, now: float) -> bool:
    """The finish of a task stopped for a requeue (lifecycle.finish; `task` its task_owned row): it ends
    `cancelled`, reason `requeued`. An array's element runs again at once, as a new task; another job's
    new attempt is queued once its last requeued task ended (its room held until then). The requeue's
    outcome transaction: where what the stopped attempt leaves (a checkpoint) is recorded, with it."""
    ended = row(
        conn,
        "finish_task",
        task_id=task["id"],
        worker_id=worker_id,
        state="cancelled",
        exit_code=exit_code,
        outcome=outcome,
        reason="requeued",
        outputs=outputs,
        now=now,
    )
    if ended is None:
        return False
    events.record(
        conn,
        now,
        "task_requeued",
        job_id=task["job_id"],
        task_id=task["id"],
        worker_id=worker_id,
        attempt=task["attempt"],
        exit_code=exit_code,
        reason="requeued",
    )
    attempt_ended(conn, now, task)
    job = one(conn, "job_for_update", job_id=task["job_id"])
    if job["state"] not in ("queued", "running"):
        return True
    if job["array_size"] is not None:
        _requeue_elements(conn, now, job, ended["index"])
        return True
    if one(conn, "requeue_pending", job_id=job["id"])["n"] == 0 and job["attempt"] == task["attempt"]:
        _attempt_requeued(conn, now, job["id"], outcomes.retry(conn, now, job, "requeued"))
        if job["hold"]:
            _hold_now(conn, now, job["id"])
    return True


def attempt_ended(conn: apsw.Connection, now: float, task: dict) -> None:
    """A task's attempt ended for a requeue, in the requeue's transaction (before the new attempt is made):
    the place for what it leaves behind to be recorded with it (issue 27's checkpoints hook in here)."""
