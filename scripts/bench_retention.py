#!/usr/bin/env python3
"""The state file's size under a steady workload, with retention and without.

In-process, a pinned clock: every simulated hour --jobs-per-hour jobs each
write --lines log lines and finish; upkeep's prune runs every simulated hour
(`retention.prune`, the same call the server makes). Once a simulated day the
WAL is checkpointed (TRUNCATE) and the file's size recorded. With retention
(`--log-retention`, `--job-retention`) the size levels off once the oldest
jobs start to go (SQLite reuses the freed pages); without, it grows with the
days. Also reported: the longest single prune write (the write lock it held).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

from gpulayer.server.scheduler import retention

from gpulayer.server.http import wire  # noqa: E402
from gpulayer.server.security.auth import Principal, init_home  # noqa: E402
from gpulayer.server.config import ControlPlaneConfig  # noqa: E402
from gpulayer.server.store.db import Store, connect  # noqa: E402
from gpulayer.server.scheduler.core import Scheduler  # noqa: E402

HOUR = 3600.0


class Clock:
    def __init__(self):
        self.now = 1_700_000_000.0

    def __call__(self):
        return self.now


def simulate(root: Path, args, prune: bool) -> list[dict]:
    home = root / ("pruned" if prune else "kept")
    init_home(home)
    config = ControlPlaneConfig(home=home)
    clock = Clock()
    store = Store(config.layout.state)
    sched = Scheduler(store, config, clock)
    body = wire.register({"name": "w", "labels": {}, "resources": {"cpus": 64}, "slots": 64})
    worker = sched.register(body=body, token=Principal(kind="join", jti="server-join"), session_hash="h",
                            peer_address="127.0.0.1")["worker_id"]
    text = "x" * args.line_bytes
    took: list[float] = []
    timed_write = store.write

    def timing(fn, *a, **kw):
        started = time.perf_counter()
        try:
            return timed_write(fn, *a, **kw)
        finally:
            took.append(time.perf_counter() - started)

    out = []
    try:
        for day in range(1, args.days + 1):
            for _ in range(24):
                for _ in range(args.jobs_per_hour):
                    sched.submit({"command": ["run"]})
                    task = sched.acquire(worker)
                    sched.start(worker, task["task_id"], 1)
                    lines = [{"n": i, "stream": "stdout", "at": clock.now, "text": text} for i in range(args.lines)]
                    sched.logs(worker, task["task_id"], lines)
                    sched.finish(worker, task["task_id"], exit_code=0, outcome="succeeded", outputs={}, reason=None)
                clock.now += HOUR
                if prune:
                    store.write = timing
                    retention.prune(store, now=clock.now, log_retention_s=args.log_retention,
                                    job_retention_s=args.job_retention)
                    store.write = timed_write
            side = connect(config.layout.state)  # a checkpoint runs outside any transaction
            side.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            side.close()
            counts = store.read(lambda conn: conn.execute(
                "SELECT (SELECT count(*) FROM jobs) AS jobs, (SELECT count(*) FROM logs) AS lines").fetchall()[0])
            out.append({"day": day, "mb": config.layout.state.stat().st_size / 1e6, **counts})
    finally:
        store.close()
    if prune:
        out[-1]["prune_writes_ms"] = {**benchlib.summary_ms(took)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=int, default=16)
    parser.add_argument("--jobs-per-hour", type=int, default=4)
    parser.add_argument("--lines", type=int, default=500, help="log lines per job")
    parser.add_argument("--line-bytes", type=int, default=80)
    parser.add_argument("--log-retention", type=retention.parse_duration, default="3d")
    parser.add_argument("--job-retention", type=retention.parse_duration, default="6d")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        kept = simulate(Path(tmp), args, prune=False)
        pruned = simulate(Path(tmp), args, prune=True)
    rows = [{"day": k["day"], "MB without retention": round(k["mb"], 2), "MB with retention": round(p["mb"], 2),
             "jobs kept": p["jobs"], "log lines kept": p["lines"]} for k, p in zip(kept, pruned)]
    result = {"machine": benchlib.machine(), "settings": {k: v for k, v in vars(args).items() if k != "json"},
              "days": rows, "prune_writes_ms": pruned[-1]["prune_writes_ms"]}
    text = "\n".join([benchlib.machine_line(), benchlib.table(rows),
                      f"prune writes (each one transaction, ms): {result['prune_writes_ms']}"])
    benchlib.emit(result, args.json, text)


if __name__ == "__main__":
    main()
