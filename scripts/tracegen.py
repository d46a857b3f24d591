#!/usr/bin/env python3
"""A seeded trace of GPU jobs (arrival, GPUs, runtime, time limit) in the shape of Microsoft's Philly trace.

The shape comes from Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training
Workloads", USENIX ATC'19, Figure 2 ("CDF of job run times" by GPU count: 1, 2-4, 5-8 and >8 GPUs), as
the trace's publishers re-plot it from the released trace in github.com/msr-fiddle/philly-traces,
analysis/"Philly Trace Analysis.ipynb", section "Job Runtimes (Figure 2)". The curves of that plot were
read off its image (log x axis 0.1 to 10^4 minutes) at every half decade; RUNTIME_CDF holds the readings,
in percent of the bucket's jobs that ended within that many minutes. A job of 4 GPUs draws its runtime
from the "2-4 GPU" curve, a job of 8 from "5-8 GPU", a job of 16 or 32 from ">8 GPU"; between readings
the CDF is linear in log(minutes). The figure ends at 10^4 minutes (about 95% of each curve), so no job is
drawn above it.

The paper publishes no histogram of GPU counts that could be read the same way, so the size mix is a
declared choice, kept in SIZE_MIX: 4 and 8 GPUs in the 3:1 ratio of the "Philly distribution" that
Gavel's trace generator samples (Narayanan et al., OSDI'20, scheduler/utils.py, _generate_scale_factor:
P(4) = 0.15, P(8) = 0.05), and each doubling above 8 half as common as the size below it (16: 0.025,
32: 0.0125), so that 32-GPU gangs (four whole 8-GPU workers) are about one job in nineteen. Only sizes 4
to 32 are drawn (the slice of issue 38): a job of more than one worker's GPUs is a gang of whole workers.

A replay cannot span the figure's five decades (seconds to a week) on one machine in minutes, so runtimes
are drawn from the CDF conditioned on a band (default 10 to 1,000 minutes: 37%, 46% and 51% of the 2-4,
5-8 and >8 GPU jobs), then divided by `compression` (trace seconds per replay second; the default 600
makes the band 1 to 100 s). Each job's time limit is its runtime times a factor uniform in [1.5, 3]
(users overestimate). Arrivals are a Poisson process whose gaps are then scaled so that the offered load,
the trace's GPU-seconds over the capacity times the arrival window (first to last arrival), is exactly
`load`. Times are in replay seconds, rounded to 0.01 s.

    python3 scripts/tracegen.py --jobs 120 --workers 8 --load 1.4 --seed 38 > trace.jsonl
"""
from __future__ import annotations

import argparse
import bisect
import json
import math
import random
import sys
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

GPUS_PER_WORKER = 8
# Minutes at which Figure 2's curves were read (half decades from 0.1 to 10^4).
RUNTIME_MINUTES = (0.1, 0.316, 1.0, 3.16, 10.0, 31.6, 100.0, 316.0, 1000.0, 3160.0, 10000.0)
# Percent of each GPU-count bucket's jobs that ended within RUNTIME_MINUTES (Jeon et al. ATC'19, Figure 2).
RUNTIME_CDF = {
    "2-4": (0.0, 10.8, 23.5, 30.5, 37.8, 50.3, 56.7, 65.1, 74.7, 89.2, 97.0),
    "5-8": (0.0, 1.9, 7.8, 14.1, 22.1, 33.8, 43.8, 56.9, 67.7, 82.3, 94.5),
    ">8": (0.0, 2.0, 12.4, 18.9, 26.0, 37.9, 47.5, 61.4, 77.2, 91.0, 96.5),
}
# Relative frequency of each job size (GPUs); see the module's docstring for where the weights come from.
SIZE_MIX = {4: 0.15, 8: 0.05, 16: 0.025, 32: 0.0125}
DEFAULT_BAND = (10.0, 1000.0)
DEFAULT_OVERESTIMATE = (1.5, 3.0)


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace: times in replay seconds from the trace's start."""

    id: int
    arrival: float
    gpus: int
    runtime: float
    limit: float


def bucket(gpus: int) -> str:
    """The Figure 2 curve a job of this many GPUs draws its runtime from."""
    if gpus <= 1:
        raise ValueError("the trace's slice has no 1-GPU jobs")
    return "2-4" if gpus <= 4 else "5-8" if gpus <= 8 else ">8"


def runtime_cdf(curve: str, minutes: float) -> float:
    """The fraction of `curve`'s jobs (0..1) that ended within `minutes`, linear in log(minutes)."""
    xs = [math.log10(m) for m in RUNTIME_MINUTES]
    ys = RUNTIME_CDF[curve]
    x = math.log10(min(max(minutes, RUNTIME_MINUTES[0]), RUNTIME_MINUTES[-1]))
    i = min(max(bisect.bisect_right(xs, x) - 1, 0), len(xs) - 2)
    return (ys[i] + (ys[i + 1] - ys[i]) * (x - xs[i]) / (xs[i + 1] - xs[i])) / 100.0


def runtime_quantile(curve: str, p: float) -> float:
    """Minutes below which a fraction `p` of `curve`'s jobs ended (the inverse of runtime_cdf)."""
    ys = [y / 100.0 for y in RUNTIME_CDF[curve]]
    if not ys[0] <= p <= ys[-1]:
        raise ValueError(f"p={p} is outside the curve's readings ({ys[0]}..{ys[-1]})")
    i = min(max(bisect.bisect_left(ys, p) - 1, 0), len(ys) - 2)
    while ys[i + 1] == ys[i] and i + 2 < len(ys):
        i += 1
    lo, hi = math.log10(RUNTIME_MINUTES[i]), math.log10(RUNTIME_MINUTES[i + 1])
    return 10 ** (lo + (hi - lo) * (p - ys[i]) / (ys[i + 1] - ys[i]))


