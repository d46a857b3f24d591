#!/usr/bin/env python3
"""Issue 38, point 4: a time-compressed trace replayed through a real control plane, against its offline simulation.

The trace is scripts/tracegen.py's (Philly's runtime shape, 4 to 32 GPUs, time limits 1.5-3x the runtimes,
offered load 1.4x). A real control plane (`gpulayer server start`, gpulayer.testing, a temporary home) and
`--workers` real worker processes (`gpulayer worker start --gpus 8`: the count is given, so no GPU is probed;
`--sandbox none` unless told, `--parallel 2`) run it: each job is `sleep <its runtime>` with
`timeout_seconds` = its time limit, submitted through the Python client at its arrival time (a timer thread
sleeps until each arrival and hands the submit to a small thread pool, so the bench uses no CPU between
submits); 16- and 32-GPU jobs are gangs (`nodes` 2 and 4, 8 GPUs each). Once every job has ended, what
happened is read from the state file with SQL: a job starts when its tasks of the last attempt are assigned
(its GPUs are taken from then) and ends when the last of them finishes. Its estimate at submit is the
submit answer's `estimated_start_at`, or, since the control plane forecasts on a thread of its own and a job
submitted since the last forecast reads null, the first non-null one it carries while queued (a watcher
lists the queued jobs every second; it stops at once against a server whose Job has no such field, and the
estimates then read "n/a").

GPUlayer's outcome and tracesim's FIFO, greedy and EASY of the same trace are measured by the same code
(tracesim.summary): GPU utilisation over the makespan (the trace's GPU-seconds over capacity x makespan),
mean job completion time, mean and worst wait of the largest jobs, and the estimates' median absolute error
over the jobs that waited >= 2 s; then GPUlayer against EASY next to issue 38's targets. Times are replay
seconds from the moment the first arrival is due.

    python3 scripts/bench_trace.py                    # 120 jobs, seed 38, 8 workers: about 7 minutes
    python3 scripts/bench_trace.py --jobs 40 --compression 1200 --json
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import sqlite3
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
import tracegen  # noqa: E402
import tracesim  # noqa: E402
from tracegen import GPUS_PER_WORKER, TraceJob  # noqa: E402

# Issue 38's targets: (measure, label, bound, "max" when GPUlayer / EASY must be at most the bound).
TARGETS = (("largest_worst_wait_s", "worst wait of the largest jobs vs EASY", 1.1, "max"),
           ("utilisation", "GPU utilisation vs EASY", 0.97, "min"),
           ("mean_jct_s", "mean job completion time vs EASY", 1.05, "max"))
ESTIMATE_TARGET = 0.35   # median |estimate - start| / wait, jobs that waited >= tracesim.MIN_WAIT
STATE_SQL = """
SELECT j.id, j.state, j.created_at, j.finished_at,
       min(t.assigned_at), min(t.started_at), max(t.finished_at), count(t.id),
       group_concat(t.worker_id), sum(json_array_length(t.gpu_indices)), group_concat(t.outcome)
FROM jobs j LEFT JOIN tasks t ON t.job_id = j.id AND t.attempt = j.attempt
GROUP BY j.id ORDER BY j.id
"""


TASKS_SQL = """
SELECT t.worker_id, json_array_length(t.gpu_indices), t.assigned_at, coalesce(t.finished_at, 1e18)
FROM tasks t JOIN jobs j ON j.id = t.job_id AND t.attempt = j.attempt
WHERE t.assigned_at IS NOT NULL AND t.worker_id IS NOT NULL
"""


@dataclass
class Submitted:
    """What the bench knows of one trace job after its submit (Unix times)."""

    trace_id: int
    job_id: int | None = None
    sent_at: float = 0.0
    answered_at: float = 0.0
    estimate: float | None = None
    estimated_at: float | None = None   # when the bench read the estimate
    error: str | None = None


@dataclass
class Record:
    """One job as the state file tells it (Unix times; None where it never happened)."""

    job_id: int
    state: str
    created_at: float
    finished_at: float | None
    assigned_at: float | None
    started_at: float | None
    ended_at: float | None
    tasks: int
    workers: list[int] = field(default_factory=list)
    gpus: int = 0
    outcomes: list[str] = field(default_factory=list)


def job_spec(job: TraceJob, per_worker: int = GPUS_PER_WORKER) -> dict:
    """The JobSpec of a trace job: `sleep RUNTIME`, its limit; a job over one worker's GPUs is a gang of whole workers."""
    spec: dict = {"name": f"trace-{job.id}", "command": ["sleep", f"{job.runtime:g}"],
                  "timeout_seconds": job.limit}
    if job.gpus > per_worker:
        spec.update(gpus=per_worker, nodes=job.gpus // per_worker)
    else:
        spec["gpus"] = job.gpus
    return spec


def read_records(state: Path) -> dict[int, Record]:
    """Every job of the state file (read-only), by job id."""
    conn = sqlite3.connect(f"file:{state}?mode=ro", uri=True, timeout=30)
    try:
        rows = conn.execute(STATE_SQL).fetchall()
    finally:
        conn.close()
    return {r[0]: Record(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7],
                         [int(w) for w in (r[8] or "").split(",") if w], int(r[9] or 0),
                         (r[10] or "").split(",") if r[10] else []) for r in rows}


