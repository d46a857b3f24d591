"""GPU telemetry (issue 28 part 4): per-GPU utilization and memory from heartbeats, kept off the write path.

A heartbeat's `gpu_samples` (the agent's mean utilization and peak memory of
each GPU over one heartbeat interval) are kept here in memory, as lease
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
import threading

import apsw

from gpulayer.server.store.queries import QUERIES, rows

log = logging.getLogger("gpulayer.server.scheduler.gpu_samples")
MAX_BUFFERED = 200_000  # samples held between two flushes at most (~40k a tick: 10k workers x 8 GPUs / 2 s)
MAX_TASK_GPUS = 4096  # rows of a `job_usage` answer at most (running tasks x their GPUs)

#: One sample as buffered and written: worker id, GPU index, at, utilization %, memory used MiB, total MiB.
Sample = tuple[int, int, float, float | None, int | None, int | None]


class Buffer:
    """Samples heartbeats brought, not yet in SQL."""

    def __init__(self, limit: int = MAX_BUFFERED) -> None:
        self._lock = threading.Lock()
        self._rows: list[Sample] = []
        self.limit = limit
        self.dropped = 0  # over the limit since the start

    def add(self, worker_id: int, samples: list[dict], now: float) -> None:
        """A heartbeat's checked samples (wire.gpu_samples); an `at` ahead of the server's clock is taken as now."""
        if not samples:
            return
        new = [(worker_id, s["index"], min(s["at"], now), s["utilization_pct"], s["memory_used_mb"], s["memory_total_mb"]) for s in samples]
        with self._lock:
            self._rows.extend(new)
            self._trim()

    def take(self) -> list[Sample]:
        """What a flush writes: every sample so far (the buffer is empty after)."""
        with self._lock:
            taken, self._rows = self._rows, []
            return taken

    def put_back(self, taken: list[Sample]) -> None:
        """A flush of `taken` failed: they go first in the next one."""
        with self._lock:
            self._rows[:0] = taken
            self._trim()

    def _trim(self) -> None:
        over = len(self._rows) - self.limit
        if over > 0:
            del self._rows[:over]
            self.dropped += over
            log.warning("gpu_samples_dropped n=%d buffered=%d", over, len(self._rows))

    def __len__(self) -> int:
        with self._lock:
            return len(self._rows)


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
