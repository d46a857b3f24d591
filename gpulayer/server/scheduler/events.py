"""The append-only event log, written inside the transaction of each change."""
from __future__ import annotations

import json

from gpulayer.server.store.queries import QUERIES


def record(conn, now: float, kind: str, *, job_id: int | None = None, task_id: int | None = None,
           worker_id: int | None = None, **data) -> None:
    """Append one event of `kind` (the same word the structured log line uses)."""
    conn.execute(QUERIES["insert_event"], {"now": now, "kind": kind, "job_id": job_id, "task_id": task_id,
                                           "worker_id": worker_id, "data": json.dumps(data, sort_keys=True)})
