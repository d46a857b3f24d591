"""The autoscaler's memory: each autoscaled service's recent samples of its requests in flight through the
ingress (held ones included), one per upkeep tick, and since when they are comparable (the last decision).

A decision reads a window of them (scheduler/autoscale.py `decide`): over target for all of `up_after_s`,
under for all of `down_after_s`. Lost with the process: a restarted control plane waits a full window again
before it changes a service (never sooner).
"""
from __future__ import annotations

from collections import deque


class Windows:
    """Samples (time, requests in flight) per service (job id), since that service's last decision."""

    def __init__(self) -> None:
        self._samples: dict[int, deque[tuple[float, int]]] = {}
        self._since: dict[int, float] = {}

    def add(self, job_id: int, now: float, in_flight: int, keep_s: float) -> None:
        """One sample; those older than `keep_s` (the longest window the service reads) go."""
        samples = self._samples.setdefault(job_id, deque())
        self._since.setdefault(job_id, now)
        samples.append((now, in_flight))
        while samples and samples[0][0] < now - keep_s - 1.0:
            samples.popleft()

    def window(self, job_id: int, now: float, span_s: float) -> list[int] | None:
        """The samples of the last `span_s` seconds, or None when fewer than that have passed since the
        service's first sample or last decision (a window not yet full decides nothing)."""
        since = self._since.get(job_id)
        if since is None or now - since < span_s:
            return None
        return [n for at, n in self._samples.get(job_id, ()) if at >= now - span_s]

    def reset(self, job_id: int, now: float) -> None:
        """A decision was made: the next one waits a full window of samples taken after it."""
        self._samples.pop(job_id, None)
        self._since[job_id] = now

    def keep(self, job_ids: set[int]) -> None:
        """Forget the services that no longer autoscale (ended)."""
        for job_id in set(self._samples) - job_ids:
            del self._samples[job_id]
        for job_id in set(self._since) - job_ids:
            del self._since[job_id]