def read_tasks(state: Path) -> list[tuple[int, int, float, float]]:
    """(worker, GPUs, assigned at, finished at) of every task of each job's last attempt (read-only)."""
    conn = sqlite3.connect(f"file:{state}?mode=ro", uri=True, timeout=30)
    try:
        return conn.execute(TASKS_SQL).fetchall()
    finally:
        conn.close()


def fit_misses(tasks: Sequence[tuple[int, int, float, float]], per_worker: int = GPUS_PER_WORKER) -> dict:
    """How often a task of less than a worker's GPUs went to an idle worker while a busy one had room for it.

    The simulation places such a task on the worker with the fewest free GPUs that fit (best fit), which
    keeps whole workers free for gangs; each miss is a worker a gang can no longer take.
    """
    small = misses = 0
    for worker, gpus, at, _ in tasks:
        if gpus >= per_worker:
            continue
        used: dict[int, int] = {}
        for other, g, start, end in tasks:
            if start < at < end or (start == at and other != worker):
                used[other] = used.get(other, 0) + g
        small += 1
        if not used.get(worker) and any(0 < u <= per_worker - gpus for u in used.values()):
            misses += 1
    return {"small_tasks": small, "to_an_idle_worker_while_a_busy_one_fit": misses}


def outcome_of(jobs: Sequence[TraceJob], sent: dict[int, Submitted], records: dict[int, Record],
               t0: float) -> tuple[tracesim.Outcome, list[str]]:
    """The run as a tracesim Outcome (replay seconds from `t0`), and what is wrong with it (jobs that did not run).

    A job that never started or ended is left out of the outcome and named in the problems.
    """
    starts: dict[int, float] = {}
    ends: dict[int, float] = {}
    estimates: dict[int, float | None] = {}
    problems = []
    for job in jobs:
        mine = sent.get(job.id)
        record = records.get(mine.job_id) if mine and mine.job_id is not None else None
        if record is None:
            problems.append(f"trace job {job.id}: not submitted ({mine.error if mine else 'no submit'})")
            continue
        if record.state != "succeeded":
            how = f" ({', '.join(record.outcomes)})" if record.outcomes else ""
            problems.append(f"trace job {job.id} (job {record.job_id}): {record.state}{how}")
        if record.assigned_at is None or record.ended_at is None:
            continue
        starts[job.id] = record.assigned_at - t0
        ends[job.id] = record.ended_at - t0
        estimates[job.id] = None if mine is None or mine.estimate is None else mine.estimate - t0
    return tracesim.Outcome("gpulayer", starts, ends, estimates, {}), problems


def overheads(jobs: Sequence[TraceJob], sent: dict[int, Submitted], records: dict[int, Record], t0: float) -> dict:
    """Submit lag (created - due), assignment to process start, the run's extra time over its sleep, and the
    time from a job's creation to its first estimate read, in s."""
    lag, launch, extra, told = [], [], [], []
    for job in jobs:
        mine = sent.get(job.id)
        record = records.get(mine.job_id) if mine and mine.job_id is not None else None
        if record is None:
            continue
        lag.append(record.created_at - t0 - job.arrival)
        if mine is not None and mine.estimated_at is not None:
            told.append(mine.estimated_at - record.created_at)
        if record.assigned_at is not None and record.started_at is not None:
            launch.append(record.started_at - record.assigned_at)
        if record.assigned_at is not None and record.ended_at is not None:
            extra.append(record.ended_at - record.assigned_at - job.runtime)

    def stats(values: list[float]) -> dict:
        return {"mean_s": sum(values) / len(values), "p50_s": benchlib.percentile(values, 50),
                "max_s": max(values)} if values else {"mean_s": None, "p50_s": None, "max_s": None}
    return {"submit_lag": stats(lag), "assigned_to_started": stats(launch), "run_over_sleep": stats(extra),
            "created_to_estimate": stats(told)}


