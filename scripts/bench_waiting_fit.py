#!/usr/bin/env python3
"""What telling a queued job's waiting reason costs a read of its job (GET /v1/jobs/{id}, `job status`).

`views.render` of one queued job on a real state file with --workers online
workers, two ways, in the same run:

  cold   on a fresh connection (its schema parsed already): the first render pays for
         preparing every query it runs, as each new reader connection of the control
         plane does once (and each API test's fresh Store)
  warm   the same connection again: the statements come from its cache

Two jobs: `busy` (fits every worker, all of them busy) and `size` (fits none: too big).
Medians in ms of CPU (process time) over --reps. `--json` for one JSON object.

    python scripts/bench_waiting_fit.py --workers 1,100,1000
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gpulayer.server.config import ControlPlaneConfig
from gpulayer.server.scheduler import views
from gpulayer.server.scheduler.core import Scheduler
from gpulayer.server.security.auth import Principal
from gpulayer.server.store import db

JOIN = Principal(kind="join", jti="server-join", name="server")


def build(home: Path, workers: int) -> tuple[Path, dict[str, int]]:
    """`workers` online workers, each busy with a task; a queued job that fits them and one that fits none."""
    config = ControlPlaneConfig(home=home)
    store = db.Store(config.layout.state)
    sched = Scheduler(store, config, time.time)
    for n in range(workers):
        body = {"name": f"w{n}", "labels": {}, "slots": 1, "version": "bench",
                "resources": {"cpus": 8, "gpus": 0, "memory_mb": 16000, "gpu_models": []}}
        worker = sched.register(body=body, token=JOIN, session_hash=f"bench-{n}", peer_address="127.0.0.1")["worker_id"]
        sched.submit({"command": ["sleep", "1"]})
        sched.acquire(worker)
    found = {"busy": sched.submit({"command": ["true"]}), "size": sched.submit({"command": ["true"], "cpus": 64})}
    reasons = {v: store.read(views.render, j)["waiting_reason"] for v, j in found.items()}
    assert reasons["busy"].startswith("waiting for capacity") and reasons["size"].startswith("no online worker"), reasons
    store.close()
    return config.layout.state, found


def measure(workers: int, reps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        state, found = build(Path(tmp), workers)
        out: dict = {}
        for variant, job_id in found.items():
            cold, warm = [], []
            for _ in range(reps):
                conn = db.connect(state, readonly=True)
                conn.execute("SELECT 1 FROM jobs LIMIT 1").fetchall()  # the schema parsed, as a reader's first read does
                started = time.process_time()
                views.render(conn, job_id)
                cold.append(time.process_time() - started)
                started = time.process_time()
                views.render(conn, job_id)
                warm.append(time.process_time() - started)
                conn.close()
            out[variant] = {"cold_ms": round(statistics.median(cold) * 1000, 2),
                            "warm_ms": round(statistics.median(warm) * 1000, 2)}
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,100,1000")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = {int(n): measure(int(n), args.reps) for n in args.workers.split(",")}
    if args.json:
        print(json.dumps(results))
        return
    for n, variants in results.items():
        for variant, figures in variants.items():
            print(f"workers={n:<6} {variant:<5} cold {figures['cold_ms']:8.2f} ms   warm {figures['warm_ms']:8.2f} ms")


if __name__ == "__main__":
    sys.exit(main())
