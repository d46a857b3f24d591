"""Upkeep: the control plane's periodic jobs, each named, timed and failing alone.

The plane's upkeep is a table of `Job(name, every_s, run)` (server/process.py
`upkeep_jobs`). Each tick runs, in the table's order, the jobs that are due;
a job that raises is logged by name (`upkeep_job_failed job=...`) and
counted, and the jobs after it still run (river's small named services). Its
runs, failures and last duration are on /metrics (`gpulayer_upkeep_*`).
A job may also name a deadline (`due_in`: a rollout's new replica not ready
by then turns it around); that job alone runs at it, between two ticks.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("gpulayer.server.upkeep")

#: A tick for a job's deadline comes this long after it (a clock read a hair early sees it not yet past).
DEADLINE_MARGIN_S = 0.002


@dataclass(frozen=True)
class Job:
    """One upkeep job: `run()` every `every_s` seconds (0: every tick), the first time `first_s` after start.

    `run` may return False to be due again at the next tick (a backlog it works through in rounds). `due_in`
    (for a job run every tick) says when the job has a deadline before the next tick: seconds from now, 0 when
    it is past (the run just made dealt with it), None for none; the next tick then comes at that deadline.
    """

    name: str
    every_s: float
    run: Callable[[], object]
    first_s: float = 0.0
    due_in: Callable[[], float | None] | None = None


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

    def tick(self, only: frozenset[str] | None = None) -> None:
        """Run every due job once, in order (`only`: just those named, a deadline's tick); one that raises is
        logged and counted, the others still run."""
        for job in self.jobs:
            if only is not None and job.name not in only:
                continue
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

    def next_wait(self, next_tick: float) -> tuple[float, frozenset[str] | None]:
        """Seconds to wait, and for what: the tick due at `next_tick` (None: every job), or sooner the jobs whose
        `due_in` deadline comes first (just past it; those alone run then, at once, and the tick keeps its
        time). A deadline already past does not shorten the wait: the run that ran dealt with it (never a spin)."""
        wait, early = max(0.0, next_tick - self.clock()), None
        for job in self.jobs:
            due = job.due_in() if job.due_in is not None else None
            if due is not None and due > 0 and due + DEADLINE_MARGIN_S < wait:
                wait, early = due + DEADLINE_MARGIN_S, frozenset({job.name})
        return wait, early

    def run(self, stop: threading.Event, interval_s: float) -> None:
        """Tick every `interval_s` seconds, and run a job at its deadline in between (`next_wait`), until `stop`
        is set."""
        next_tick = self.clock() + interval_s
        while True:
            wait, early = self.next_wait(next_tick)
            if stop.wait(wait):
                return
            self.tick(early)
            if early is None:  # the next tick `interval_s` after this one's end, as ever
                next_tick = self.clock() + interval_s