def against_easy(real: dict, easy: dict) -> list[dict]:
    """GPUlayer's measures as multiples of EASY's, each with its target and whether it is met."""
    out = []
    for key, label, bound, sense in TARGETS:
        ratio = real[key] / easy[key] if easy[key] else None   # EASY's 0 (no wait): no ratio to judge
        met = None if ratio is None else ratio <= bound if sense == "max" else ratio >= bound
        out.append({"measure": key, "label": label, "gpulayer": real[key], "easy": easy[key], "ratio": ratio,
                    "target": f"{'<=' if sense == 'max' else '>='} {bound}x", "met": met})
    error = real["estimate_median_error"]
    out.append({"measure": "estimate_median_error", "label": "estimates: median |error| / wait, waited >= 2 s",
                "gpulayer": error, "easy": easy["estimate_median_error"], "ratio": None,
                "target": f"<= {ESTIMATE_TARGET:.0%}", "met": None if error is None else error <= ESTIMATE_TARGET})
    return out


def table(rows: list[dict]) -> str:
    """The summaries side by side (GPUlayer first, then the simulations); "n/a" where there is no estimate."""
    return tracesim.table(rows, missing="n/a")


def _seconds(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f} s"


def verdicts(rows: list[dict]) -> str:
    """One line per target: GPUlayer / EASY, the target, met or missed."""
    lines = []
    for r in rows:
        if r["measure"] == "estimate_median_error":
            figure = tracesim.percent(r["gpulayer"], "n/a")
        elif r["ratio"] is None:
            figure = f"- ({r['gpulayer']:.3g} vs {r['easy']:.3g})"
        else:
            figure = f"x{r['ratio']:.2f} ({r['gpulayer']:.3g} vs {r['easy']:.3g})"
        state = "n/a" if r["met"] is None else "met" if r["met"] else "MISSED"
        lines.append(f"  {r['label']:<52} {figure:<28} target {r['target']:<8} {state}")
    return "\n".join(lines)


class Replayer:
    """Submits a trace's jobs at their arrival times (offset from `t0`) from a small thread pool."""

    def __init__(self, plane: benchlib.ControlPlaneProcess, jobs: Sequence[TraceJob], threads: int = 4):
        self.plane, self.jobs, self.threads = plane, sorted(jobs, key=lambda j: (j.arrival, j.id)), threads
        self.sent: dict[int, Submitted] = {}
        self._local = threading.local()

    def _client(self):
        if not hasattr(self._local, "client"):
            self._local.client = self.plane.client()
        return self._local.client

    def _submit(self, job: TraceJob) -> None:
        mine = self.sent[job.id]
        mine.sent_at = time.time()
        try:
            data = self._client().submit(job_spec(job)).data
            mine.job_id = int(data["id"])
            mine.estimate = data.get("estimated_start_at")
            mine.estimated_at = None if mine.estimate is None else time.time()
        except Exception as exc:  # noqa: BLE001 - recorded and reported as a job that did not run
            mine.error = f"{type(exc).__name__}: {exc}"
        mine.answered_at = time.time()

    def run(self, t0: float) -> None:
        """Submit every job at t0 + its arrival; returns once every submit has been answered."""
        with concurrent.futures.ThreadPoolExecutor(self.threads, thread_name_prefix="submit") as pool:
            futures = []
            for job in self.jobs:
                self.sent[job.id] = Submitted(job.id)
                delay = t0 + job.arrival - time.time()
                if delay > 0:
                    time.sleep(delay)
                futures.append(pool.submit(self._submit, job))
            concurrent.futures.wait(futures)


class EstimateWatcher(threading.Thread):
    """The first estimate each queued job carries: GET /v1/jobs?state=queued every `interval` s, until stopped.

    Stops polling at once when the server's Jobs have no `estimated_start_at` (a server without estimates).
    """

    def __init__(self, plane: benchlib.ControlPlaneProcess, interval: float = 1.0):
        super().__init__(name="estimates", daemon=True)
        self.plane, self.interval = plane, interval
        self.first: dict[int, tuple[float, float]] = {}   # job id -> (estimate, when it was read)
        self.done = threading.Event()

    def run(self) -> None:
        client = self.plane.client()
        while not self.done.wait(self.interval):
            try:
                listed = client.jobs(state="queued", limit=1000)
            except Exception:  # noqa: BLE001 - a busy server: the next poll reads the same estimates
                continue
            if listed and "estimated_start_at" not in listed[0]:
                return
            now = time.time()
            for job in listed:
                if job["estimated_start_at"] is not None and job["id"] not in self.first:
                    self.first[job["id"]] = (float(job["estimated_start_at"]), now)

    def fill(self, sent: dict[int, Submitted]) -> None:
        """Give each submitted job whose submit answer had no estimate the first one watched."""
        for mine in sent.values():
            if mine.estimate is None and mine.job_id in self.first:
                mine.estimate, mine.estimated_at = self.first[mine.job_id]


