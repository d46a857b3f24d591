#!/usr/bin/env python3
"""GPU samples on the server: one upkeep tick's flush, and `job status`'s read over a big table.

flush:  the statement upkeep runs once per tick (gpu_samples.flush: one INSERT ... SELECT FROM
        json_each) for N samples, in a write transaction of the real Store, median of --runs;
        N = 1,000 / 10,000 / 40,000 (40,000: 10,000 workers of 8 GPUs at a 2 s interval, per 1 s tick).
read:   GET /v1/jobs/{id}/gpus's read (gpu_samples.job_usage) for a job of 8 running tasks of 8
        GPUs each, with --rows samples already in the table (a week of a mid-size fleet),
        median of --runs.
The process holds the store directly (no HTTP): what the statements cost, with the same-run figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

from gpulayer.server.scheduler import gpu_samples  # noqa: E402
from gpulayer.server.store.db import Store  # noqa: E402


def _samples(n: int, at: float) -> list[tuple]:
    return [(1 + i // 8, i % 8, at, 50.0, 1000, 81559) for i in range(n)]


def bench_flush(store: Store, n: int, runs: int) -> dict:
    took = []
    for r in range(runs):
        taken = _samples(n, 1_700_000_000.0 + r)
        t0 = time.perf_counter()
        store.write(gpu_samples.flush, taken)
        took.append(time.perf_counter() - t0)
    return {"samples": n, "median_ms": round(benchlib.median(took) * 1e3, 2), "per_sample_us": round(benchlib.median(took) / n * 1e6, 2)}


def bench_read(store: Store, rows: int, runs: int) -> dict:
    def setup(conn):
        for w in range(1, 9):
            conn.execute("INSERT INTO workers (id, name, registered_at, last_seen_at, gpus) VALUES (?, ?, 0, 0, 8)", (w, f"w{w}"))
        conn.execute("INSERT INTO jobs (id, spec, state, created_at, gpus) VALUES (1, '{}', 'running', 0, 8)")
        for t in range(8):
            conn.execute(
                'INSERT INTO tasks (job_id, "index", state, worker_id, gpu_indices, created_at, started_at, '
                "lease_expires_at) VALUES (1, ?, 'running', ?, '[0,1,2,3,4,5,6,7]', 0, 0, 1e12)",
                (t, t + 1),
            )

    store.write(setup)
    batch, at = 40_000, 1_700_000_000.0
    for start in range(0, rows, batch):
        # 64 GPUs' samples over time, 2 s apart, oldest first: the newest rows are the last ones
        taken = [(1 + (i % 64) // 8, i % 8, at + (i // 64) * 2.0, 50.0, 1000, 81559) for i in range(start, min(rows, start + batch))]
        store.write(gpu_samples.flush, taken)
    took = []
    for _ in range(runs):
        t0 = time.perf_counter()
        answer = store.read(gpu_samples.job_usage, 1, None, time.time())
        took.append(time.perf_counter() - t0)
    assert sum(len(t["gpus"]) for t in answer["tasks"]) == 64 and all(g["at"] is not None for t in answer["tasks"] for g in t["gpus"])
    return {
        "rows": rows,
        "task_gpus": 64,
        "median_ms": round(benchlib.median(took) * 1e3, 3),
        "p99_ms": round(benchlib.percentile(took, 99) * 1e3, 3),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "state.db")
        try:
            flush = [bench_flush(store, n, args.runs) for n in (1_000, 10_000, 40_000)]
        finally:
            store.close()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "state.db")
        try:
            read = bench_read(store, args.rows, args.runs)
        finally:
            store.close()
    result = {"machine": benchlib.machine(), "args": vars(args), "flush": flush, "read": read}
    if args.json:
        print(json.dumps(result))
    else:
        print(benchlib.machine_line(result["machine"]))
        print("flush (one statement per upkeep tick):")
        print(benchlib.table(flush))
        print("job status's read (newest sample of each of 64 task GPUs):")
        print(benchlib.table([read]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
