"""Lease renewals noted in memory: `worker id -> when last seen`, not yet in SQL.

A heartbeat that changes nothing, and any other worker request, renews the worker's leases here, not in a
write (the facade's `seen`, worker_requests.heartbeat); upkeep writes the notes at each tick
(scheduler/renewals.py's `flush`, in Scheduler.expire's transaction) and forgets those that committed. A
restart loses at most a tick's notes: the grace after a restart (leases.grace_after_restart) covers them.
"""
from __future__ import annotations

import threading


class Renewals:
    """`worker id -> when last seen` not yet in SQL."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[int, float] = {}

    def note(self, worker_id: int, at: float) -> None:
        """The worker made a request at `at` (the scheduler's clock)."""
        with self._lock:
            if at > self._seen.get(worker_id, 0.0):
                self._seen[worker_id] = at

    def pending(self) -> dict[int, float]:
        """What a flush writes: the notes made so far."""
        with self._lock:
            return dict(self._seen)

    def flushed(self, written: dict[int, float]) -> None:
        """Those notes are in SQL (their transaction committed): forget each not renewed since."""
        with self._lock:
            for worker_id, at in written.items():
                if self._seen.get(worker_id) == at:
                    del self._seen[worker_id]

    def __len__(self) -> int:
        with self._lock:
            return len(self._seen)
