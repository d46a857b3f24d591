"""GPU telemetry (issue 28 part 4): per-GPU utilization and memory from heartbeats, kept off the write path.

A heartbeat's `gpu_samples` (the agent's mean utilization and peak memory of
each GPU over one heartbeat interval) are kept in memory (runtime/gpu_samples.py's Buffer), as lease
renewals are (renewals.py), and upkeep writes every tick's in one statement,
in the transaction that flushes the renewals (Scheduler.expire): a heartbeat
that changes nothing stays a read. A flush that fails puts its samples back
for the next tick; what is past `MAX_BUFFERED` (upkeep stalled for long) drops
the oldest, with a log line. A control plane killed loses at most one tick of
them. `job status` reads the newest sample of each GPU of a running task
(`job_usage`); retention prunes them (retention.py, `--gpu-sample-retention`).
"""

from __future__ import annotations

import json
import logging

import apsw

from gpulayer.server.runtime.gpu_samples import Sample
from gpulayer.server.store.queries import QUERIES, rows

log = logging.getLogger("gpulayer.server.scheduler.gpu_samples")
MAX_TASK_GPUS = 4096  # rows of a `job_usage` answer at most (running tasks x their GPUs)




def flush(conn: apsw.Connection, taken: list[Sample]) -> int:
    """Write `taken` (Buffer.take) in one statement, in a savepoint of the caller's transaction; how many.

    Samples SQL refuses are dropped with a log line, never upkeep's lease judgement with them; an error that
    ended the whole transaction (a full disk) is raised, for the caller to put them back.
    """
    if not taken:
        return 0
    try:
        with conn:  # a savepoint: upkeep's transaction
            conn.execute(QUERIES["insert_gpu_samples"], {"samples": json.dumps(taken)})
    except apsw.Error as exc:
        if conn.getautocommit():
            raise
        log.warning("gpu_samples_flush_failed n=%d error=%r", len(taken), exc)
        return 0
    return len(taken)


def job_usage(conn: apsw.Connection, job_id: int, index: int | None, now: float) -> dict:
    """`GET /v1/jobs/{id}/gpus`: each running task's worker and GPUs with the newest sample of each
    (taken since the task started), and its age in seconds; `truncated` past MAX_TASK_GPUS rows."""
    found = rows(conn, "job_gpu_usage", job_id=job_id, index=index, n=MAX_TASK_GPUS + 1)
    tasks: dict[int, dict] = {}
    for r in found[:MAX_TASK_GPUS]:
        task = tasks.setdefault(
            r["task_id"],
            {
                "task_id": r["task_id"],
                "index": r["index"],
                "attempt": r["attempt"],
                "worker_id": r["worker_id"],
                "worker_name": r["worker_name"],
                "gpus": [],
            },
        )
        if r["gpu_index"] is None:
            continue
        at = r["at"]
        task["gpus"].append(
            {
                "index": r["gpu_index"],
                "uuid": r["uuid"],
                "at": at,
                "age_s": None if at is None else round(max(0.0, now - at), 3),
                "utilization_pct": r["utilization_pct"],
                "memory_used_mb": r["memory_used_mb"],
                "memory_total_mb": r["memory_total_mb"],
            }
        )
    return {"tasks": list(tasks.values()), "truncated": len(found) > MAX_TASK_GPUS}
