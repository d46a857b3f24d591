"""Which workers the relay waits on, and the relay's counters: in memory, for heartbeats, acquires and /metrics."""
from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable


class Wants:
    """Which workers the relay waits on (a client's stream asked for their link): a heartbeat answer and a
    parked acquire's early answer tell them `relay: true`. Thread-safe. Also the relay's counters, which
    GET /metrics reads (`stats()`): streams open by kind, bytes each way by kind, refusals by code, links."""

    def __init__(self, wake: Callable[[], None]):
        self._wake = wake
        self._lock = threading.Lock()
        self._count: dict[int, int] = {}
        self.open: Counter[str] = Counter()
        self.bytes_in: Counter[str] = Counter()
        self.bytes_out: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self.links = 0

    def stats(self) -> dict:
        """A copy of the counters (any thread)."""
        return {
            "open": dict(self.open),
            "bytes_in": dict(self.bytes_in),
            "bytes_out": dict(self.bytes_out),
            "refused": dict(self.refused),
            "links": self.links,
        }

    def want(self, worker_id: int) -> None:
        """One more waiter for `worker_id`'s link; parked acquires wake up to answer it now."""
        with self._lock:
            self._count[worker_id] = self._count.get(worker_id, 0) + 1
        self._wake()

    def done(self, worker_id: int) -> None:
        with self._lock:
            left = self._count.get(worker_id, 0) - 1
            if left > 0:
                self._count[worker_id] = left
            else:
                self._count.pop(worker_id, None)

    def wanted(self, worker_id: int) -> bool:
        """Whether the relay waits for this worker's link now."""
        return worker_id in self._count
