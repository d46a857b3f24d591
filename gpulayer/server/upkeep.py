"""Upkeep: the control plane's periodic jobs, each named, timed and failing alone.

The plane's upkeep is a table of `Job(name, every_s, run)` (server/process.py
`upkeep_jobs`). Each tick runs, in the table's order, the jobs that are due;
a job that raises is logged by name (`upkeep_job_failed job=...`) and
counted, and the jobs after it still run (river's small named services). Its
runs, failures and last duration are on /metrics (`gpulayer_upkeep_*`).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("gpulayer.server.upkeep")


@dataclass(frozen=True)
class Job:
    """One upkeep job: `run()` every `every_s` seconds (0: every tick), the first time `first_s` after start.

    `run` may return False to be due again at the next tick (a backlog it works through in rounds).
    """

    name: str
    every_s: float
    run: Callable[[], object]
    first_s: float = 0.0


@dataclass
class JobStats:
    """What /metrics shows of one job."""

    runs: int = 0
    failures: int = 0
    last_duration_s: float = 0.0


class Stats:
    """Every job's counts, by name, in the table's order; written by the upkeep thread, read by a scrape."""

    def __init__(self) -> None:
        self._jobs: dict[str, JobStats] = {}
        self._lock = threading.Lock()

    def record(self, name: str, duration_s: float, failed: bool) -> None:
        with self._lock:
            job = self._jobs.setdefault(name, JobStats())
            job.runs += 1
            job.failures += failed
            job.last_duration_s = duration_s

    def snapshot(self) -> dict[str, JobStats]:
        """{name: a copy of its counts}."""
        with self._lock:
            return {name: JobStats(s.runs, s.failures, s.last_duration_s) for name, s in self._jobs.items()}


class Upkeep:
    """Runs a table of jobs on a monotonic clock (injected: tests pin it)."""

    def __init__(self, jobs: list[Job], stats: Stats, *, clock: Callable[[], float] = time.monotonic,
                 stopping: Callable[[], bool] = lambda: False):
        """`stopping`: true once the plane stops; a failure then (the state file closing) is not logged."""
        self.jobs = jobs
        self.stats = stats
        self.clock = clock
        self.stopping = stopping
        now = clock()
        self.due = {job.name: now + job.first_s for job in jobs}

    def tick(self) -> None:
        """Run every due job once, in order; one that raises is logged and counted, the others still run."""
        for job in self.jobs:
            started = self.clock()
            if started < self.due[job.name]:
                continue
            self.due[job.name] = started + job.every_s
            failed = False
            try:
                if job.run() is False:
                    self.due[job.name] = started
            except Exception:  # noqa: BLE001 - one job's failure must not stop the others
                if self.stopping():
                    return
                failed = True
                log.exception("upkeep_job_failed job=%s", job.name)
            self.stats.record(job.name, self.clock() - started, failed)

    def run(self, stop: threading.Event, interval_s: float) -> None:
        """Tick every `interval_s` seconds until `stop` is set."""
        while not stop.wait(interval_s):
            self.tick()
