"""Start-time forecasts: the placement rules replayed forward on a copy of the state file.

No second model of the scheduler: `snapshot` copies the state file from a read
connection into memory (SQLite's backup, one read transaction: the writer is
never blocked), and `replay` runs, on that copy and a virtual clock, upkeep's
plan of reservations (reservations.plan) and the real claim
(placement.acquire_many for every worker with room, gangs included, EASY backfill
as it applies it) and, at each running task's expected end, the real finish (lifecycle.finish: the task
running -> succeeded, its job's settle, the dependents and array elements that
releases). The clock then moves to the next expected end (or `--begin` time),
until every job asked about has started or the horizon passes. The copy is
thrown away; nothing of the live state changes.

A task's expected run time is its job's typical run (job_runtime_model's
`typical_s`, schema.sql: learned from history where there is some; reservations
and backfill judge by `expected_s`, the safe one). A task running now is expected
to run the median of the learned runs longer than it has run so far
(conditional_run_s); one that outlived them all is taken to end now, so an
overrun moves the estimates behind it later as the clock moves
(docs/scheduling-time.md, "Start-time estimates").
"""
from __future__ import annotations

import heapq
import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import apsw

from gpulayer.server.errors import GpulayerError
from gpulayer.server.scheduler import jobcontrol, lifecycle, placement, reservations, waiting
from gpulayer.server.store.db import _dict_row
from gpulayer.server.store.queries import QUERIES, one, row, rows

DEFAULT_HORIZON_S = 7 * 86400.0  # --estimate-horizon: a start later than this after now is not estimated
DEFAULT_MAX_JOBS = 500           # --estimate-max-jobs: the waiting jobs (best first) a forecast estimates
REPLAY_LEASE_S = 1e12            # leases in the copy never expire (no expire runs there)
STARTS_PER_JOB = 2               # a forecast replays at most this many job starts per job it estimates
FORECAST_BUDGET_S = 60.0         # a forecast (on its own thread) replays for at most this long (wall clock)
WHAT_IF_BUDGET_S = 20.0          # a what-if (an HTTP request waits for it) at most this long
MIN_SAMPLES = 3                  # runs (or limit shares) a run time is learned from at least, as job_runtime_model


@dataclass(frozen=True)
class Estimate:
    """When one job starts in the replay (`at`, Unix seconds, and its first task's `worker`), or why that
    cannot be known (`at` None, `reason` a sentence; `never` when no worker could ever run it)."""

    at: float | None
    reason: str | None = None
    worker: str | None = None
    workers: tuple[str, ...] = ()
    never: bool = False


@dataclass
class Forecast:
    """One forecast: taken at `at` (the copy's time), each estimated job's Estimate, the waiting jobs left
    out past max_jobs (`skipped`), and how long it took to compute (seconds)."""

    at: float
    estimates: dict[int, Estimate] = field(default_factory=dict)
    skipped: frozenset[int] = frozenset()
    max_jobs: int = DEFAULT_MAX_JOBS
    took_s: float = 0.0


def snapshot(conn: apsw.Connection) -> apsw.Connection:
    """An in-memory copy of the database `conn` reads, as of one read transaction (rows come back as dicts)."""
    copy = apsw.Connection(":memory:")
    with copy.backup("main", conn, "main") as backup:
        backup.step(-1)
    copy.row_trace = _dict_row
    copy.execute("PRAGMA foreign_keys=ON")
    return copy


def run_samples(row: dict) -> list[float]:
    """The run times (seconds) a running job's typical run is learned from (a forecast_run_samples row), as
    job_runtime_model learns it: its user's runs when there are at least 3 (none beyond its limit); else its
    limit times each recent run's share of its own limit (at least 3 of those); else none."""
    limit = row["limit_s"] if row["limit_s"] is not None and row["limit_s"] > 0 else None
    runs = json.loads(row["runs"] or "[]")
    if len(runs) >= MIN_SAMPLES:
        return [min(r, limit) if limit is not None else r for r in runs]
    ratios = json.loads(row["ratios"] or "[]")
    if limit is not None and len(ratios) >= MIN_SAMPLES:
        return [limit * x for x in ratios]
    return []


def conditional_run_s(elapsed: float, samples: list[float]) -> float | None:
    """How long, in all, a task that has run `elapsed` seconds is expected to run: the median of the `samples`
    longer than `elapsed` (a task still running is not one of the short ones); None when there are none (it
    outlived every sample, or nothing was learned).

    A start-time estimate is off mostly by the running tasks' ends: the unconditional typical run takes a task
    that has outlived it to end now, and one just started to end at the median, whatever it has shown so far."""
    longer = [s for s in samples if s > elapsed]
    return statistics.median(longer) if longer else None


