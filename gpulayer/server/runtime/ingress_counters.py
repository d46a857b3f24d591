"""Requests and bytes through the services' ingress, counted in memory on the relay's loop for /metrics."""
from __future__ import annotations

from collections import Counter


class Counters:
    """Requests (by job and status class) and bytes each way (by job) through the ingress, kept on the loop;
    GET /metrics reads a copy (`stats()`)."""

    def __init__(self) -> None:
        self.requests: Counter[tuple[int, str]] = Counter()
        self.bytes_in: Counter[int] = Counter()  # towards the replicas
        self.bytes_out: Counter[int] = Counter()  # from the replicas
        self.retries: Counter[int] = Counter()
        # Requests in flight per replica (task id), kept by the proxy: upkeep reads them for a drain
        # (scheduler/service_drain.py) and the autoscaler's load (copies: `in_flight()`).
        self.outstanding: Counter[int] = Counter()
        # Replicas draining (task ids): the proxy sends them nothing new, before its cached set knows it.
        self.draining: frozenset[int] = frozenset()
        # Requests held per service (job id) while a service at zero starts a replica (the autoscaler's load).
        self.held: Counter[int] = Counter()
        # Moves when a worker reported a replica's endpoint (a heartbeat that wrote): the proxy reads a cached set
        # of replicas again then, so a replica that just became ready takes requests at once, not after CACHE_S.
        self.endpoints_seen = 0
        # Requests the cold start answered 503 (a full queue, a timeout), by job and code, for /metrics.
        self.cold_refused: Counter[tuple[int, str]] = Counter()

    def in_flight(self) -> dict[int, int]:
        """A copy of the requests in flight per replica (task id), safe to read off the proxy's loop."""
        return _copy(self.outstanding)

    def held_now(self) -> dict[int, int]:
        """A copy of the requests held per service (job id) for a cold start, safe to read off the proxy's loop."""
        return _copy(self.held)

    def stats(self) -> dict:
        return {"requests": dict(self.requests), "bytes_in": dict(self.bytes_in), "bytes_out": dict(self.bytes_out),
                "retries": dict(self.retries), "held": self.held_now(), "cold_refused": dict(self.cold_refused)}


def _copy(counts: Counter[int]) -> dict[int, int]:
    while True:
        try:
            return dict(counts)
        except RuntimeError:  # the loop changed it during the copy: again
            continue
