"""A replica leaving its service without dropping a request: drain, then stop (issue 39, item 5).

`drain_replica` marks a replica's task (`tasks.drain_deadline`, `drain_started_at`): the ingress's set of
ready replicas leaves it out from then on (scheduler/ingress.py reads `drain_deadline IS NULL`; the proxy also
skips the tasks in `Counters.draining` at once), so no new request goes to it while those in flight finish.
Upkeep (`advance`, the `service_drains` job) tells its worker to stop it (`cancel_requested`: its `signal` and
grace, as a cancel) once no ingress request is in flight to it, `SETTLE_S` after it left the set at the
earliest (a request that picked it from the proxy's cache just before is counted by then), or at its
deadline. A draining replica's end is never retried or replaced and never ends its service
(outcomes.settle); a scale to zero leaves a running service with no task. Scale-down (autoscale.py) and
rolling updates drain through here.
"""
from __future__ import annotations

import apsw

from gpulayer.server.scheduler import events
from gpulayer.server.store.queries import row, rows

#: Seconds after a replica left the ingress's set before it may be stopped for having nothing in flight:
#: more than the proxy's cache of the set (relay/ingress.py CACHE_S, 1 s).
SETTLE_S = 2.0
#: A drain's deadline when its caller gives none (docs/services.md, "Autoscaling").
DEFAULT_DEADLINE_S = 30.0


def drain_replica(conn: apsw.Connection, now: float, task_id: int, deadline_s: float, why: str) -> dict | None:
    """Start draining replica `task_id` of a running service for `why` (`scale_down`, `update`, ...): out of the
    ingress's set now, stopped within `deadline_s`. A replica not placed yet ends at once (`replica_drained`).
    Returns its task (id, job_id, index, worker_id, state), None when it is no live replica or drains already."""
    deadline = now + max(0.0, deadline_s)
    task = row(conn, "drain_task", task_id=task_id, deadline=deadline, now=now)
    if task is not None:
        events.record(conn, now, "replica_draining", job_id=task["job_id"], task_id=task_id,
                      worker_id=task["worker_id"], index=task["index"], deadline=deadline, why=why)
        return task
    queued = row(conn, "drain_queued_task", task_id=task_id, now=now)
    if queued is not None:
        events.record(conn, now, "replica_drained", job_id=queued["job_id"], task_id=task_id, index=queued["index"],
                      in_flight=0, why=why, stopped="not_placed")
        return {**queued, "worker_id": None, "state": "cancelled"}
    return None


def draining(conn: apsw.Connection) -> list[dict]:
    """The replicas draining now (not yet ended), soonest deadline first."""
    return rows(conn, "draining_tasks")


def advance(conn: apsw.Connection, now: float, in_flight: dict[int, int]) -> list[int]:
    """Stop each draining replica with no request in flight (`in_flight`: ingress requests by task id), once
    `SETTLE_S` passed since it left the set, or whose deadline passed; returns the task ids told to stop."""
    stopped = []
    for task in draining(conn):
        if task["cancel_requested"]:
            continue
        left = in_flight.get(task["id"], 0)
        if now >= task["drain_deadline"]:
            stop = "deadline"
        elif left <= 0 and now >= task["drain_started_at"] + SETTLE_S:
            stop = "idle"
        else:
            continue
        done = row(conn, "stop_drained_task", task_id=task["id"])
        if done is None:
            continue
        events.record(conn, now, "replica_drained", job_id=done["job_id"], task_id=done["id"],
                      worker_id=done["worker_id"], index=task["index"], in_flight=left, stopped=stop)
        stopped.append(done["id"])
    return stopped


def was_draining(conn: apsw.Connection, task_id: int) -> bool:
    """Whether task `task_id` was draining (its end leaves its service as it is: no retry, no replacement)."""
    return row(conn, "task_drain", task_id=task_id) is not None


__all__ = ["DEFAULT_DEADLINE_S", "SETTLE_S", "advance", "drain_replica", "draining", "was_draining"]
