#!/usr/bin/env python3
"""Render times of the explorer's pages and pictures on a big state file, and each query's plan.

Builds (once, at --state) schema.sql filled with a day of a fleet: --workers workers of 8 GPUs,
one array job of --array elements (half ended, a quarter running or assigned, a quarter queued),
--jobs other jobs of one task each over the last --days days, a usage-ledger row and four events
per run that ended, and, with --samples, a `gpu_samples` table (as migration 0018 makes it) with a
sample per GPU every --sample-every seconds over the last day. Then renders, in this process
through falcon.testing (no HTTP), the home page, the array's job page and each picture alone,
--rounds times, interleaved, and prints the median and max of each, and EXPLAIN QUERY PLAN of every
query those pages run (`SCAN` of a big table is the thing to look for).

    python scripts/bench_explorer_pages.py --state /tmp/explorer-bench.db --rounds 7 --samples
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import apsw

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests" / "explorer"))
from benchlib import machine_line  # noqa: E402
from explorer_state import ensure_gpu_samples  # noqa: E402  (the table as migration 0018 makes it)

from explorer import charts, create_app, fleet  # noqa: E402
from explorer.queries import QUERIES  # noqa: E402
from gpulayer.server.store.readonly_sql import QueryTimeout, ReadOnlyDatabase  # noqa: E402

NOW = 1_790_000_000.0
ARRAY_JOB = 1


def build(path: Path, args: argparse.Namespace) -> None:
    rng = random.Random(7)
    db = apsw.Connection(str(path))
    db.execute("PRAGMA journal_mode = wal")
    db.execute((ROOT / "schema.sql").read_text())
    with db:
        db.execute("INSERT INTO projects (id, name, created_at) VALUES (2, 'vision', 0), (3, 'nlp', 0), (4, 'rl', 0)")
        db.execute("INSERT INTO users (id, name, created_at) VALUES (2, 'alice', 0), (3, 'bob', 0)")
        db.executemany(
            "INSERT INTO workers (id, name, cpus, gpus, memory_mb, gpu_models, slots, registered_at, last_seen_at,"
            " lease_expires_at) VALUES (?, ?, 64, 8, 512000, ?, 8, ?, ?, ?)",
            [(w, f"gpu-{w:03d}", json.dumps(["H100"] * 8), NOW - 86400, NOW - 2, NOW + 30) for w in range(1, args.workers + 1)],
        )
        spec = json.dumps({"command": ["python", "sweep.py", "--lr", "{index}"], "array": {"size": args.array}})
        db.execute(
            "INSERT INTO jobs (id, name, state, spec, gpus, array_size, created_at, user_id, project_id)"
            " VALUES (?, 'sweep', 'running', ?, 1, ?, ?, 2, 2)",
            (ARRAY_JOB, spec, args.array, NOW - 20 * 3600),
        )
        tasks, usage, events = [], [], []
        for index in range(args.array):
            created = NOW - 20 * 3600
            if index < args.array // 2:  # ended
                started = created + index * (18 * 3600 / args.array)
                ended = started + rng.uniform(300, 3600)
                worker = 1 + index % args.workers
                tasks.append((index, "succeeded", None, None, created, started, started, ended, "[0]"))
                usage.append((index, worker, started, ended))
            elif index < args.array * 3 // 4:  # running
                worker = 1 + index % args.workers
                started = NOW - rng.uniform(60, 3600)
                tasks.append((index, "running", worker, NOW + 30, created, started, started, None, json.dumps([index % 8])))
            else:  # queued
                tasks.append((index, "queued", None, None, created, None, None, None, "[]"))
        db.executemany(
            'INSERT INTO tasks (job_id, "index", state, worker_id, lease_expires_at, created_at, assigned_at,'
            " started_at, finished_at, gpu_indices) VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            tasks,
        )
        for index, worker, started, ended in usage:
            task_id = index + 1
            events += [
                (started, "task_assigned", ARRAY_JOB, task_id, worker),
                (started, "task_started", ARRAY_JOB, task_id, worker),
                (ended, "task_finished", ARRAY_JOB, task_id, worker),
            ]
        db.executemany(
            "INSERT INTO usage (task_id, job_id, attempt, job_name, user_id, project_id, worker_id, worker_name, gpus,"
            " cpus, started_at, ended_at, gpu_seconds, cpu_seconds, outcome)"
            " VALUES (?, 1, 1, 'sweep', 2, 2, ?, 'w', 1, 0, ?, ?, ?, 0, 'succeeded')",
            [(i + 1, w, s, e, e - s) for i, w, s, e in usage],
        )
        for n in range(args.jobs):
            job_id = ARRAY_JOB + 1 + n
            created = NOW - rng.uniform(0, args.days * 86400)
            started = created + rng.uniform(10, 600)
            ended = started + rng.uniform(60, 7200)
            state = "succeeded" if ended < NOW else "running"
            worker = 1 + n % args.workers
            gpus = rng.choice([1, 2, 4, 8])
            project = 2 + n % 3
            db.execute(
                "INSERT INTO jobs (id, name, state, spec, gpus, created_at, finished_at, user_id, project_id) VALUES (?, ?, ?, ?, ?, ?, ?, 3, ?)",
                (
                    job_id,
                    f"train-{n}",
                    state,
                    json.dumps({"command": ["python", "train.py", str(n)]}),
                    gpus,
                    created,
                    ended if state == "succeeded" else None,
                    project,
                ),
            )
            db.execute(
                "INSERT INTO tasks (job_id, state, worker_id, lease_expires_at, created_at, assigned_at,"
                " started_at, finished_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (job_id, state, worker, NOW + 30 if state == "running" else None, created, started, started, ended if state == "succeeded" else None),
            )
            events.append((created, "job_submitted", job_id, None, None))
            if state == "succeeded":
                task_id = db.last_insert_rowid()
                db.execute(
                    "INSERT INTO usage (task_id, job_id, attempt, job_name, user_id, project_id, worker_id,"
                    " gpus, cpus, started_at, ended_at, gpu_seconds, cpu_seconds, outcome)"
                    " VALUES (?, ?, 1, ?, 3, ?, ?, ?, 0, ?, ?, ?, 0, 'succeeded')",
                    (task_id, job_id, f"train-{n}", project, worker, gpus, started, ended, gpus * (ended - started)),
                )
                events.append((ended, "job_finished", job_id, None, None))
        db.executemany("INSERT INTO events (at, kind, job_id, task_id, worker_id) VALUES (?, ?, ?, ?, ?)", sorted(events))
        if args.samples:
            ensure_gpu_samples(db)
            db.executemany(
                "INSERT INTO gpu_samples VALUES (?, ?, ?, ?, 40000, 81920)",
                (
                    (w, g, at, rng.uniform(0, 100))
                    for at in _range(NOW - 86400, NOW, args.sample_every)
                    for w in range(1, args.workers + 1)
                    for g in range(8)
                ),
            )
    db.execute("PRAGMA optimize")
    db.close()


def _range(start: float, end: float, step: float):
    at = start
    while at < end:
        yield at
        at += step


def timed(fn, rounds: int) -> dict:
    """Median and max wall time of `rounds` calls; a call the 1 s query limit stopped counts in `stopped`."""
    seconds, stopped = [], 0
    for _ in range(rounds):
        started = time.perf_counter()
        try:
            fn()
        except QueryTimeout:
            stopped += 1
        seconds.append(time.perf_counter() - started)
    return {"median_ms": round(statistics.median(seconds) * 1e3, 1), "max_ms": round(max(seconds) * 1e3, 1), "stopped": stopped}


def plans(path: Path) -> dict[str, list[str]]:
    """EXPLAIN QUERY PLAN of each query the home and job pages run, with the bench's parameters."""
    db = apsw.Connection(f"file:{path}?mode=ro", flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
    names = [n for n in QUERIES if n.startswith(("page_home", "page_chart", "page_job", "page_latest", "page_worker"))]
    names += ["gpu_hours_by_week", "quota_use_now", "job_timeline"]
    out = {}
    for name in names:
        try:
            rows = db.execute(
                "EXPLAIN QUERY PLAN " + QUERIES[name].sql,
                {
                    p: "[1]" if p == "ids" else 1
                    for p in ("job_id", "limit", "cap", "since", "until", "step", "now", "window", "ids", "table", "buckets")
                },
            ).fetchall()
        except apsw.SQLError as e:
            out[name] = [f"(not prepared: {e})"]
            continue
        out[name] = [row[3] for row in rows]
    db.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--state", type=Path, default=Path("/tmp/explorer-bench.db"))
    parser.add_argument("--array", type=int, default=100_000)
    parser.add_argument("--jobs", type=int, default=5_000)
    parser.add_argument("--days", type=float, default=30)
    parser.add_argument("--workers", type=int, default=50)
    parser.add_argument("--samples", action="store_true", help="add gpu_samples (as migration 0018 makes it)")
    parser.add_argument("--sample-every", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--plans", action="store_true", help="print EXPLAIN QUERY PLAN of each query")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.rebuild or not args.state.exists():
        started = time.perf_counter()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{args.state}{suffix}").unlink(missing_ok=True)
        build(args.state, args)
        print(f"built {args.state} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    import falcon.testing

    client = falcon.testing.TestClient(create_app(str(args.state), clock=lambda: NOW))
    db = ReadOnlyDatabase(str(args.state))
    window = charts.last_day(NOW)

    def page(url: str):
        def get() -> None:
            answer = client.simulate_get(url)
            assert answer.status_code == 200, answer.text[:500]

        return get

    def picture(draw):
        def run() -> None:
            with db.session() as session:
                draw(session)

        return run

    cases = {
        "home page /": page("/"),
        f"job page of the {args.array:,}-element array": page(f"/-/jobs/{ARRAY_JOB}"),
        "job page of a one-task job": page(f"/-/jobs/{ARRAY_JOB + 1}"),
        "picture: tasks queued and running": picture(lambda s: charts.tasks_chart(s, window)),
        "picture: GPUs busy per worker": picture(lambda s: charts.gpu_charts(s, window)),
        "picture: GPU-hours per project per week": picture(lambda s: charts.project_weeks_chart(s, NOW)),
        "home page without pictures (tables only)": picture(lambda s: fleet.home(s, NOW)),
    }
    results = {name: timed(fn, args.rounds) for name, fn in cases.items()}
    report = {
        "machine": machine_line(),
        "state": str(args.state),
        "array": args.array,
        "jobs": args.jobs,
        "samples": args.samples,
        "rounds": args.rounds,
        "results": results,
    }
    if args.plans:
        report["plans"] = plans(args.state)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(report["machine"])
    for name, r in results.items():
        print(
            f"{name:48} median {r['median_ms']:8.1f} ms   max {r['max_ms']:8.1f} ms"
            + (f"   ({r['stopped']} of {args.rounds} stopped at the 1 s query limit)" if r["stopped"] else "")
        )
    for name, lines in report.get("plans", {}).items():
        print(f"\n{name}:\n  " + "\n  ".join(lines))


if __name__ == "__main__":
    main()
