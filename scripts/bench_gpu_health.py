#!/usr/bin/env python3
"""What issue 18's fit terms cost acquire and heartbeats: the views of schema version 5 against today's.

One state file, copied fresh per repetition and variant, variants interleaved in
one run:

  v5_views     shape_worker_fit and worker_load as schema version 5 had them (no
               cordon, no GPU health: made from the migration chain up to 0005),
               heartbeats without `gpus`
  now          today's views (schedulable, unhealthy GPUs out of free_gpus), no
               worker_gpus or worker_cordons rows, heartbeats without `gpus` (an
               older agent, or a fleet without NVML)
  now_health   today's views, every worker with 8 rows in worker_gpus (one
               unhealthy), a tenth of them cordoned, heartbeats with `gpus` (8 entries)

`acquire`: ms per acquisition by worker 1 (8 GPUs, 8 slots) in its own BEGIN
IMMEDIATE ... COMMIT, each task marked succeeded after (untimed), against
--queued queued 1-GPU tasks on --workers online GPU workers. `heartbeat`: ms per
leases.heartbeat of worker 1 (no tasks) in its own transaction. Medians of the
per-repetition p50s; ratios against v5_views.
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

from gpulayer.server.scheduler import leases, placement  # noqa: E402
from gpulayer.protocol.fields import to_wire  # noqa: E402
from gpulayer.server.scheduler.spec import validate_job  # noqa: E402
from gpulayer.server.store import db  # noqa: E402

BASELINE = Path(db.__file__).resolve().parent / "migrations" / "baseline_0001.sql"
VARIANTS = ("v5_views", "now", "now_health")
GPUS = 8
CLEAR = "UPDATE tasks SET state = 'succeeded', finished_at = :now WHERE id = :id"


def views_at_version(version: int, tmp: Path) -> dict[str, str]:
    """{view: CREATE VIEW text} of worker_load and shape_worker_fit in a file migrated up to `version`."""
    conn = db.connect(tmp / "chain.db")
    conn.execute(BASELINE.read_text())
    for step in range(2, version + 1):
        conn.execute(db.migrations()[step].read_text())
    found = {r["name"]: r["sql"] for r in conn.execute(
        "SELECT name, sql FROM sqlite_schema WHERE name IN ('worker_load', 'shape_worker_fit')").fetchall()}
    conn.close()
    return found


def build(path: Path, workers: int, queued: int) -> None:
    conn = db.connect(path)
    db.ensure_schema(conn)
    now = time.time()
    spec = json.dumps(to_wire(validate_job({"command": ["true"], "gpus": 1})))
    with conn:
        conn.executemany(
            "INSERT INTO workers (id, name, state, cpus, gpus, memory_mb, slots, registered_at, last_seen_at, "
            "lease_expires_at, session_hash) VALUES (?, ?, 'online', 64, ?, 1048576, ?, ?, ?, ?, ?)",
            [(i + 1, f"w{i}", GPUS, GPUS, now, now, now + 1e9, f"h{i}") for i in range(workers)])
        conn.executemany("INSERT INTO jobs (id, state, spec, gpus, created_at) VALUES (?, 'queued', ?, 1, ?)",
                         [(i + 1, spec, now) for i in range(queued)])
        conn.executemany("INSERT INTO tasks (id, job_id, state, created_at) VALUES (?, ?, 'queued', ?)",
                         [(i + 1, i + 1, now) for i in range(queued)])
    conn.execute("ANALYZE")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def prepare(path: Path, variant: str, old_views: dict[str, str], workers: int) -> None:
    conn = db.connect(path)
    now = time.time()
    with conn:
        if variant == "v5_views":
            conn.execute("DROP VIEW shape_worker_fit")
            conn.execute("DROP VIEW worker_load")
            conn.execute(old_views["worker_load"])
            conn.execute(old_views["shape_worker_fit"])
        elif variant == "now_health":
            conn.executemany(
                "INSERT INTO worker_gpus (worker_id, \"index\", uuid, healthy, reason, changed_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [(w + 1, g, f"GPU-{w}-{g}", int(g != GPUS - 1), None if g != GPUS - 1 else "Xid 79", now)
                 for w in range(workers) for g in range(GPUS)])
            conn.executemany("INSERT INTO worker_cordons (worker_id, state, reason, since) "
                             "VALUES (?, 'cordoned', 'bench', ?)", [(w + 1, now) for w in range(1, workers, 10)])
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def time_acquires(path: Path, n: int) -> list[float]:
    conn = db.connect(path, synchronous="normal")
    spent = []
    for _ in range(n):
        now = time.time()
        t0 = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        task = placement.acquire(conn, 1, now, 20.0)
        conn.execute("COMMIT")
        spent.append(time.perf_counter() - t0)
        if task is None:
            raise RuntimeError("worker 1 found nothing to take")
        conn.execute(CLEAR, {"now": now, "id": task})
    conn.close()
    return spent


def time_heartbeats(path: Path, n: int, with_gpus: bool) -> list[float]:
    conn = db.connect(path, synchronous="normal")
    gpus = [{"index": g, "uuid": f"GPU-0-{g}", "healthy": g != GPUS - 1, "reason": None if g != GPUS - 1 else "Xid 79"}
            for g in range(GPUS)] if with_gpus else None
    spent = []
    for _ in range(n):
        t0 = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        leases.heartbeat(conn, 1, [], time.time(), 20.0, gpus)
        conn.execute("COMMIT")
        spent.append(time.perf_counter() - t0)
    conn.close()
    return spent


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=200, help="online 8-GPU workers (default 200)")
    p.add_argument("--queued", type=int, default=5_000, help="queued 1-GPU tasks (default 5000)")
    p.add_argument("--acquisitions", type=int, default=400, help="timed acquisitions per repetition")
    p.add_argument("--heartbeats", type=int, default=1_000, help="timed heartbeats per repetition")
    p.add_argument("--reps", type=int, default=5, help="repetitions, variants interleaved (median reported)")
    p.add_argument("--dir", type=Path, default=None, help="where the files go (default: a temp dir)")
    p.add_argument("--json", action="store_true", help="print JSON")
    args = p.parse_args(argv)
    work = args.dir or Path(tempfile.mkdtemp(prefix="bench-gpu-health-"))
    work.mkdir(parents=True, exist_ok=True)
    old_views = views_at_version(5, work)
    template = work / "template.db"
    build(template, args.workers, args.queued)
    runs: dict[str, dict[str, list[float]]] = {v: {"acquire": [], "heartbeat": []} for v in VARIANTS}
    for rep in range(args.reps):
        for variant in VARIANTS:
            path = work / f"{variant}-{rep}.db"
            shutil.copyfile(template, path)
            prepare(path, variant, old_views, args.workers)
            runs[variant]["acquire"].append(benchlib.percentile(time_acquires(path, args.acquisitions), 50))
            runs[variant]["heartbeat"].append(
                benchlib.percentile(time_heartbeats(path, args.heartbeats, variant == "now_health"), 50))
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
    base = {k: benchlib.median(runs["v5_views"][k]) for k in ("acquire", "heartbeat")}
    rows = [{"variant": v,
             "acquire_p50_ms": round(benchlib.median(runs[v]["acquire"]) * 1e3, 4),
             "acquire_ratio": round(benchlib.median(runs[v]["acquire"]) / base["acquire"], 3),
             "heartbeat_p50_ms": round(benchlib.median(runs[v]["heartbeat"]) * 1e3, 4),
             "heartbeat_ratio": round(benchlib.median(runs[v]["heartbeat"]) / base["heartbeat"], 3)}
            for v in VARIANTS]
    result = {"machine": benchlib.machine(), "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}
    benchlib.emit(result, args.json, benchlib.machine_line(result["machine"]) + "\n" + benchlib.table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
