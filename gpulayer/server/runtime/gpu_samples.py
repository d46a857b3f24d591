"""GPU samples heartbeats brought, buffered in memory off the write path until upkeep writes them.

A flush (scheduler/gpu_samples.py's `flush`, in the renewals' transaction at each upkeep tick) takes them all;
one that fails puts them back; past `MAX_BUFFERED` (upkeep stalled for long) the oldest drop, with a log line.
A control plane killed loses at most one tick of them.
"""
from __future__ import annotations

import logging
import threading

log = logging.getLogger("gpulayer.server.scheduler.gpu_samples")  # the name its lines have always had
MAX_BUFFERED = 200_000  # samples held between two flushes at most (~40k a tick: 10k workers x 8 GPUs / 2 s)

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
