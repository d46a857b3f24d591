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

    def stats(self) -> dict:
        return {"requests": dict(self.requests), "bytes_in": dict(self.bytes_in), "bytes_out": dict(self.bytes_out), "retries": dict(self.retries)}
