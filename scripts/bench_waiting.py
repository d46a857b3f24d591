#!/usr/bin/env python3
"""What telling a crash-looping replica costs a read of its job (GET /v1/jobs/{id}, `job status`).

A running service replica with restarts > 0 gets its last restart line
(`restart 4: exited with code 1; next run in 8 s`) in the Job it is read in:
query `task_restart_message`, which walks the replica's log lines back from the
newest, among its last 200 only. This measures `views.render` of one service job
(one replica, on a real state file through Store.read) whose replica has
--lines log lines, in the same run:

  no_restarts    restarts = 0: the lookup is skipped (the baseline)
  restart_near   restarts = 2, the restart line 10 lines from the newest
  restart_far    restarts = 2, the restart line --lines back (outside the last 200: not found)

Each variant is read --reps times, interleaved; medians and p99 in ms, and the
ratio to the baseline. `--json` for one JSON object.

    python scripts/bench_waiting.py --lines 1000,100000,1000000
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

import apsw  # noqa: E402
from gpulayer.server.config import ControlPlaneConfig  # noqa: E402
from gpulayer.server.scheduler import views  # noqa: E402
from gpulayer.server.scheduler.core import Scheduler  # noqa: E402
from gpulayer.server.security.auth import Principal  # noqa: E402
from gpulayer.server.store.db import Store  # noqa: E402

JOIN = Principal(kind="join", jti="server-join", name="server")
RESTART = "restart 2: exited with code 1; next run in 2 s"


def build(home: Path, lines: int) -> tuple[Scheduler, dict[str, int]]:
    """Three running service jobs (one per variant), each with `lines` log lines; {variant: job id}."""
    config = ControlPlaneConfig(home=home)
    store = Store(config.layout.state)
    sched = Scheduler(store, config, time.time)
    body = {"name": "w", "labels": {}, "slots": 3, "version": "bench",
            "resources": {"cpus": 8, "gpus": 0, "memory_mb": 16000, "gpu_models": []}}
    worker = sched.register(body=body, token=JOIN, session_hash="bench", peer_address="127.0.0.1")["worker_id"]
    found = {}
    for variant, restart_at, restarts in (("no_restarts", None, 0), ("restart_near", lines - 10, 2),
                                          ("restart_far", 0, 2)):
        job_id = sched.submit({"command": ["serve"], "service": {"replicas": 1}})
        task_id = sched.acquire(worker)["task_id"]
        sched.start(worker, task_id, 1)

        def fill(conn, task_id=task_id, job_id=job_id, restart_at=restart_at):
            conn.execute("BEGIN")
            conn.executemany(
                "INSERT INTO logs (job_id, task_id, n, stream, at, text) VALUES (?, ?, ?, ?, ?, ?)",
                ((job_id, task_id, n, "system" if n == restart_at else "stdout", 1.0,
                  RESTART if n == restart_at else f"line {n}") for n in range(lines)))
            conn.execute("COMMIT")
        conn = apsw.Connection(str(config.layout.state))  # bulk lines, as a worker's shipments would leave them
        conn.setbusytimeout(10_000)
        fill(conn)
        conn.close()
        sched.heartbeat(worker, [{"task_id": task_id, "state": "running", "endpoint": None, "restarts": restarts}])
        found[variant] = job_id
    return sched, found


def measure(lines: int, reps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        sched, found = build(Path(tmp), lines)
        times: dict[str, list[float]] = {v: [] for v in found}
        messages = {v: sched.store.read(views.render, j)["tasks"][0]["restart_message"] for v, j in found.items()}
        for _ in range(reps):
            for variant, job_id in found.items():
                started = time.perf_counter()
                sched.store.read(views.render, job_id)
                times[variant].append(time.perf_counter() - started)
        sched.store.close()
    base = benchlib.median(times["no_restarts"])
    return {"lines": lines, "messages": messages,
            "variants": {v: {**benchlib.summary_ms(t), "ratio": round(benchlib.median(t) / base, 2)}
                         for v, t in times.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", default="1000,100000,1000000", help="log lines per replica (comma-separated)")
    parser.add_argument("--reps", type=int, default=500)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = [measure(int(n), args.reps) for n in args.lines.split(",")]
    rows = [{"lines": r["lines"], "variant": v, "p50_ms": s["p50_ms"], "p99_ms": s["p99_ms"], "ratio": s["ratio"]}
            for r in results for v, s in r["variants"].items()]
    text = f"{benchlib.machine_line()}\nviews.render of a running service job, {args.reps} reads each\n" + \
        benchlib.table(rows)
    benchlib.emit({"machine": benchlib.machine(), "reps": args.reps, "results": results}, args.json, text)


if __name__ == "__main__":
    main()