def wait_all_ended(state: Path, count: int, timeout: float, interval: float = 2.0) -> int:
    """Poll the state file (read-only, every `interval` s) until `count` jobs have ended; how many have."""
    deadline = time.monotonic() + timeout
    ended = 0
    while time.monotonic() < deadline:
        conn = sqlite3.connect(f"file:{state}?mode=ro", uri=True, timeout=30)
        try:
            ended = conn.execute("SELECT count(*) FROM jobs WHERE finished_at IS NOT NULL").fetchone()[0]
        finally:
            conn.close()
        if ended >= count:
            break
        time.sleep(interval)
    return ended


def replay(args: argparse.Namespace, jobs: list[TraceJob]) -> dict:
    """Run the trace through a real control plane and workers; the raw facts of the run."""
    plane = benchlib.Server()
    plane._temporary = not args.keep  # the temporary home, state file and logs: removed by close() unless --keep
    with plane:
        for i in range(args.workers):
            plane.start_worker(f"gpu-{i + 1:02d}", wait=False, gpus=GPUS_PER_WORKER, parallel=args.parallel,
                               cpus=64, args=["--ram-mb", str(1 << 20), "--sandbox", args.sandbox])
        plane.wait_workers_online(args.workers, timeout=180)
        server_pid = plane.pid
        assert server_pid is not None
        cpu_before = benchlib.cpu_seconds(server_pid)
        bench_before = os.times()
        replayer, watcher = Replayer(plane, jobs), EstimateWatcher(plane)
        watcher.start()
        t0 = time.time() + 1.0
        replayer.run(t0)
        budget = max(j.arrival + j.limit for j in jobs) * 3 + 300
        ended = wait_all_ended(plane.state, len(jobs), budget)
        watcher.done.set()
        watcher.join(30)
        watcher.fill(replayer.sent)
        wall = time.time() - t0
        records = read_records(plane.state)
        placements = fit_misses(read_tasks(plane.state))
        bench_after = os.times()
        server_cpu = benchlib.cpu_seconds(server_pid) - cpu_before
        if args.keep:
            print(f"kept: {plane.root}", file=sys.stderr)
    bench_cpu = (bench_after.user + bench_after.system) - (bench_before.user + bench_before.system)
    return {"t0": t0, "sent": replayer.sent, "records": records, "ended": ended, "wall_s": wall,
            "server_cpu_s": server_cpu, "bench_cpu_s": bench_cpu,
            "placements": placements}


def last_to_end(jobs: Sequence[TraceJob], outcome: tracesim.Outcome, count: int = 3) -> list[dict]:
    """The `count` jobs that ended last (the makespan's tail): trace id, GPUs, arrival, start, end (replay s)."""
    by_id = {j.id: j for j in jobs}
    last = sorted(outcome.ends, key=lambda i: (outcome.ends[i], i))[-count:]
    return [{"id": i, "gpus": by_id[i].gpus, "arrival": by_id[i].arrival, "start": round(outcome.starts[i], 1),
             "end": round(outcome.ends[i], 1)} for i in last]


