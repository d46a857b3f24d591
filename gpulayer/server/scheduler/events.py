"""The append-only event log, written inside the transaction of each change."""
from __future__ import annotations

import json
from contextvars import ContextVar

import apsw

from gpulayer.server.store.queries import QUERIES

# Who caused what is written now: `user:alice`, `worker:12`, `join:<token name>`, or `system` (the
# server's own loops). The HTTP auth middleware sets it for each request; Store.write runs each
# write in its caller's context, so the writer thread records the caller's actor.
ACTOR: ContextVar[str] = ContextVar("gpulayer_actor", default="system")


def record(conn: apsw.Connection, now: float, kind: str, *, job_id: int | None = None, task_id: int | None = None,
           worker_id: int | None = None, **data) -> None:
    """Append one event of `kind` (the same word the structured log line uses), with its actor (ACTOR)."""
    conn.execute(QUERIES["insert_event"], {"now": now, "kind": kind, "job_id": job_id, "task_id": task_id,
                                           "worker_id": worker_id, "data": json.dumps(data, sort_keys=True),
                                           "actor": ACTOR.get()})
