"""Aging: waiting work gains a small, capped priority boost per hour it waited (docs/teams.md, "Priority").

A queued task's place in the queue is its priority plus `task_queue.aged`, which
upkeep raises one step per AGING_STEP_S waited since the task became eligible
(`task_queue.since`: created, or released from held), to AGING_MAX at most. So
nothing waits for ever behind a stream of newer work of the same priority, while a
gap of more than AGING_MAX between two priorities stays strict. The boost orders
the queue only: what a task may preempt is judged by its own priority.

Stored, not computed in the claim: acquire reads task_queue_shape in the order of
`priority + aged`, so aging costs it nothing; upkeep raises the boosts in bounded
batches (AGING_BATCH rows a transaction), each task at most AGING_MAX times.
"""
from __future__ import annotations

import apsw

from gpulayer.server.store.queries import rows

AGING_STEP_S = 3600.0  # one step of boost per hour waited
AGING_MAX = 10         # at most +10: normal work that waited reaches the `high` class (10), never passes it
AGING_BATCH = 250      # rows raised per transaction (a few ms of the writer: docs/benchmarks/issue-22.md, "Aging")


def age(conn: apsw.Connection, now: float, limit: int = AGING_BATCH) -> int:
    """Raise the age boost of up to `limit` queued tasks due another step; how many were raised."""
    return len(rows(conn, "age_queued_tasks", now=now, step_s=AGING_STEP_S, max_aged=AGING_MAX, limit=limit))
