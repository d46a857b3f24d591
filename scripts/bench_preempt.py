#!/usr/bin/env python3
"""The preemption round's cost (docs/teams.md): upkeep runs it once a second in the writer.

A state file with W online workers, each running one 1-GPU task, and 8 queued groups of
1-GPU work (8 users of project ml) at priority 5. Cases, in one run on fresh copies:

  idle         nothing preemptible, no project with a quota (the default setup)
  quota        project ml has a GPU quota (the round reads who borrows), nothing preemptible
  unfit        every running task preemptible at priority -10; the waiting work asks for a
               label no worker has: candidates and victims are read, nothing is asked
  fit          every running task preemptible at priority -10; the waiting work fits: 8
               victims are asked (the round that preempts; later rounds skip those tasks)

Each round is timed inside BEGIN IMMEDIATE ... ROLLBACK, so every repetition sees the same
state; ms per round, median and max of --reps. The case `refresh` times the other upkeep
step of teams instead: fair share's running part rewritten from the W running tasks
(ledger.refresh_running, with its COMMIT), on the `idle` state.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

from gpulayer.server.scheduler import ledger, preemption  # noqa: E402
from gpulayer.protocol.fields import to_wire  # noqa: E402
from gpulayer.server.scheduler.spec import validate_job  # noqa: E402
from gpulayer.server.store import db  # noqa: E402

GROUPS = 8
CASES = ("idle", "quota", "unfit", "fit", "refresh")


def build(path: Path, workers: int, case: str) -> None:
    """The state file of one case (see the module's docstring)."""
    conn = db.connect(path)
    db.ensure_schema(conn)
    now = time.time()
    running = json.dumps(to_wire(validate_job({"command": ["true"], "gpus": 1, "preemptible": case in ("unfit", "fit")})))
    labels = {"zone": "nowhere"} if case == "unfit" else {}
    waiting = json.dumps(to_wire(validate_job({"command": ["true"], "gpus": 1, "labels": labels})))
    with conn:
        conn.execute("INSERT INTO projects (id, name, gpu_quota, created_at) VALUES (2, 'ml', ?, ?)",
                     (100 if case not in ("idle", "refresh") else None, now))
        conn.executemany("INSERT INTO workers (id, name, state, cpus, gpus, memory_mb, slots, registered_at, "
                         "last_seen_at, lease_expires_at, session_hash) VALUES (?, ?, 'online', 8, 1, 64000, 1, ?, ?, ?, ?)",
                         [(i + 1, f"w{i}", now, now, now + 1e9, f"h{i}") for i in range(workers)])
        preemptible = int(case in ("unfit", "fit"))
        conn.executemany("INSERT INTO jobs (id, state, spec, gpus, priority, preemptible, created_at) "
                         "VALUES (?, 'running', ?, 1, ?, ?, ?)",
                         [(i + 1, running, -10 if preemptible else 0, preemptible, now) for i in range(workers)])
        conn.executemany("INSERT INTO tasks (id, job_id, state, worker_id, lease_expires_at, created_at, assigned_at, "
                         "started_at) VALUES (?, ?, 'running', ?, ?, ?, ?, ?)",
                         [(i + 1, i + 1, i + 1, now + 1e9, now, now, now) for i in range(workers)])
        conn.executemany("INSERT INTO users (id, name, created_at) VALUES (?, ?, ?)",
                         [(10 + g, f"u{g}", now) for g in range(GROUPS)])
        conn.executemany("INSERT INTO jobs (id, state, spec, gpus, priority, labels, created_at, user_id, project_id) "
                         "VALUES (?, 'queued', ?, 1, 5, ?, ?, ?, 2)",
                         [(workers + 1 + g, waiting, json.dumps(labels), now, 10 + g) for g in range(GROUPS)])
        conn.executemany("INSERT INTO tasks (id, job_id, state, priority, created_at) VALUES (?, ?, 'queued', 5, ?)",
                         [(workers + 1 + g, workers + 1 + g, now) for g in range(GROUPS)])
    conn.execute("ANALYZE")
    conn.close()


def time_rounds(path: Path, reps: int) -> tuple[list[float], int]:
    """Seconds per preemption round (rolled back each time), and how many victims a round asked."""
    conn = db.connect(path)
    spent, asked = [], 0
    for _ in range(reps):
        t0 = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        if path.name.startswith("refresh"):
            ledger.refresh_running(conn, time.time())
            conn.execute("COMMIT")
        else:
            asked = len(preemption.preempt(conn, time.time()))
            conn.execute("ROLLBACK")
        spent.append(time.perf_counter() - t0)
    conn.close()
    return spent, asked


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=lambda v: [int(x) for x in v.split(",")], default=[100, 2000],
                   help="fleet sizes, e.g. 100,2000")
    p.add_argument("--reps", type=int, default=5, help="timed rounds per case and size")
    p.add_argument("--json", action="store_true", help="print JSON")
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-preempt-"))
    out = []
    try:
        for workers in args.workers:
            for case in CASES:
                path = workdir / f"{case}-{workers}.db"
                build(path, workers, case)
                spent, asked = time_rounds(path, args.reps)
                ms = benchlib.summary_ms(spent)
                out.append({"workers": workers, "case": case, "round_p50_ms": ms["p50_ms"],
                            "round_max_ms": round(max(spent) * 1000, 3), "asked": asked})
                path.unlink()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result = {"machine": benchlib.machine(), "args": vars(args), "rounds": out}
    benchlib.emit(result, args.json, "\n".join([benchlib.machine_line(result["machine"]),
                                                benchlib.table(out, ["workers", "case", "round_p50_ms",
                                                                     "round_max_ms", "asked"])]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
