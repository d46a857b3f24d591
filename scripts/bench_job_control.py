#!/usr/bin/env python3
"""Held and begin-later jobs cost acquire nothing (issue 27, part 3).

A held job (`submit --hold`, `job hold`) and one that waits for its begin time (`--begin`) keep their
tasks out of task_queue (tasks.held = 1), so acquire never reads them; upkeep finds the jobs whose begin
time came through the partial index jobs_begin_at alone (jobcontrol.begin_due). This measures, on a real
state file through the Scheduler, in the same run for each --waiting count N (N held jobs and N
begin-later jobs, made first):

  acquire      an acquire that places one queued job (then its start and finish, untimed)
  begin_due    upkeep's begin-time round when nothing is due

Medians and p99 in ms, and the ratio to N = 0 (the baseline, the first count). `--json` for one object.

    python scripts/bench_job_control.py --waiting 0,10000 --reps 300
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

from gpulayer.server.config import ControlPlaneConfig  # noqa: E402
from gpulayer.server.scheduler.core import Scheduler  # noqa: E402
from gpulayer.server.security.auth import Principal  # noqa: E402
from gpulayer.server.store.db import Store  # noqa: E402

JOIN = Principal(kind="join", jti="server-join", name="server")


def measure(waiting: int, reps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        config = ControlPlaneConfig(home=Path(tmp))
        sched = Scheduler(Store(config.layout.state), config, time.time)
        body = {"name": "w", "labels": {}, "slots": 1, "version": "bench", "resources": {"cpus": 8, "gpus": 0, "memory_mb": 16000, "gpu_models": []}}
        worker = sched.register(body=body, token=JOIN, session_hash="bench", peer_address="127.0.0.1")["worker_id"]
        later = time.time() + 86400
        for _ in range(waiting):
            sched.submit({"command": ["held"], "hold": True})
            sched.submit({"command": ["later"], "begin_at": later})
        times: dict[str, list[float]] = {"acquire": [], "begin_due": []}
        for i in range(reps):
            sched.submit({"command": ["run"]})
            started = time.perf_counter()
            task = sched.acquire(worker)
            times["acquire"].append(time.perf_counter() - started)
            assert task is not None and task["command"] == ["run"], task
            sched.start(worker, task["task_id"], 100 + i)
            sched.finish(worker, task["task_id"], exit_code=0, outcome="succeeded", outputs={}, reason=None)
            started = time.perf_counter()
            assert sched.begin_due() == 0
            times["begin_due"].append(time.perf_counter() - started)
        sched.store.close()
    return {"waiting": waiting, "times": times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--waiting", default="0,10000", help="held jobs and begin-later jobs each (comma-separated)")
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = [measure(int(n), args.reps) for n in args.waiting.split(",")]
    base = {k: benchlib.median(v) for k, v in results[0]["times"].items()}
    rows, out = [], []
    for r in results:
        for kind, values in r["times"].items():
            s = benchlib.summary_ms(values)
            ratio = round(benchlib.median(values) / base[kind], 2)
            rows.append({"waiting": r["waiting"], "what": kind, "p50_ms": s["p50_ms"], "p99_ms": s["p99_ms"], "ratio": ratio})
            out.append({"waiting": r["waiting"], "what": kind, **s, "ratio": ratio})
    text = f"{benchlib.machine_line()}\n{args.reps} rounds each\n" + benchlib.table(rows)
    benchlib.emit({"machine": benchlib.machine(), "reps": args.reps, "results": out}, args.json, text)


if __name__ == "__main__":
    main()
