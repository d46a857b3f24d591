#!/usr/bin/env python3
"""Offline discrete-event simulation of a trace (tracegen.py) on workers of 8 GPUs, under three policies.

- fifo: strict head of line: the queue's first job starts when it fits; nothing passes it.
- greedy: at each event, every queued job that fits now starts, in queue order (GPUlayer before issue 38).
- easy: EASY backfill. Jobs start in queue order while they fit; the first that does not (the head) gets a
  reservation: the earliest time its GPUs free up, computed from the running jobs' time limits (start +
  limit, not their real ends), and the worker(s) and GPUs it would take then. A later job starts now only
  if it fits now and either ends, by its time limit, no later than the reservation, or leaves the reserved
  GPUs free at that time (the reserved workers' GPUs free at the reservation, less those of jobs started
  in front of it that outlive it, must still cover the head's need).

Placement is the same for all three: a job of at most one worker's GPUs takes the worker with the fewest
free GPUs that fit it (ties: the lowest index); a bigger job is a gang of whole workers and takes the
lowest-indexed workers with all their GPUs free. At one instant, ends are applied before arrivals, and
arrivals before the scheduling pass. A reservation takes, among the workers that fit the head at its
time, the ones with the fewest GPUs free now (so idle workers stay open to backfill).

Start-time estimates: when a job arrives, the simulation is copied and replayed forward under the same
policy with no further arrivals, every running job ending at its start + limit and every queued job
running for its limit; the job's start in that replay is its estimate (the reservation-style prediction
that `estimated_start_at` answers at submit, Slurm's `squeue --start`). A second estimate ("learned")
replays the same way but ends each job at its limit times the median runtime/limit of the jobs that had
ended by then (the limit itself before any had), while the replay's scheduler still reserves from limits,
as the real one does. A third ("conditional", what GPUlayer's forecast does) replays as "learned" but expects
each running job to last the median of its limit times those ratios that outlast what it has run so far. The
error measure is the one issue 38's bench uses: |estimate - actual start| over
the actual wait, median over the jobs that waited at least 2 s. A bench of a real control plane builds an
Outcome from what it recorded (each job's start, end and estimate at submit) and calls summary(), so the
real run and the simulation are measured by the same code.

    python3 scripts/tracesim.py --jobs 120 --workers 8 --load 1.4 --seed 38
    python3 scripts/tracesim.py --trace trace.jsonl --workers 8 --json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tracegen  # noqa: E402
from tracegen import GPUS_PER_WORKER, TraceJob  # noqa: E402

POLICIES = ("fifo", "greedy", "easy")
MIN_WAIT = 2.0          # seconds: the estimate error counts jobs that waited at least this long
Placement = tuple[tuple[int, int], ...]   # (worker, GPUs) pairs


@dataclass
class Running:
    """A started job: where it runs, when it ends, and when the scheduler expects it to."""

    job: TraceJob
    start: float
    end: float            # when it really ends (start + runtime)
    expected_end: float   # what the scheduler knows: start + limit
    placement: Placement


@dataclass
class State:
    """The simulated cluster at `now`: free GPUs per worker, the running jobs, the queue in order."""

    now: float
    free: list[int]
    per_worker: int
    running: list[Running] = field(default_factory=list)
    queue: list[TraceJob] = field(default_factory=list)
    starts: dict[int, float] = field(default_factory=dict)
    ends: dict[int, float] = field(default_factory=dict)
    # None: jobs run for their runtimes. A replay for an estimate: every job lasts its limit times this
    # (reservations are still made from start + limit).
    replay: float | None = None


@dataclass
class Outcome:
    """What a simulation recorded: each job's start and end, and its estimates at submit (empty when not asked).

    `estimates` replays with every job lasting its time limit; `learned` with every job lasting its limit
    times the median runtime/limit of the jobs that had ended by then (the limit itself before any had),
    reservations still made from limits; `conditional` as `learned`, but a running job is expected to last
    the median of its limit times those ratios that outlast what it has run so far (GPUlayer's forecast,
    scheduler/forecast.py's conditional_run_s).
    """

    policy: str
    starts: dict[int, float]
    ends: dict[int, float]
    estimates: dict[int, float | None]
    learned: dict[int, float | None]
    conditional: dict[int, float | None] = field(default_factory=dict)


def place(gpus: int, free: Sequence[int], per_worker: int, allowed: Callable[[int, int], bool] = lambda w, g: True,
          order: Sequence[int] | None = None) -> Placement | None:
    """Where a job of `gpus` GPUs goes in `free` (see the module's docstring), or None when it does not fit.

    `allowed(worker, gpus)` filters the workers; `order` ranks candidates before the worker's index.
    """
    rank = order or [0] * len(free)
    if gpus <= per_worker:
        fits = [w for w, f in enumerate(free) if f >= gpus and allowed(w, gpus)]
        if not fits:
            return None
        best = min(fits, key=lambda w: (free[w], rank[w], w))
        return ((best, gpus),)
    need = gpus // per_worker
    whole = sorted((w for w, f in enumerate(free) if f == per_worker and allowed(w, per_worker)),
                   key=lambda w: (rank[w], w))
    if len(whole) < need:
        return None
    return tuple((w, per_worker) for w in sorted(whole[:need]))


def _start(state: State, job: TraceJob, placement: Placement) -> None:
    for w, g in placement:
        state.free[w] -= g
    expected = round(state.now + job.limit, 6)
    if state.replay is None:
        end = round(state.now + job.runtime, 6)
    else:
        end = round(state.now + job.limit * state.replay, 6)
    state.running.append(Running(job, state.now, end, expected, placement))
    state.starts[job.id] = state.now
    state.queue.remove(job)


def reservation(state: State, head: TraceJob) -> tuple[float, Placement, list[int]] | None:
    """The head's reservation: (time, placement, GPUs free per worker at that time), from expected ends.

    None when the head can never fit on these workers.
    """
    projected = list(state.free)
    ends = sorted(state.running, key=lambda r: (r.expected_end, r.job.id))
    i = 0
    while i < len(ends):
        when = ends[i].expected_end
        while i < len(ends) and ends[i].expected_end == when:
            for w, g in ends[i].placement:
                projected[w] += g
            i += 1
        spot = place(head.gpus, projected, state.per_worker, order=state.free)
        if spot is not None:
            return max(when, state.now), spot, projected
    return None


def _pass_fifo(state: State) -> None:
    while state.queue:
        spot = place(state.queue[0].gpus, state.free, state.per_worker)
        if spot is None:
            break
        _start(state, state.queue[0], spot)


def _pass_greedy(state: State) -> None:
    for job in list(state.queue):
        spot = place(job.gpus, state.free, state.per_worker)
        if spot is not None:
            _start(state, job, spot)


def _pass_easy(state: State) -> None:
    _pass_fifo(state)
    if not state.queue:
        return
    held = reservation(state, state.queue[0])
    if held is None:
        return
    shadow, spot, projected = held
    need = dict(spot)
    for job in list(state.queue[1:]):
        if state.now + job.limit <= shadow:
            fit = place(job.gpus, state.free, state.per_worker)
        else:
            fit = place(job.gpus, state.free, state.per_worker,
                        allowed=lambda w, g: projected[w] - g >= need.get(w, 0))
        if fit is None:
            continue
        if state.now + job.limit > shadow:
            for w, g in fit:
                projected[w] -= g
        _start(state, job, fit)


PASSES = {"fifo": _pass_fifo, "greedy": _pass_greedy, "easy": _pass_easy}


def _end_due(state: State) -> None:
    done = [r for r in state.running if r.end <= state.now]
    for r in sorted(done, key=lambda r: (r.end, r.job.id)):
        for w, g in r.placement:
            state.free[w] += g
        state.ends[r.job.id] = r.end
        state.running.remove(r)


def estimate(state: State, policy: str, job_id: int, ratio: float = 1.0,
             ratios: Sequence[float] = ()) -> float | None:
    """The start a replay of `state` predicts for a queued job: no arrivals, every job lasting `ratio` x its limit.

    A running job that has outlived `ratio` x its limit ends at once in the replay. With `ratios` (the
    runtime/limit of the jobs ended), a running job lasts the median of its limit times those that outlast
    what it has run so far instead (ending at once when none does).

    None when the replay runs out of jobs to end before the job starts (it could never fit).
    """
    copy = State(state.now, list(state.free), state.per_worker, queue=list(state.queue), replay=ratio)
    for r in state.running:
        run = r.job.limit * ratio
        if ratios:
            longer = [x * r.job.limit for x in ratios if x * r.job.limit > state.now - r.start]
            run = statistics.median(longer) if longer else 0.0
        end = round(max(r.start + run, state.now), 6)
        copy.running.append(Running(r.job, r.start, end, r.expected_end, r.placement))
    while True:
        _end_due(copy)
        PASSES[policy](copy)
        if job_id in copy.starts:
            return copy.starts[job_id]
        if not copy.running:
            return None
        copy.now = min(r.end for r in copy.running)


def _ratios(jobs: dict[int, TraceJob], ends: dict[int, float]) -> list[float]:
    """The runtime/limit of each job that has ended."""
    return [jobs[i].runtime / jobs[i].limit for i in ends]


def simulate(jobs: Sequence[TraceJob], workers: int, policy: str, *, per_worker: int = GPUS_PER_WORKER,
             estimates: bool = True) -> Outcome:
    """Run `jobs` on `workers` workers under `policy`; with `estimates`, each job's estimate at its arrival.

    Raises ValueError for an unknown policy or a job no placement could ever run.
    """
    if policy not in PASSES:
        raise ValueError(f"unknown policy {policy!r}: one of {', '.join(POLICIES)}")
    for job in jobs:
        if place(job.gpus, [per_worker] * workers, per_worker) is None:
            raise ValueError(f"job {job.id} ({job.gpus} GPUs) fits no placement on {workers} workers of {per_worker}")
    arrivals = sorted(jobs, key=lambda j: (j.arrival, j.id))
    state = State(0.0, [per_worker] * workers, per_worker)
    guesses: dict[int, float | None] = {}
    learned: dict[int, float | None] = {}
    conditional: dict[int, float | None] = {}
    by_id = {j.id: j for j in jobs}
    i = 0
    while i < len(arrivals) or state.running:
        upcoming = arrivals[i].arrival if i < len(arrivals) else float("inf")
        state.now = min([upcoming, *(r.end for r in state.running)])
        _end_due(state)
        while i < len(arrivals) and arrivals[i].arrival <= state.now:
            state.queue.append(arrivals[i])
            if estimates:
                guesses[arrivals[i].id] = estimate(state, policy, arrivals[i].id)
                ratios = _ratios(by_id, state.ends)
                ratio = statistics.median(ratios) if ratios else 1.0
                learned[arrivals[i].id] = estimate(state, policy, arrivals[i].id, ratio)
                conditional[arrivals[i].id] = estimate(state, policy, arrivals[i].id, ratio, ratios)
            i += 1
        PASSES[policy](state)
    return Outcome(policy, dict(state.starts), dict(state.ends), guesses, learned, conditional)


def estimate_error(jobs: Sequence[TraceJob], starts: dict[int, float], guesses: dict[int, float | None]) -> float | None:
    """Median |estimate - start| / wait over the jobs that waited >= MIN_WAIT and had an estimate."""
    errors = [abs(guess - starts[j.id]) / (starts[j.id] - j.arrival) for j in jobs
              if starts[j.id] - j.arrival >= MIN_WAIT and (guess := guesses.get(j.id)) is not None]
    return statistics.median(errors) if errors else None


def summary(jobs: Sequence[TraceJob], outcome: Outcome, workers: int, per_worker: int = GPUS_PER_WORKER) -> dict:
    """The bench's measures of one outcome (times in replay seconds)."""
    makespan = max(outcome.ends.values()) - min(j.arrival for j in jobs)
    waits = {j.id: outcome.starts[j.id] - j.arrival for j in jobs}
    largest = max(j.gpus for j in jobs)
    big = [waits[j.id] for j in jobs if j.gpus == largest]
    return {
        "policy": outcome.policy,
        "utilisation": sum(j.gpus * j.runtime for j in jobs) / (workers * per_worker * makespan),
        "makespan_s": makespan,
        "mean_jct_s": statistics.fmean(outcome.ends[j.id] - j.arrival for j in jobs),
        "largest_gpus": largest,
        "largest_jobs": len(big),
        "largest_mean_wait_s": statistics.fmean(big),
        "largest_worst_wait_s": max(big),
        "waited": sum(1 for w in waits.values() if w >= MIN_WAIT),
        "estimate_median_error": estimate_error(jobs, outcome.starts, outcome.estimates),
        "learned_median_error": estimate_error(jobs, outcome.starts, outcome.learned),
        "conditional_median_error": estimate_error(jobs, outcome.starts, outcome.conditional),
    }


def percent(x: float | None, missing: str = "-") -> str:
    """A fraction as a percentage with one decimal; `missing` for None."""
    return missing if x is None else f"{100 * x:.1f}%"


def table(rows: list[dict], missing: str = "-") -> str:
    """summary() rows side by side, one line each (bench_trace.py prints its real run's row first)."""
    width = max(7, *(len(r["policy"]) for r in rows))
    lines = [f"{'policy':<{width}} {'util':>6} {'makespan':>9} {'mean JCT':>9} {'big mean wait':>14} "
             f"{'big worst wait':>15} {'waited':>7} {'est. err (limits)':>18} {'est. err (learned)':>19} "
             f"{'(conditional)':>14}"]
    for r in rows:
        lines.append(f"{r['policy']:<{width}} {r['utilisation']:>6.3f} {r['makespan_s']:>8.1f}s {r['mean_jct_s']:>8.1f}s "
                     f"{r['largest_mean_wait_s']:>13.1f}s {r['largest_worst_wait_s']:>14.1f}s {r['waited']:>7} "
                     f"{percent(r['estimate_median_error'], missing):>18} {percent(r['learned_median_error'], missing):>19} "
                     f"{percent(r.get('conditional_median_error'), missing):>14}")
    return "\n".join(lines)


RATIOS = (("utilisation", "util"), ("mean_jct_s", "mean JCT"), ("largest_worst_wait_s", "big worst wait"),
          ("largest_mean_wait_s", "big mean wait"))


def against_easy(rows: list[dict]) -> list[str]:
    """Each other policy's measures as multiples of EASY's (the issue's targets are such ratios; of medians,
    when the rows are medians)."""
    easy = next((r for r in rows if r["policy"] == "easy"), None)
    if easy is None:
        return []
    return [f"{r['policy']} / easy: " + ", ".join(f"{label} x{r[key] / easy[key]:.2f}" if easy[key] else f"{label} -"
                                                  for key, label in RATIOS)
            for r in rows if r is not easy]


def medians(runs: list[list[dict]]) -> list[dict]:
    """Per policy, the median of each measure over several traces' rows."""
    out = []
    for rows in zip(*runs):
        merged = {"policy": rows[0]["policy"], "largest_gpus": rows[0]["largest_gpus"]}
        for key in rows[0]:
            if key not in merged:
                known = [r[key] for r in rows if r[key] is not None]
                merged[key] = statistics.median(known) if known else None
        out.append(merged)
    return out


def _run(args: argparse.Namespace) -> tuple[int, list[list[dict]]]:
    runs = []
    for seed in range(args.seed, args.seed + args.seeds):
        args_seed = argparse.Namespace(**{**vars(args), "seed": seed})
        jobs = tracegen.load(args.trace.read_text()) if args.trace else tracegen.from_arguments(args_seed)
        runs.append([summary(jobs, simulate(jobs, args.workers, p), args.workers) for p in args.policy or POLICIES])
    return len(jobs), runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    tracegen.add_arguments(parser)
    parser.add_argument("--trace", type=Path, help="a trace written by tracegen.py (else one is generated)")
    parser.add_argument("--seeds", type=int, default=1, help="traces of seeds SEED.. SEED+N-1; the table shows medians")
    parser.add_argument("--policy", choices=POLICIES, action="append", help="a policy to run (default: all three)")
    parser.add_argument("--json", action="store_true", help="one JSON object per policy instead of a table")
    args = parser.parse_args(argv)
    if args.seeds < 1 or (args.trace and args.seeds > 1):
        parser.error("--seeds takes N >= 1, and only for generated traces")
    try:
        count, runs = _run(args)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    rows = medians(runs)
    if args.json:
        sys.stdout.write("".join(json.dumps(r) + "\n" for r in rows))
        return 0
    what = (str(args.trace) if args.trace else f"seed {args.seed}" if args.seeds == 1
            else f"medians over seeds {args.seed}..{args.seed + args.seeds - 1}")
    print(f"{count} jobs on {args.workers} workers of {GPUS_PER_WORKER} GPUs ({what}); 'big' = the "
          f"{rows[0]['largest_gpus']}-GPU jobs; estimate error over the jobs that waited >= {MIN_WAIT:g} s")
    print(table(rows))
    print("\n".join(against_easy(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
