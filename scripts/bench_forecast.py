#!/usr/bin/env python3
"""The cost of one start-time forecast (scheduler/forecast.py) and of one what-if, by queue size.

A real state file (a Store, the real Scheduler, an injected clock): 8 online workers of 8 GPUs (slots 8), all
64 GPUs held by 16 running 4-GPU jobs (limits 10 to 100 minutes), then `--queued` jobs queued in one write
(jobs.submit, the real submit function) in the trace's size mix (scripts/tracegen.py: 4 / 8 / 16 / 32 GPUs
= 63 / 21 / 11 / 5 %, 16 and 32 as gangs of 2 and 4 whole workers), each with a time limit of 1 to 100
minutes. Timed, `--repeat` times each, the median reported:

  snapshot   the in-memory copy of the state file from a reader (SQLite's backup API)
  forecast   Estimates.refresh: the copy and the forward replay of the first --max-jobs waiting jobs
             (the server's upkeep forecast; `estimated` says how many got a start, `skipped` how many
             were left past --max-jobs)
  what_if    Scheduler.estimate of one more 8-GPU job (the copy, the submit in it, the replay until it starts)

Usage: python3 scripts/bench_forecast.py [--queued 1000] [--max-jobs 500] [--repeat 3] [--json]
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

from gpulayer.server.config import ControlPlaneConfig  # noqa: E402
from gpulayer.server.scheduler import forecast, jobs  # noqa: E402
from gpulayer.server.scheduler.core import Scheduler  # noqa: E402
from gpulayer.server.scheduler.spec import validate_job  # noqa: E402
from gpulayer.server.security.auth import Principal, init_home  # noqa: E402
from gpulayer.server.store.db import Store  # noqa: E402

NOW = 1_700_000_000.0
JOIN = Principal(kind="join", jti="server-join", name="server")
SIZES = [(4, 1, 0.632), (8, 1, 0.211), (8, 2, 0.105), (8, 4, 0.053)]  # (GPUs a task, nodes, share)


def build(home: Path, queued: int, seed: int) -> Scheduler:
    """A plane's scheduler over a fresh state file: 8 busy 8-GPU workers and `queued` jobs waiting."""
    init_home(home)
    config = ControlPlaneConfig(home=home)
    sched = Scheduler(Store(config.layout.state), config, lambda: NOW)
    workers = [sched.register(body={"name": f"gpu-{i:02d}", "labels": {}, "slots": 8, "version": "bench",
                                    "resources": {"cpus": 64, "gpus": 8, "memory_mb": 512000, "gpu_models": []}},
                              token=JOIN, session_hash=f"bench-{i}", peer_address="127.0.0.1")["worker_id"]
               for i in range(8)]
    rng = random.Random(seed)
    for _ in range(16):
        sched.submit({"command": ["sleep", "1"], "gpus": 4, "timeout_seconds": rng.uniform(600, 6000)})
    for w in workers:
        for a in sched.acquire_many(w, max_tasks=2):
            sched.start(w, a["task_id"], 1)
    specs = []
    for _ in range(queued):
        gpus, nodes, _share = rng.choices(SIZES, weights=[s[2] for s in SIZES])[0]
        specs.append(validate_job({"command": ["sleep", "1"], "gpus": gpus, "timeout_seconds": rng.uniform(60, 6000),
                                   **({"nodes": nodes} if nodes > 1 else {})}))
    sched.store.write(lambda conn: [jobs.submit(conn, spec, NOW) for spec in specs])
    return sched


def measure(queued: int, max_jobs: int, repeat: int, seed: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-forecast-") as tmp:
        sched = build(Path(tmp) / "home", queued, seed)
        sched.estimates.max_jobs = max_jobs
        snap, made, what = [], [], []
        for _ in range(repeat):
            started = time.perf_counter()
            sched.store.read(forecast.snapshot).close()
            snap.append(time.perf_counter() - started)
            started = time.perf_counter()
            result = sched.estimates.refresh()
            made.append(time.perf_counter() - started)
            started = time.perf_counter()
            sched.estimate({"command": ["true"], "gpus": 8, "timeout_seconds": 600})
            what.append(time.perf_counter() - started)
        estimated = sum(e.at is not None for e in result.estimates.values())
        size = Path(sched.config.layout.state).stat().st_size
        sched.store.close()
    return {"queued": queued, "max_jobs": max_jobs, "state_mb": round(size / 2**20, 1),
            "snapshot_ms": round(benchlib.median(snap) * 1e3, 1), "forecast_ms": round(benchlib.median(made) * 1e3, 1),
            "estimated": estimated, "skipped": len(result.skipped),
            "what_if_ms": round(benchlib.median(what) * 1e3, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", default="1000", help="queue sizes, comma-separated (20000: about 5 minutes)")
    parser.add_argument("--max-jobs", type=int, default=forecast.DEFAULT_MAX_JOBS)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=38)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [measure(int(n), args.max_jobs, args.repeat, args.seed) for n in args.queued.split(",")]
    result = {"machine": benchlib.machine(), "rows": rows}
    benchlib.emit(result, args.json, benchlib.machine_line(result["machine"]) + "\n" + benchlib.table(rows))


if __name__ == "__main__":
    main()