def run(args: argparse.Namespace) -> dict:
    """The whole bench: the replay, the three simulations, the comparison."""
    jobs = tracegen.from_arguments(args)
    info = benchlib.machine()
    raw = replay(args, jobs)
    outcome, problems = outcome_of(jobs, raw["sent"], raw["records"], raw["t0"])
    ran = [j for j in jobs if j.id in outcome.starts]
    rows = [tracesim.summary(ran, outcome, args.workers)] if ran else []
    simulated = {p: tracesim.simulate(jobs, args.workers, p) for p in tracesim.POLICIES}
    sims = [tracesim.summary(jobs, simulated[p], args.workers) for p in tracesim.POLICIES]
    easy = next(r for r in sims if r["policy"] == "easy")
    tails = {"gpulayer": last_to_end(jobs, outcome), "easy": last_to_end(jobs, simulated["easy"])}
    estimates = sum(1 for v in outcome.estimates.values() if v is not None)
    waited = [j.id for j in ran if outcome.starts[j.id] - j.arrival >= tracesim.MIN_WAIT]
    unestimated = sum(1 for i in waited if outcome.estimates.get(i) is None)
    return {
        "machine": {**info, "loadavg_at_end": os.getloadavg()[0]},
        "trace": {"jobs": len(jobs), "workers": args.workers, "seed": args.seed, "load": args.load,
                  "compression": args.compression, "sizes": {g: sum(1 for j in jobs if j.gpus == g)
                                                             for g in sorted({j.gpus for j in jobs})},
                  "offered_load": tracegen.offered_load(jobs, args.workers)},
        "run": {"wall_s": raw["wall_s"], "ended": raw["ended"], "server_cpu_s": raw["server_cpu_s"],
                "bench_cpu_s": raw["bench_cpu_s"], "estimates_given": estimates, "problems": problems,
                "waited_without_estimate": unestimated,
                "placements": raw["placements"],
                **overheads(jobs, raw["sent"], raw["records"], raw["t0"]), "last_to_end": tails},
        "rows": rows + sims,
        "against_easy": against_easy(rows[0], easy) if rows and not problems else [],
    }


def text(result: dict) -> str:
    """The human report of run()'s result."""
    trace, runinfo = result["trace"], result["run"]
    sizes = " / ".join(f"{n} x {g}" for g, n in trace["sizes"].items())
    lines = [benchlib.machine_line(result["machine"]) + f"; at end {result['machine']['loadavg_at_end']:.2f}",
             f"trace: {trace['jobs']} jobs ({sizes} GPUs), seed {trace['seed']}, offered load "
             f"{trace['offered_load']:.2f}, compression {trace['compression']:g}x; {trace['workers']} workers of "
             f"{GPUS_PER_WORKER} GPUs",
             f"replay: {runinfo['wall_s']:.0f} s wall, {runinfo['ended']} jobs ended; server CPU "
             f"{runinfo['server_cpu_s']:.1f} s, bench CPU {runinfo['bench_cpu_s']:.1f} s",
             f"estimates: {runinfo['estimates_given']} jobs had one while queued, read "
             f"{_seconds(runinfo['created_to_estimate']['mean_s'])} after submit on average; "
             f"{runinfo['waited_without_estimate']} of those that waited >= {tracesim.MIN_WAIT:g} s had none",
             "overheads (s, mean / max): submit lag {:.3f} / {:.3f}, assigned->started {:.2f} / {:.2f}, run over "
             "its sleep {:.2f} / {:.2f}".format(*(runinfo[k][m] or 0.0 for k in ("submit_lag", "assigned_to_started",
                                                                                "run_over_sleep")
                                                  for m in ("mean_s", "max_s"))),
             "placement: {to_an_idle_worker_while_a_busy_one_fit} of {small_tasks} tasks of under 8 GPUs went to an "
             "idle worker while a busy one had room (the simulation packs the busy one)".format(**runinfo["placements"]),
             "", table(result["rows"]),
             "(gpulayer's 'est. err (limits)': its own estimated_start_at at submit; n/a: none given)"]
    for who, tail in runinfo["last_to_end"].items():
        lines.append(f"last to end, {who}: " + "; ".join(
            f"job {t['id']} ({t['gpus']} GPUs) arrived {t['arrival']:.1f}, ran {t['start']:.1f}-{t['end']:.1f}"
            for t in tail))
    if runinfo["problems"]:
        lines += ["", f"{len(runinfo['problems'])} jobs did not run as traced:", *runinfo["problems"][:20]]
    if result["against_easy"]:
        lines += ["", "GPUlayer against the offline EASY of the same trace (issue 38's targets):",
                  verdicts(result["against_easy"])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    tracegen.add_arguments(parser)
    parser.add_argument("--parallel", type=int, default=2, help="tasks a worker runs at once (default 2)")
    parser.add_argument("--sandbox", choices=("none", "auto", "bwrap"), default="none",
                        help="the workers' --sandbox (default none: the bench measures placement)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary home, state file and logs")
    parser.add_argument("--json", action="store_true", help="the result as one JSON object")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.parallel < 1:
        parser.error("--workers and --parallel must be at least 1")
    try:
        tracegen.from_arguments(args)
    except ValueError as exc:
        parser.error(str(exc))
    result = run(args)
    benchlib.emit(result, args.json, text(result))
    return 1 if result["run"]["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
