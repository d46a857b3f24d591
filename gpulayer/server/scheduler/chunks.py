"""Array elements leased ahead in chunks, given back, and several finishes in one transaction.

An agent that says it can (`prefetch`, docs/protocol.md "Elements leased ahead") is leased, beside
the assignments for its free slots, more queued elements of an array job it already holds, which it
starts itself as its slots free, with no round trip in between. How many: enough for about
AHEAD_WINDOW_S of the worker's slots at the job's recent element run time (Pace), at most MAX_AHEAD,
and none for elements that run longer than LONG_ELEMENT_S (a round trip is nothing beside them).
Only plain elements (no GPU, not a gang): a GPU index is reserved when a task is placed, and a
leased-ahead element holds none of the worker's room (`tasks.ahead`, worker_load). It holds its
place under the job's `%N` cap, as any assigned element does, and goes back to the queue at once,
same attempt, when its worker is lost, leaves, is cordoned or drained, or gives it back; a cancel
ends it as any assigned task. Its start rides on its finish (`pid`) or is sent as any start.
"""
from __future__ import annotations

import json
from typing import Callable

import apsw

from gpulayer.server.errors import TaskNotAssigned
from gpulayer.server.runtime.pace import MAX_AHEAD, Pace
from gpulayer.server.scheduler import events
from gpulayer.server.store.queries import row, rows

MAX_FINISHES = 1024    # finishes in one finish-many request (and ids in `held`, `release`)



def lease_ahead(conn: apsw.Connection, worker_id: int, now: float, lease_ttl_s: float, pace: Pace) -> list[int]:
    """Lease elements ahead to the worker (ahead_jobs, lease_ahead); their task ids, oldest first."""
    jobs = rows(conn, "ahead_jobs", worker_id=worker_id, now=now)
    budget = MAX_AHEAD - int(sum(j["ahead"] for j in jobs))
    taken: list[int] = []
    for job in jobs:
        want = min(pace.ahead(job["job_id"], job["slots"]) - int(job["ahead"]), budget)
        if want <= 0:
            continue
        leased = rows(conn, "lease_ahead", worker_id=worker_id, job_id=job["job_id"], now=now,
                      lease_expires_at=now + lease_ttl_s, n=want)
        for task in leased:
            events.record(conn, now, "task_assigned", job_id=task["job_id"], task_id=task["id"],
                          worker_id=worker_id, attempt=task["attempt"], element=task["index"], ahead=True)
        taken += [t["id"] for t in leased]
        budget -= len(leased)
    return taken


def held_ahead(conn: apsw.Connection, worker_id: int) -> list[int]:
    """The elements leased ahead to the worker and not started yet."""
    return [r["id"] for r in rows(conn, "ahead_held", worker_id=worker_id)]


def dropped(conn: apsw.Connection, worker_id: int, held: list[int]) -> list[int]:
    """Of `held` (what the agent holds leased ahead), the ids it must not start: no longer its, or cancelled."""
    return [r["id"] for r in rows(conn, "ahead_dropped", worker_id=worker_id, held=json.dumps(held))] if held else []


def requeue(conn: apsw.Connection, worker_id: int, now: float, reason: str, ids: list[int] | None = None) -> int:
    """The worker's elements leased ahead (all, or `ids`) go back to the queue, same attempt; how many."""
    back = rows(conn, "requeue_ahead", worker_id=worker_id, ids=None if ids is None else json.dumps(ids))
    _requeued(conn, now, back, reason, worker_id)
    return len(back)


def requeue_expired(conn: apsw.Connection, now: float) -> int:
    """Elements leased ahead on workers whose lease passed go back to the queue, same attempt; how many."""
    back = rows(conn, "requeue_ahead_expired", now=now)
    _requeued(conn, now, back, "worker_lost")
    return len(back)


def _requeued(conn: apsw.Connection, now: float, back: list[dict], reason: str, worker_id: int | None = None) -> None:
    for task in back:
        events.record(conn, now, "task_requeued", job_id=task["job_id"], task_id=task["id"],
                      worker_id=worker_id if worker_id is not None else task["worker_id"], reason=reason, ahead=True)
    for job_id in sorted({t["job_id"] for t in back}):
        row(conn, "requeue_job_if_idle", job_id=job_id)


def finish_many(conn: apsw.Connection, worker_id: int, finishes: list[dict], now: float, pace: Pace,
                finish: Callable[..., bool]) -> list[dict]:
    """Record several finishes in this one transaction, each fenced by its attempt; a result per finish.

    `finish` is lifecycle.finish (or its restored-plane wrapper). An element refused (not this worker's,
    another attempt, cancelled before its start rode on the finish) is refused alone, with its error,
    and changes nothing: each finish runs in a savepoint.
    """
    results = []
    for f in finishes:
        owned = row(conn, "task_owned", task_id=f["task_id"], worker_id=worker_id)
        try:
            if owned is not None and owned["attempt"] != f["attempt"]:
                raise TaskNotAssigned(f"task {f['task_id']} is at attempt {owned['attempt']}, not {f['attempt']}")
            with conn:  # a savepoint: a finish refused midway leaves nothing behind
                accepted = finish(conn, worker_id, f["task_id"], f["exit_code"], f["outcome"], f["outputs"],
                                  f["reason"], now, lines=f["lines"], pid=f["pid"], checkpoint=f.get("checkpoint"),
                                  signals=f.get("signals", ()))
        except TaskNotAssigned as exc:
            results.append({"task_id": f["task_id"], "accepted": False, "error": exc.to_dict()["error"]})
            continue
        if accepted and f.get("run_s") is not None and owned is not None:
            pace.note(owned["job_id"], f["run_s"])
        results.append({"task_id": f["task_id"], "accepted": accepted})
    return results