class _Replay:
    """The replay's moving parts on one copy: the clock, the expected ends (a heap), the starts seen."""

    def __init__(self, copy: apsw.Connection, now: float):
        self.copy, self.now = copy, now
        self.durations = {r["job_id"]: r["seconds"] for r in rows(copy, "forecast_durations")}
        self.ends: list[tuple[float, int, int]] = []   # (expected end, task id, worker id)
        self.started: dict[int, tuple[float, list[str]]] = {}  # job id -> (start, its workers' names)

    def duration(self, job_id: int) -> float | None:
        if job_id not in self.durations:   # a job queued in the copy after the durations were read (what-if)
            self.durations[job_id] = one(self.copy, "forecast_durations_of", job_id=job_id)["seconds"]
        return self.durations[job_id]

    def running_now(self) -> None:
        """The expected end of every task that holds room at the copy's time: the median of the runs it was
        learned from that outlast what it has run so far (conditional_run_s), else its typical run; an overrun
        one (it outlived them all): now."""
        samples = {r["job_id"]: run_samples(r) for r in rows(self.copy, "forecast_run_samples")}
        for task in rows(self.copy, "forecast_active_tasks"):
            seconds = self.duration(task["job_id"])
            if seconds is None:
                continue
            longer = conditional_run_s(self.now - task["since"], samples.get(task["job_id"], []))
            end = task["since"] + (longer if longer is not None else seconds)
            heapq.heappush(self.ends, (max(self.now, end), task["id"], task["worker_id"]))

    def place(self, t: float, record: bool) -> None:
        """Every online worker claims what it may at `t` (the real acquire), until none takes more; each task
        assigned starts at once (the real start), and its job's start is recorded (`record`)."""
        # Upkeep's plan first, as each tick makes it (EASY backfill: the claim honours its reservations). A
        # worker's acquire claims until it finds nothing (or hands out its most); nothing a claim does at the
        # same time can make room for another, so one pass over the workers with room is enough.
        reservations.plan(self.copy, t)
        for worker in rows(self.copy, "forecast_workers"):
            while True:
                taken = placement.acquire_many(self.copy, worker["id"], t, REPLAY_LEASE_S,
                                               placement.MAX_TASKS_PER_ACQUIRE)
                self._start_assigned(t, record)  # a gang's ranks on other workers too: not handed out again
                if len(taken) < placement.MAX_TASKS_PER_ACQUIRE:
                    break

    def _start_assigned(self, t: float, record: bool) -> None:
        for task in rows(self.copy, "forecast_assigned"):
            lifecycle.start(self.copy, task["worker_id"], task["id"], None, t)
            if record:
                start = self.started.setdefault(task["job_id"], (t, []))
                if start[0] == t and task["worker"] not in start[1]:
                    start[1].append(task["worker"])
            seconds = self.duration(task["job_id"])
            if seconds is not None:
                heapq.heappush(self.ends, (t + seconds, task["id"], task["worker_id"]))

    def next_time(self) -> float | None:
        """The clock's next stop: the next expected end or begin time; None when nothing more happens."""
        begin = one(self.copy, "forecast_next_begin", now=self.now)["at"]
        ends = self.ends[0][0] if self.ends else None
        times = [x for x in (begin, ends) if x is not None]
        return min(times) if times else None

    def advance(self, t: float) -> None:
        """Move the clock to `t`: the tasks expected to end by then succeed (the real finish), the jobs whose
        begin time came are let run (the real begin_due)."""
        self.now = t
        while self.ends and self.ends[0][0] <= t:
            _, task_id, worker_id = heapq.heappop(self.ends)
            try:
                lifecycle.finish(self.copy, worker_id, task_id, 0, "succeeded", {}, None, t)
            except GpulayerError:  # ended in the copy already (a gang's attempt sent back, a cancel)
                pass
        while jobcontrol.begin_due(self.copy, t):
            pass


def replay(copy: apsw.Connection, now: float, targets: list[int], *, horizon_s: float = DEFAULT_HORIZON_S,
           max_starts: int | None = None, budget_s: float = FORECAST_BUDGET_S) -> dict[int, Estimate]:
    """Replay the placement rules forward on `copy` from `now` until every job of `targets` has started, the
    horizon passes, `max_starts` jobs have started or `budget_s` seconds (wall clock) went by; each target's
    Estimate. `copy` is changed (one transaction, never committed: roll back or drop it)."""
    run = _Replay(copy, now)
    wanted = set(targets)
    run.running_now()
    run.place(now, record=True)
    cut, spent = False, False
    until = time.monotonic() + budget_s
    while not wanted <= run.started.keys():
        t = run.next_time()
        cut = max_starts is not None and len(run.started) > max_starts
        spent = time.monotonic() > until
        if t is None or t > now + horizon_s or cut or spent:
            break
        run.advance(t)
        run.place(t, record=True)
    out = {}
    for job_id in targets:
        if job_id in run.started:
            at, names = run.started[job_id]
            out[job_id] = Estimate(at, None, names[0] if names else None, tuple(names))
        elif spent:
            out[job_id] = Estimate(None, f"not estimated: the replay ran out of its {budget_s:g} s after "
                                         f"{len(run.started)} starts ahead of it")
        elif cut:
            out[job_id] = Estimate(None, f"not estimated: more than {max_starts} waiting jobs start before it "
                                         "(--estimate-max-jobs)")
        else:
            out[job_id] = _not_started(copy, job_id, horizon_s)
    return out