def band_cdf(curve: str, minutes: float, band: tuple[float, float] = DEFAULT_BAND) -> float:
    """The CDF a generated runtime (in trace minutes) follows: `curve` conditioned on `band`."""
    lo, hi = (runtime_cdf(curve, m) for m in band)
    return min(max((runtime_cdf(curve, minutes) - lo) / (hi - lo), 0.0), 1.0)


def _sizes(mix: dict[int, float], workers: int, per_worker: int) -> tuple[list[int], list[float]]:
    sizes = sorted(mix)
    for g in sizes:
        if g <= 0 or g > workers * per_worker or (g > per_worker and g % per_worker):
            raise ValueError(f"a job of {g} GPUs cannot run on {workers} workers of {per_worker} GPUs "
                             "(more than one worker's GPUs must be whole workers)")
    return sizes, [mix[g] for g in sizes]


def _check(jobs: int, load: float, compression: float, band: tuple[float, float],
           overestimate: tuple[float, float]) -> None:
    if jobs < 1 or load <= 0 or compression <= 0:
        raise ValueError("jobs, load and compression must be positive")
    if not RUNTIME_MINUTES[0] <= band[0] < band[1] <= RUNTIME_MINUTES[-1]:
        raise ValueError(f"the runtime band must lie within {RUNTIME_MINUTES[0]}..{RUNTIME_MINUTES[-1]} minutes")
    if not 1.0 <= overestimate[0] <= overestimate[1]:
        raise ValueError("time limits overestimate runtimes: 1 <= low <= high")


def generate(jobs: int = 120, workers: int = 8, load: float = 1.4, compression: float = 600.0, seed: int = 38, *,
             mix: dict[int, float] | None = None, band: tuple[float, float] = DEFAULT_BAND,
             overestimate: tuple[float, float] = DEFAULT_OVERESTIMATE,
             per_worker: int = GPUS_PER_WORKER) -> list[TraceJob]:
    """`jobs` jobs for `workers` workers of `per_worker` GPUs at offered load `load`; same arguments, same trace.

    Raises ValueError for a size no placement could run, a band outside Figure 2, or a load <= 0.
    """
    _check(jobs, load, compression, band, overestimate)
    sizes, weights = _sizes(mix or SIZE_MIX, workers, per_worker)
    rng = random.Random(seed)
    drawn = []
    for _ in range(jobs):
        gpus = rng.choices(sizes, weights)[0]
        curve = bucket(gpus)
        p = rng.uniform(runtime_cdf(curve, band[0]), runtime_cdf(curve, band[1]))
        runtime = max(round(runtime_quantile(curve, p) * 60.0 / compression, 2), 0.01)
        limit = math.ceil(runtime * rng.uniform(*overestimate) * 100.0) / 100.0
        drawn.append((gpus, runtime, limit, rng.expovariate(1.0)))
    demand = sum(g * r for g, r, _, _ in drawn)
    window = demand / (load * workers * per_worker)
    gaps = [gap for _, _, _, gap in drawn[1:]]
    scale = window / sum(gaps) if gaps else 0.0
    arrival, out = 0.0, []
    for i, (gpus, runtime, limit, _) in enumerate(drawn):
        if i:
            arrival += gaps[i - 1] * scale
        out.append(TraceJob(i + 1, round(arrival, 2), gpus, runtime, limit))
    return out


def offered_load(jobs: Sequence[TraceJob], workers: int, per_worker: int = GPUS_PER_WORKER) -> float:
    """The trace's GPU-seconds over the capacity times the arrival window."""
    window = max(j.arrival for j in jobs) - min(j.arrival for j in jobs)
    return sum(j.gpus * j.runtime for j in jobs) / (workers * per_worker * window) if window else math.inf


def dumps(jobs: Iterable[TraceJob]) -> str:
    """The trace as JSON lines, one job a line (what load() reads)."""
    return "".join(json.dumps(asdict(j)) + "\n" for j in jobs)


def load(text: str) -> list[TraceJob]:
    """A trace written by dumps(); raises ValueError on a line that is not a job."""
    jobs = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            jobs.append(TraceJob(int(row["id"]), float(row["arrival"]), int(row["gpus"]), float(row["runtime"]),
                                 float(row["limit"])))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"line {n}: not a trace job ({exc})") from None
    return jobs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The generator's options (tracesim.py takes them too)."""
    parser.add_argument("--jobs", type=int, default=120, help="number of jobs (default 120)")
    parser.add_argument("--workers", type=int, default=8, help="number of 8-GPU workers (default 8)")
    parser.add_argument("--load", type=float, default=1.4, help="offered load, times the capacity (default 1.4)")
    parser.add_argument("--compression", type=float, default=600.0,
                        help="trace seconds per replay second (default 600: 10 min -> 1 s)")
    parser.add_argument("--seed", type=int, default=38, help="random seed (default 38)")
    parser.add_argument("--band", type=float, nargs=2, default=DEFAULT_BAND, metavar=("MIN", "MAX"),
                        help="runtimes drawn within this band of trace minutes (default 10 1000)")


def from_arguments(args: argparse.Namespace) -> list[TraceJob]:
    """The trace that add_arguments' options describe."""
    return generate(args.jobs, args.workers, args.load, args.compression, args.seed, band=tuple(args.band))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        jobs = from_arguments(args)
    except ValueError as exc:
        parser.error(str(exc))
    sys.stdout.write(dumps(jobs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
