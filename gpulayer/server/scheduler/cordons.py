"""Cordon, drain, uncordon: taking a worker out of service, as transactions.

A cordoned worker is a row of `worker_cordons`; `shape_worker_fit.schedulable`
reads it, so acquire, gang placement and the waiting reasons all skip the
worker at once. Running tasks go on. A drain is a cordon that upkeep watches
(`advance_drains`): the worker is `drained` once it holds no task, or at its
deadline, when its tasks go back to the queue with the same attempt (an
operator's maintenance uses up none of a job's attempts; a gang goes back
whole) and its worker is told to stop them through `cancel_task_ids`.
"""
from __future__ import annotations

import apsw

from gpulayer.server.errors import Conflict, NotFound
from gpulayer.server.scheduler import chunks, events, leases, ledger
from gpulayer.server.store.queries import row, rows

#: Reason of the tasks a drain's deadline stops: requeued with it, or, for a task already being
#: stopped (a cancel, a preemption, a GPU gone bad), lost with it (the retry policy reads worker_lost).
DRAIN_STOPPED = "worker_drained"


def resolve(conn: apsw.Connection, ref: str) -> dict:
    """The worker an operator names by id or name: the online one of that name, else its newest
    registration not gone (an offline one, whose cordon its next registration carries), else the newest.

    A machine that rejoins after a crash leaves its old registration offline under the same name: that
    one is no live worker, so the name still means the online one. Raises NotFound for none, Conflict
    when several online workers share the name.
    """
    found = rows(conn, "workers_named", ref=ref)  # gone ones last, newest first
    if ref.isdigit():
        by_id = [w for w in found if str(w["id"]) == ref]
        if by_id:
            return by_id[0]
    named = [w for w in found if w["name"] == ref]
    online = [w for w in named if w["state"] == "online"]
    if len(online) > 1:
        raise Conflict(f"{len(online)} online workers are named {ref!r} (ids "
                       f"{', '.join(str(w['id']) for w in online)}): name one by its id", code="ambiguous_worker")
    if online or named:
        return (online or named)[0]
    raise NotFound(f"no worker {ref!r} (give its id or name, as `gpulayer worker list` shows)")


def cordon(conn: apsw.Connection, ref: str, reason: str, now: float, *, drain: bool = False, timeout_s: float | None = None) -> dict:
    """Cordon (or drain) the worker `ref`; returns the worker's cordon as stored.

    Raises NotFound / Conflict (resolve), and Conflict for a worker that is gone.
    """
    worker = resolve(conn, ref)
    if worker["state"] == "gone":
        raise Conflict(f"worker {worker['name']} (id {worker['id']}) is gone: there is nothing to cordon",
                       code="worker_gone")
    state = "draining" if drain else "cordoned"
    deadline = None if timeout_s is None or not drain else now + timeout_s
    before = row(conn, "worker_cordon", worker_id=worker["id"])
    if not drain and before is not None and before["state"] in ("draining", "drained"):
        return describe(conn, worker)  # a cordon does not undo a drain
    row(conn, "cordon_worker", worker_id=worker["id"], state=state, reason=reason, now=now, deadline=deadline)
    events.record(conn, now, "worker_draining" if state == "draining" else "worker_cordoned",
                  worker_id=worker["id"], name=worker["name"], reason=reason, deadline=deadline)
    chunks.requeue(conn, worker["id"], now, "worker_" + state)  # leased ahead, never started: no new work there
    if state == "draining":
        advance_drains(conn, now, only=worker["id"])
    return describe(conn, worker)


def uncordon(conn: apsw.Connection, ref: str, now: float) -> dict:
    """Put the worker `ref` back into service (a no-op when it is not cordoned)."""
    worker = resolve(conn, ref)
    removed = row(conn, "uncordon_worker", worker_id=worker["id"])
    if removed is not None:
        events.record(conn, now, "worker_uncordoned", worker_id=worker["id"], name=worker["name"],
                      was=removed["state"], reason=removed["reason"])
    return describe(conn, worker)


def describe(conn: apsw.Connection, worker: dict) -> dict:
    """`{id, name, state, cordon, cordon_reason, drain_deadline}` of one worker now."""
    found = row(conn, "worker_cordon", worker_id=worker["id"])
    return {"id": worker["id"], "name": worker["name"], "state": worker["state"],
            "cordon": found["state"] if found else None, "cordon_reason": found["reason"] if found else None,
            "cordoned_at": found["since"] if found else None, "drain_deadline": found["deadline"] if found else None}


def advance_drains(conn: apsw.Connection, now: float, only: int | None = None) -> int:
    """Upkeep: draining workers that hold no task, or whose deadline passed, become drained; how many.

    At the deadline, its tasks go back to the queue (requeue_at_deadline); the
    worker hears `cancel_task_ids` on its next heartbeat.
    """
    drained = 0
    for worker in rows(conn, "draining_workers", now=now):
        worker_id = worker["worker_id"]
        if only is not None and worker_id != only:
            continue
        if worker["active"] and worker["due"]:
            requeue_at_deadline(conn, worker_id, now)
        if row(conn, "mark_drained", worker_id=worker_id, now=now) is not None:
            events.record(conn, now, "worker_drained", worker_id=worker_id, timed_out=bool(worker["due"]))
            drained += 1
    return drained


def requeue_at_deadline(conn: apsw.Connection, worker_id: int, now: float) -> None:
    """A drain's deadline passed: the worker's tasks go back to the queue, same attempt, as a
    preemption's do (a run that started is written to the usage ledger as `requeued`); a gang's
    ranks go back whole (their other workers are told to stop theirs). What is already being
    stopped (a cancel, a preemption, a GPU gone bad) is lost with reason `worker_drained`."""
    for task in rows(conn, "drain_due_tasks", worker_id=worker_id):
        if task["gang"]:
            ranks = rows(conn, "attempt_tasks", job_id=task["job_id"], attempt=task["attempt"])
            if not any(r["id"] == task["id"] and r["state"] in ("assigned", "running") for r in ranks):
                continue  # released with an earlier rank of the same gang on this worker
            leases.release_gang(conn, now, task["job_id"], task["attempt"], "drain_timeout", ranks)
            continue
        if task["state"] == "running":
            ledger.record(conn, now, [task["id"]], outcome="requeued")
        if row(conn, "requeue_drained_task", task_id=task["id"], worker_id=worker_id) is None:
            continue
        row(conn, "requeue_job_if_idle", job_id=task["job_id"])
        events.record(conn, now, "task_requeued", job_id=task["job_id"], task_id=task["id"],
                      worker_id=worker_id, attempt=task["attempt"], reason="drain_timeout")
    leases.finish_leftovers(conn, worker_id, DRAIN_STOPPED, now)