def _not_started(copy: apsw.Connection, job_id: int, horizon_s: float) -> Estimate:
    """Why a job did not start in the replay, as its waiting reason would say it, at the replay's end."""
    facts = waiting.facts(copy, job_id)
    if facts and facts["why"]:
        return Estimate(None, f"no worker could ever run it: {waiting.unplaced(facts)}", never=True)
    held = waiting.held_back(row(copy, "job_quota_reason", job_id=job_id))
    if held and not (facts and facts["busy"]):
        return Estimate(None, f"it could never start: {held}", never=True)
    days = horizon_s / 86400
    span = f"{days:g} days" if days >= 1 else f"{horizon_s:g} seconds"
    return Estimate(None, f"beyond the forecast's horizon ({span}, --estimate-horizon)")


def waiting_estimates(copy: apsw.Connection, now: float, max_jobs: int = DEFAULT_MAX_JOBS, *,
                      horizon_s: float = DEFAULT_HORIZON_S) -> Forecast:
    """A Forecast of every waiting job of `copy` (at most `max_jobs` of them, best first), replayed from `now`."""
    started = time.monotonic()
    waiting_jobs = rows(copy, "forecast_waiting", job_id=None)
    chosen, skipped = waiting_jobs[:max_jobs], frozenset(j["id"] for j in waiting_jobs[max_jobs:])
    estimates = {j["id"]: known for j in chosen if (known := unknowable(j)) is not None}
    copy.execute("BEGIN")
    try:
        # A job far down the claim's order (a gang behind a stream of small jobs) would make the replay place
        # the whole queue before it: past STARTS_PER_JOB x max_jobs starts, those still waiting are not estimated.
        estimates.update(replay(copy, now, [j["id"] for j in chosen if j["id"] not in estimates],
                                horizon_s=horizon_s, max_starts=STARTS_PER_JOB * max(max_jobs, 1)))
    finally:
        copy.execute("ROLLBACK")
    return Forecast(now, estimates, skipped, max_jobs, time.monotonic() - started)


def unknowable(job: dict) -> Estimate | None:
    """The Estimate of a waiting job (a forecast_waiting row) whose start no replay can know: held, after a
    job that has not ended, being cancelled; None for the others."""
    if job["reason"] is not None:
        return Estimate(None, f"being cancelled ({job['reason']})")
    if job["hold"]:
        return Estimate(None, "held: it starts once released (`gpulayer job release`)")
    if job["after_open"]:
        return Estimate(None, f"after job {job['after_job']}, which has not ended")
    return None


def what_if(copy: apsw.Connection, submit: Callable[[apsw.Connection], int], now: float, *,
            horizon_s: float = DEFAULT_HORIZON_S, max_starts: int = DEFAULT_MAX_JOBS) -> Estimate:
    """When a job would start if `submit(copy)` queued it now (the real submit, as its caller: its errors are the
    submit's), replayed forward on `copy` with the queue as it stands (null past `max_starts` jobs started
    before it); nothing of `copy` is kept."""
    copy.execute("BEGIN")
    try:
        job_id = submit(copy)
        known = unknowable(one(copy, "forecast_waiting", job_id=job_id))
        return known if known is not None else replay(copy, now, [job_id], horizon_s=horizon_s,
                                                      max_starts=max_starts, budget_s=WHAT_IF_BUDGET_S)[job_id]
    finally:
        copy.execute("ROLLBACK")


def record(conn: apsw.Connection, made: Forecast) -> int:
    """Write `made` to the `estimates` table (the last forecast's rows replaced; on the writer); rows written."""
    conn.execute(QUERIES["forecast_clear"])
    conn.executemany(QUERIES["forecast_insert"], [
        {"job_id": job_id, "start_at": e.at, "reason": e.reason if e.at is None else None,
         "workers": json.dumps(list(e.workers)), "forecast_at": made.at} for job_id, e in made.estimates.items()])
    return len(made.estimates)
