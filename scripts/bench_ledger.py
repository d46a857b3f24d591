#!/usr/bin/env python3
"""What the usage ledger and fair share cost a task's life, in one sitting.

Each cycle runs one task through the scheduler's transactions on a real state file
(pinned to one worker, in process, no HTTP): submit, acquire, start, finish. Rounds
alternate between a state file as schema.sql makes it and a copy of it without the
trigger `tasks_run_ended` (no usage row, no fair-share charge when a run ends), so the
ratio is what the ledger adds, measured against itself:

    python scripts/bench_ledger.py --cycles 300 --rounds 6 --json

ms per transaction, medians over the rounds' medians. Nothing is timed as a test.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

STEPS = ("submit", "acquire", "start", "finish")


def _scheduler(home: Path, ledger: bool):
    from gpulayer.server.config import ControlPlaneConfig
    from gpulayer.server.scheduler.core import Scheduler
    from gpulayer.server.security.auth import Principal, init_home
    from gpulayer.server.store.db import Store

    init_home(home)
    config = ControlPlaneConfig(home=home)
    store = Store(config.layout.state)
    if not ledger:
        store.write(lambda conn: conn.execute("DROP TRIGGER tasks_run_ended"))
    sched = Scheduler(store, config)
    join = Principal(kind="join", jti="server-join", name="server")
    worker = sched.register(body={"name": "w", "labels": {}, "slots": 1, "version": "bench",
                                  "resources": {"cpus": 8, "gpus": 1, "memory_mb": 16000, "gpu_models": []}},
                            token=join, session_hash="bench", peer_address="127.0.0.1")["worker_id"]
    return sched, store, worker


def _round(home: Path, ledger: bool, cycles: int) -> dict[str, float]:
    sched, store, worker = _scheduler(home, ledger)
    spent: dict[str, list[float]] = {step: [] for step in STEPS}
    clock = time.perf_counter
    try:
        for _ in range(cycles):
            t0 = clock()
            sched.submit({"command": ["true"], "gpus": 1})
            t1 = clock()
            task = sched.acquire(worker)
            t2 = clock()
            sched.start(worker, task["task_id"], 1)
            t3 = clock()
            sched.finish(worker, task["task_id"], exit_code=0, outcome="succeeded", outputs={}, reason=None)
            t4 = clock()
            for step, seconds in zip(STEPS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                spent[step].append(seconds)
        rows = store.read(lambda conn: conn.execute("SELECT count(*) AS n FROM usage").fetchall())[0]["n"]
        if rows != (cycles if ledger else 0):
            raise RuntimeError(f"usage rows {rows}, expected {cycles if ledger else 0}")
    finally:
        store.close()
    return {step: statistics.median(values) * 1000 for step, values in spent.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cycles", type=int, default=300, help="task cycles per round")
    p.add_argument("--rounds", type=int, default=6, help="rounds per variant, alternating")
    p.add_argument("--json", action="store_true", help="print JSON")
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-ledger-"))
    found: dict[str, list[dict]] = {"ledger": [], "no_trigger": []}
    try:
        for n in range(args.rounds):
            for variant in ("ledger", "no_trigger") if n % 2 == 0 else ("no_trigger", "ledger"):
                found[variant].append(_round(workdir / f"{variant}-{n}", variant == "ledger", args.cycles))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    rows = []
    for step in STEPS:
        with_ = statistics.median(r[step] for r in found["ledger"])
        without = statistics.median(r[step] for r in found["no_trigger"])
        rows.append({"step": step, "ledger_p50_ms": round(with_, 4), "no_trigger_p50_ms": round(without, 4),
                     "ratio": round(with_ / without, 3)})
    result = {"machine": benchlib.machine(), "args": vars(args), "steps": rows}
    benchlib.emit(result, args.json, "\n".join([benchlib.machine_line(result["machine"]),
                                                benchlib.table(rows, ["step", "ledger_p50_ms", "no_trigger_p50_ms",
                                                                      "ratio"])]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
