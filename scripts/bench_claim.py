#!/usr/bin/env python3
"""Acquire with max_tasks 1 and 8: microseconds per call and per task taken, and claim statements per call.

One worker (64 CPUs, no GPUs, 16 slots) acquires from a state file of --queued queued 1-CPU tasks (each its
own job), behind --unfittable queued tasks that ask for 8 GPUs (no worker has a GPU; they must cost
nothing). Each call is `placement.acquire_many` inside BEGIN IMMEDIATE ... ROLLBACK, so every call sees
the same state; calls of each max_tasks alternate. --tree PATH imports gpulayer from PATH instead of
this checkout (a worktree of another revision: the before of a before/after), so that both run the
same bench on the same machine back to back.

    python scripts/bench_claim.py --unfittable 0,100000 --json
    python scripts/bench_claim.py --tree /tmp/before --unfittable 0,100000 --json

--mixed N measures instead (and nothing else) a worker beside a reservation (issue 38's EASY backfill):
worker 1 (8 GPUs, 64 CPUs, 16 slots) runs 4 one-GPU tasks; N queued jobs of 9 shapes (0-2 GPUs, 1-4
CPUs), 3 users and 3 projects, every 7th with a time limit of 3 h (it would still run at the
reservation's start: not taken beside it); `with` adds a reservation on worker 1 of a queued 8-GPU job
from 2 h on (and one on worker 2), `without` has none; the two files' claims alternate. Without
reservations support in --tree (before issue 38), only `without` is measured.

    python scripts/bench_claim.py --mixed 1000 --json
    python scripts/bench_claim.py --tree /tmp/pre-backfill --mixed 1000 --json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path


def build(path: Path, queued: int, unfittable: int) -> None:
    from gpulayer.protocol.fields import to_wire
    from gpulayer.server.scheduler.spec import validate_job
    from gpulayer.server.store import db

    def stored(raw: dict) -> str:  # validate_job returns a ValidSpec now, a dict before issue 23's typed submit
        spec = validate_job(raw)
        return json.dumps(spec if isinstance(spec, dict) else to_wire(spec))
    conn = db.connect(path)
    db.ensure_schema(conn)
    small, big = stored({"command": ["true"], "cpus": 1}), stored({"command": ["true"], "gpus": 8})
    now = time.time()
    with conn:
        conn.execute("INSERT INTO workers (name, state, cpus, gpus, memory_mb, slots, registered_at, last_seen_at, "
                     "lease_expires_at, session_hash) VALUES ('w', 'online', 64, 0, 1048576, 16, ?, ?, ?, 'h')",
                     (now, now, now + 1e9))
        conn.executemany("INSERT INTO jobs (id, state, spec, gpus, cpus, created_at) VALUES (?, 'queued', ?, ?, ?, ?)",
                         [(i + 1, big if i < unfittable else small, 8 if i < unfittable else 0,
                           0 if i < unfittable else 1, now) for i in range(unfittable + queued)])
        conn.executemany("INSERT INTO tasks (id, job_id, state, created_at) VALUES (?, ?, 'queued', ?)",
                         [(i + 1, i + 1, now) for i in range(unfittable + queued)])
    conn.execute("ANALYZE")
    conn.close()


def build_mixed(path: Path, queued: int, reserve: bool) -> None:
    """The --mixed state: see the module's docstring."""
    from gpulayer.protocol.fields import to_wire
    from gpulayer.server.scheduler.spec import validate_job
    from gpulayer.server.store import db

    def stored(raw: dict) -> str:
        spec = validate_job(raw)
        return json.dumps(spec if isinstance(spec, dict) else to_wire(spec))
    conn = db.connect(path)
    db.ensure_schema(conn)
    now = time.time()
    shapes = [(g, c) for g in (0, 1, 2) for c in (1, 2, 4)]
    with conn:
        conn.executemany("INSERT INTO workers (id, name, state, cpus, gpus, memory_mb, slots, registered_at, "
                         "last_seen_at, lease_expires_at, session_hash) VALUES (?, ?, 'online', 64, 8, 1048576, 16, "
                         "?, ?, ?, ?)", [(w, f"w{w}", now, now, now + 1e9, f"h{w}") for w in (1, 2)])
        conn.executemany("INSERT INTO projects (id, name, created_at) VALUES (?, ?, ?)",
                         [(2, "ml", now), (3, "cv", now)])
        conn.executemany("INSERT INTO users (id, name, created_at) VALUES (?, ?, ?)", [(2, "ann", now), (3, "bob", now)])
        running = [(i + 1, "running", stored({"command": ["true"], "gpus": 1}), 1, 1, 1, 1) for i in range(4)]
        big = [(5, "queued", stored({"command": ["true"], "gpus": 8}), 8, 1, 1, 1)]
        rest = []
        for i in range(queued):
            g, c = shapes[i % len(shapes)]
            raw = {"command": ["true"], "gpus": g, "cpus": c, **({"timeout_seconds": 10800} if i % 7 == 0 else {})}
            rest.append((6 + i, "queued", stored(raw), g, c, 1 + i % 3, 1 + (i // 3) % 3))
        conn.executemany("INSERT INTO jobs (id, state, spec, gpus, cpus, created_at, project_id, user_id) "
                         "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                         [(j, st, sp, g, c, now - 600 + j, p, u) for j, st, sp, g, c, p, u in running + big + rest])
        conn.executemany("INSERT INTO tasks (id, job_id, state, worker_id, lease_expires_at, gpu_indices, created_at, "
                         "started_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                         [(j, j, st, 1 if st == "running" else None, now + 1e9 if st == "running" else None,
                           json.dumps([j - 1]) if st == "running" else "[]", now - 600,
                           now - 600 if st == "running" else None) for j, st, *_ in running + big + rest])
        if reserve:
            conn.executemany("INSERT INTO reservations (job_id, worker_id, tasks, gpus, cpus, memory_mb, start_at, "
                             "planned_at, reason) VALUES (5, ?, 1, 8, 1, 0, ?, ?, 'bench')",
                             [(w, now + 7200, now) for w in (1, 2)][:1])
    conn.execute("ANALYZE")
    conn.close()


def measure_mixed(tree_has_reservations: bool, tmp: Path, queued: int, calls: int) -> list[dict]:
    """acquire_many with max_tasks 1 (acquire_one) and 8 (acquire_task), with and without a reservation."""
    from gpulayer.server.scheduler import placement
    from gpulayer.server.store import db
    names = ["without", "with"] if tree_has_reservations else ["without"]
    conns = {}
    for name in names:
        build_mixed(tmp / f"mixed-{name}.db", queued, name == "with")
        conns[name] = db.connect(tmp / f"mixed-{name}.db", synchronous="normal")
    spent: dict[tuple[str, int], list[float]] = {(n, m): [] for n in names for m in (1, 8)}
    taken: dict[tuple[str, int], list[int]] = {}
    clock = time.perf_counter
    for i in range(calls):
        for name in names if i % 2 == 0 else names[::-1]:
            for m in (1, 8):
                conn = conns[name]
                conn.execute("BEGIN IMMEDIATE")
                t0 = clock()
                got = placement.acquire_many(conn, 1, time.time(), 60.0, m)
                spent[name, m].append(clock() - t0)
                conn.execute("ROLLBACK")
                taken[name, m] = got
    for conn in conns.values():
        conn.close()
    out = [{"reservations": n, "max_tasks": m, "us_p50": round(statistics.median(spent[n, m]) * 1e6, 1),
            "tasks": taken[n, m]} for n in names for m in (1, 8)]
    for r in out:
        base = next(o for o in out if o["reservations"] == "without" and o["max_tasks"] == r["max_tasks"])
        r["ratio"] = round(r["us_p50"] / base["us_p50"], 3)
    return out


def measure(path: Path, calls: int, sizes: list[int]) -> dict:
    from gpulayer.server.scheduler import placement
    from gpulayer.server.store import db
    from gpulayer.server.store.queries import QUERIES
    claims = {QUERIES[name].strip() for name in ("acquire_task", "acquire_one") if name in QUERIES}
    conn = db.connect(path, synchronous="normal")
    statements: list[str] = []
    spent: dict[int, list[float]] = {m: [] for m in sizes}
    taken: dict[int, int] = {}
    counted: dict[int, int] = {}
    clock = time.perf_counter
    for i in range(calls):
        for m in sizes if i % 2 == 0 else sizes[::-1]:
            conn.execute("BEGIN IMMEDIATE")
            t0 = clock()
            got = placement.acquire_many(conn, 1, time.time(), 60.0, m)
            spent[m].append(clock() - t0)
            conn.execute("ROLLBACK")
            taken[m] = len(got)
    for m in sizes:  # the statements of one more call of each, untimed (a trace slows every statement)
        conn.execute("BEGIN IMMEDIATE")
        conn.exec_trace = lambda cursor, sql, bindings: statements.append(sql) or True
        placement.acquire_many(conn, 1, time.time(), 60.0, m)
        conn.exec_trace = None
        conn.execute("ROLLBACK")
        counted[m] = sum(1 for s in statements if s.strip() in claims)
        statements.clear()
    conn.close()
    return {f"max_tasks={m}": {"us_p50": round(statistics.median(spent[m]) * 1e6, 1),
                               "us_per_task_p50": round(statistics.median(spent[m]) * 1e6 / max(taken[m], 1), 1),
                               "tasks": taken[m], "claim_statements": counted[m]} for m in sizes}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1], help="the checkout to import")
    p.add_argument("--queued", type=int, default=2_000, help="queued tasks the worker can take (default 2000)")
    p.add_argument("--unfittable", type=lambda v: [int(x) for x in v.split(",")], default=[0, 100_000])
    p.add_argument("--calls", type=int, default=500, help="calls of each max_tasks per state (default 500)")
    p.add_argument("--mixed", type=int, default=None, metavar="N",
                   help="a worker beside a reservation: N queued jobs of mixed shapes, users, projects")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    sys.path.insert(0, str(args.tree.resolve()))
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.mixed is not None:
            has = (args.tree / "gpulayer/server/store/migrations/0027_reservations.sql").exists()
            out = measure_mixed(has, Path(tmp), args.mixed, args.calls)
            print(json.dumps(out, indent=1) if args.json else "\n".join(str(o) for o in out))
            return 0
        for n in args.unfittable:
            path = Path(tmp) / f"claim{n}.db"
            build(path, args.queued, n)
            out.append({"unfittable": n, **measure(path, args.calls, [1, 8])})
    print(json.dumps(out, indent=1) if args.json else "\n".join(str(o) for o in out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
