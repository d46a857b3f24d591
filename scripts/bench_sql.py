#!/usr/bin/env python3
"""Acquisitions per second: the real acquire transaction against a minimal UPDATE ... RETURNING.

Same run, same table size, same synchronous setting, fresh copies of one
template file per repetition, variants interleaved. Variants:

  minimal        one apsw connection: BEGIN IMMEDIATE; UPDATE t SET state='assigned'
                 WHERE id = (SELECT id FROM t WHERE state='queued' ORDER BY id LIMIT 1)
                 RETURNING id; COMMIT  (t has the same row count and a partial index on queued rows)
  real_direct    gpulayer.server.scheduler.placement.acquire on one gpulayer connection inside
                 BEGIN IMMEDIATE ... COMMIT (no writer thread)
  real_store     the same function through Store.write (writer thread, SAVEPOINT, group commit),
                 one caller at a time
  real_store_x8  8 caller threads (8 workers) at once through Store.write: group commit at work;
                 each acquisition is followed by a "finish" write, both counted in the wall time

Between two timed acquisitions the task taken is marked succeeded (untimed for
the sequential variants), otherwise acquire would hand the same task back
(acquire is idempotent until start).

--index-check compares the real acquire with and without the index task_queue_shape
(each queued shape's tasks, best first) on --finished finished + 1,000 queued tasks.

--backlog N,N,... measures acquire against a backlog instead (and nothing else): a
CPU-only worker; N queued tasks that ask for 8 GPUs (which no worker has) ahead of the
tasks it can take (--backlog-blocked user: N CPU tasks it fits, of a user at a running-jobs
limit of 0, which acquire judges once per group of queued work, not per task). `acquire`: ms per acquisition on one connection (BEGIN IMMEDIATE ...
COMMIT), median and p99, and the same without the COMMIT (placement.acquire alone);
`heartbeat`: ms per heartbeat through Store.write while 100 idle workers poll acquire
(100 polls/s in all), median and p99; `aging`: ms per upkeep transaction of aging
(aging.age, AGING_BATCH rows raised a step) once the whole backlog is due a step, median and
max, and ms of a round with nothing due.
--reservations N measures acquire against the backlog of --backlog (N queued 8-GPU tasks no worker fits,
ahead of the CPU tasks worker 1 takes) with and without reservations (issue 38: EASY backfill), same run,
rounds of each interleaved on two copies of one file: `with` holds 4 reservations on worker 1 (and one on
each other worker) of backlog jobs, starting in 2 h, so every claim reads them and the runtime model of the
task it takes (the default 1 h: expected to end before, so taken) and looks 32 tasks further per group.
`acquire` as for --backlog: ms per acquisition (BEGIN IMMEDIATE ... COMMIT), median and p99; `ratio`:
with / without, of the medians.
--compare REV times the one-task claim (acquire_one; acquire_task before issue 23) as git revision REV wrote it against this
tree's (and nothing else), alternating one claim of each, each claim rolled back, on one state
file per case: the template (--finished + --queued, no team settings), a backlog of a user at a
running-jobs limit of 0, and teams (three projects with GPU quotas and borrowing, users with
running-jobs limits, running work and fair-share usage). Both must claim the same task; the
median microseconds of each and their ratio (this tree / REV) are reported.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import apsw

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

from gpulayer.server.store import db

from gpulayer.server.scheduler import aging, leases, placement  # noqa: E402
from gpulayer.protocol.fields import to_wire  # noqa: E402
from gpulayer.server.scheduler.spec import validate_job  # noqa: E402
from gpulayer.server.store.queries import QUERIES, parse_blocks  # noqa: E402

LEASE_TTL = 20.0
MINIMAL = ("UPDATE t SET state='assigned' WHERE id = (SELECT id FROM t WHERE state='queued' ORDER BY id LIMIT 1) "
           "RETURNING id")
CLEAR = "UPDATE tasks SET state='succeeded', finished_at=:now WHERE id=:id"


def build_template(path: Path, finished: int, queued: int, workers: int) -> None:
    """A state file with `finished` done jobs/tasks, `queued` queued ones, online workers; plus table t."""
    conn = db.connect(path)
    db.ensure_schema(conn)
    spec = json.dumps(to_wire(validate_job({"command": ["true"]})))
    now = time.time()
    with conn:
        _insert_workers(conn, workers, slots=4, now=now)
        conn.executemany(
            "INSERT INTO jobs (id, state, spec, created_at, finished_at, exit_code) VALUES (?, ?, ?, ?, ?, ?)",
            [(i + 1, "succeeded" if i < finished else "queued", spec, now,
              now if i < finished else None, 0 if i < finished else None) for i in range(finished + queued)])
        conn.executemany(
            "INSERT INTO tasks (id, job_id, state, worker_id, created_at, finished_at, exit_code) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(i + 1, i + 1, "succeeded" if i < finished else "queued", 1 if i < finished else None, now,
              now if i < finished else None, 0 if i < finished else None) for i in range(finished + queued)])
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, state TEXT NOT NULL)")
        conn.execute("CREATE INDEX t_queued ON t (id) WHERE state = 'queued'")
        conn.executemany("INSERT INTO t VALUES (?, ?)",
                         [(i + 1, "done" if i < finished else "queued") for i in range(finished + queued)])
    conn.execute("ANALYZE")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def fresh_copy(template: Path, workdir: Path, name: str) -> Path:
    dest = workdir / f"{name}.db"
    for suffix in ("", "-wal", "-shm"):
        Path(str(dest) + suffix).unlink(missing_ok=True)
    shutil.copyfile(template, dest)
    return dest


def run_minimal(path: Path, sync: str, n: int, max_s: float) -> tuple[int, float]:
    conn = apsw.Connection(str(path))
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={sync}")
    done, spent = 0, 0.0
    clock = time.perf_counter
    while done < n and spent < max_s:
        t0 = clock()
        conn.execute("BEGIN IMMEDIATE")
        got = conn.execute(MINIMAL).fetchall()
        conn.execute("COMMIT")
        spent += clock() - t0
        if not got:
            break
        done += 1
    conn.close()
    return done, spent


def run_real_direct(path: Path, sync: str, n: int, max_s: float) -> tuple[int, float]:
    conn = db.connect(path, synchronous=sync.lower())
    done, spent = 0, 0.0
    clock = time.perf_counter
    while done < n and spent < max_s:
        now = time.time()
        t0 = clock()
        conn.execute("BEGIN IMMEDIATE")
        task = placement.acquire(conn, 1, now, LEASE_TTL)
        conn.execute("COMMIT")
        spent += clock() - t0
        if task is None:
            break
        done += 1
        conn.execute(CLEAR, {"now": now, "id": task})
    conn.close()
    return done, spent


def _clear(conn, task_id, now):
    conn.execute(CLEAR, {"now": now, "id": task_id})


def run_real_store(path: Path, sync: str, n: int, max_s: float) -> tuple[int, float]:
    store = db.Store(path, synchronous=sync.lower())
    done, spent = 0, 0.0
    clock = time.perf_counter
    try:
        while done < n and spent < max_s:
            now = time.time()
            t0 = clock()
            task = store.write(placement.acquire, 1, now, LEASE_TTL)
            spent += clock() - t0
            if task is None:
                break
            done += 1
            store.write(_clear, task, now)
    finally:
        store.close()
    return done, spent


def run_real_store_concurrent(path: Path, sync: str, n: int, max_s: float, threads: int = 8) -> tuple[int, float]:
    store = db.Store(path, synchronous=sync.lower())
    counts = [0] * threads
    stop = threading.Event()
    per_thread = max(1, n // threads)

    def loop(i):
        while counts[i] < per_thread and not stop.is_set():
            now = time.time()
            task = store.write(placement.acquire, i + 1, now, LEASE_TTL)
            if task is None:
                return
            counts[i] += 1
            store.write(_clear, task, now)

    pool = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    t0 = time.perf_counter()
    for t in pool:
        t.start()
    timer = threading.Timer(max_s, stop.set)
    timer.start()
    for t in pool:
        t.join()
    spent = time.perf_counter() - t0
    timer.cancel()
    store.close()
    return sum(counts), spent


VARIANTS = {"minimal": run_minimal, "real_direct": run_real_direct, "real_store": run_real_store,
            "real_store_x8": run_real_store_concurrent}


def throughput(args, template: Path, workdir: Path) -> list[dict]:
    out = []
    for sync in args.synchronous:
        rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for _rep in range(args.reps):
            for name, fn in VARIANTS.items():
                path = fresh_copy(template, workdir, f"{name}-{sync}")
                done, spent = fn(path, sync.upper(), args.acquisitions, args.max_seconds)
                rates[name].append(done / spent if spent else 0.0)
        base = benchlib.median(rates["minimal"])
        for name in VARIANTS:
            med = benchlib.median(rates[name])
            out.append({"synchronous": sync, "variant": name, "median_per_s": round(med, 1),
                        "min_per_s": round(min(rates[name]), 1), "max_per_s": round(max(rates[name]), 1),
                        "us_per_acquire": round(1e6 / med, 1) if med else None,
                        "vs_minimal": round(med / base, 3) if base else None,
                        "reps": [round(r, 1) for r in rates[name]]})
    return out


def index_check(args, workdir: Path) -> list[dict]:
    template = workdir / "index-template.db"
    build_template(template, args.finished, 1000, 1)
    rates: dict[str, list[float]] = {"with_index": [], "without_index": []}
    for _rep in range(args.index_reps):
        for name in rates:
            path = fresh_copy(template, workdir, name)
            if name == "without_index":
                conn = apsw.Connection(str(path))
                conn.execute("DROP INDEX task_queue_shape")
                conn.close()
            done, spent = run_real_direct(path, "NORMAL", args.index_acquisitions, args.max_seconds)
            rates[name].append(done / spent if spent else 0.0)
    with_i = benchlib.median(rates["with_index"])
    without = benchlib.median(rates["without_index"])
    return [{"variant": name, "median_per_s": round(benchlib.median(r), 1),
             "ms_per_acquire": round(1e3 / benchlib.median(r), 3), "reps": [round(x, 1) for x in r]}
            for name, r in rates.items()] + [{"variant": "slowdown_without_index",
                                              "median_per_s": round(with_i / without, 1) if without else None}]


BACKLOG_WORKERS = 101  # worker 1 acquires; all of them poll and heartbeat in the heartbeat phase


def _insert_workers(conn, count: int, *, slots: int, now: float) -> None:
    """`count` online CPU-only workers (64 CPUs, 1 TiB) with `slots` slots each, leases far ahead."""
    conn.executemany(
        "INSERT INTO workers (name, state, cpus, gpus, memory_mb, slots, registered_at, last_seen_at, "
        "lease_expires_at, session_hash) VALUES (?, 'online', 64, 0, 1048576, ?, ?, ?, ?, ?)",
        [(f"w{i}", slots, now, now, now + 1e9, f"h{i}") for i in range(count)])


def build_backlog(path: Path, backlog: int, fitting: int, blocked: str = "gpus") -> None:
    """CPU-only online workers; `backlog` queued tasks they cannot take, then `fitting` queued CPU tasks
    behind them. `blocked`: "gpus", the backlog asks for 8 GPUs (no worker fits it); "user", the backlog
    is CPU tasks of the same shape owned by a user at a running-jobs limit of 0 (fits, not admitted)."""
    conn = db.connect(path)
    db.ensure_schema(conn)
    spec = json.dumps(to_wire(validate_job({"command": ["true"]})))
    big = json.dumps(to_wire(validate_job({"command": ["true"], "gpus": 8})))
    now = time.time()
    with conn:
        _insert_workers(conn, BACKLOG_WORKERS, slots=1, now=now)
        if blocked == "user":
            conn.execute("INSERT INTO users (id, name, max_running_jobs, created_at) VALUES (2, 'capped', 0, ?)",
                         (now,))
            conn.executemany("INSERT INTO jobs (id, state, spec, gpus, created_at, user_id) "
                             "VALUES (?, 'queued', ?, 0, ?, ?)",
                             [(i + 1, spec, now, 2 if i < backlog else 1) for i in range(backlog + fitting)])
        else:
            conn.executemany("INSERT INTO jobs (id, state, spec, gpus, created_at) VALUES (?, 'queued', ?, ?, ?)",
                             [(i + 1, big if i < backlog else spec, 8 if i < backlog else 0, now)
                              for i in range(backlog + fitting)])
        conn.executemany("INSERT INTO tasks (id, job_id, state, created_at) VALUES (?, ?, 'queued', ?)",
                         [(i + 1, i + 1, now) for i in range(backlog + fitting)])
    conn.execute("ANALYZE")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def time_acquires(path: Path, n: int) -> tuple[list[float], list[float]]:
    """Seconds per acquisition by worker 1, each in its own BEGIN IMMEDIATE ... COMMIT; and without the COMMIT."""
    conn = db.connect(path, synchronous="normal")
    spent, sql = [], []
    clock = time.perf_counter
    for _ in range(n):
        now = time.time()
        t0 = clock()
        conn.execute("BEGIN IMMEDIATE")
        t1 = clock()
        task = placement.acquire(conn, 1, now, LEASE_TTL)
        t2 = clock()
        conn.execute("COMMIT")
        spent.append(clock() - t0)
        sql.append(t2 - t1)
        if task is None:
            raise RuntimeError("backlog: worker 1 found nothing to take")
        conn.execute(CLEAR, {"now": now, "id": task})
    conn.close()
    return spent, sql


def time_heartbeats(path: Path, seconds: float, polls_per_s: float, heartbeats_per_s: float,
                    blocked: str = "gpus") -> list[float]:
    """Seconds per heartbeat (Store.write) while idle workers poll acquire, nothing they can take queued."""
    conn = db.connect(path)
    takeable = "gpus = 0" + (" AND user_id = 1" if blocked == "user" else "")
    conn.execute("UPDATE tasks SET state = 'cancelled', finished_at = :now WHERE state = 'queued' "
                 f"AND job_id IN (SELECT id FROM jobs WHERE {takeable})", {"now": time.time()})
    conn.close()
    store = db.Store(path, synchronous="normal")
    stop = threading.Event()

    def paced(rate, call):
        n, start = 0, time.perf_counter()
        while not stop.is_set():
            wait = start + n / rate - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            call(n)
            n += 1

    spent: list[float] = []

    def poll(n):
        if store.write(placement.acquire, 2 + n % (BACKLOG_WORKERS - 1), time.time(), LEASE_TTL) is not None:
            raise RuntimeError("backlog: an idle worker found a task")

    def beat(n):
        t0 = time.perf_counter()
        store.write(leases.heartbeat, 1 + n % BACKLOG_WORKERS, [], time.time(), LEASE_TTL)
        spent.append(time.perf_counter() - t0)

    pool = [threading.Thread(target=paced, args=(polls_per_s, poll)),
            threading.Thread(target=paced, args=(heartbeats_per_s, beat))]
    for t in pool:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in pool:
        t.join()
    store.close()
    return spent


def time_aging(path: Path) -> tuple[list[float], float]:
    """Seconds per aging transaction (BEGIN IMMEDIATE ... COMMIT) an hour and a bit after the backlog was
    queued, until no task is due; and the seconds of one more round, with nothing due."""
    conn = db.connect(path, synchronous="normal")
    now = time.time() + aging.AGING_STEP_S + 60
    spent, done = [], aging.AGING_BATCH
    while done == aging.AGING_BATCH:
        t0 = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        done = aging.age(conn, now)
        conn.execute("COMMIT")
        spent.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    conn.execute("BEGIN IMMEDIATE")
    aging.age(conn, now)
    conn.execute("COMMIT")
    idle = time.perf_counter() - t0
    conn.close()
    return spent, idle


def backlog_check(args, workdir: Path) -> list[dict]:
    out = []
    for backlog in args.backlog:
        template = workdir / f"backlog-{backlog}.db"
        build_backlog(template, backlog, args.backlog_acquisitions, args.backlog_blocked)
        spent, sql = time_acquires(fresh_copy(template, workdir, "backlog"), args.backlog_acquisitions)
        acq, stmts = benchlib.summary_ms(spent), benchlib.summary_ms(sql)
        beats = benchlib.summary_ms(time_heartbeats(fresh_copy(template, workdir, "backlog"), args.backlog_seconds,
                                                    BACKLOG_WORKERS - 1, 50, args.backlog_blocked))
        ages, idle = time_aging(fresh_copy(template, workdir, "backlog"))
        out.append({"backlog": backlog, "acquire_p50_ms": acq["p50_ms"], "acquire_p99_ms": acq["p99_ms"],
                    "acquires": acq["n"],
                    "no_commit_p50_ms": stmts["p50_ms"], "no_commit_p99_ms": stmts["p99_ms"], "heartbeat_p50_ms": beats["p50_ms"],
                    "heartbeat_p99_ms": beats["p99_ms"], "heartbeats": beats["n"],
                    "aging_batch_p50_ms": benchlib.summary_ms(ages)["p50_ms"],
                    "aging_batch_max_ms": round(max(ages) * 1e3, 3), "aging_batches": len(ages),
                    "aging_idle_ms": round(idle * 1e3, 3)})
        template.unlink()
    return out



RESERVATION_ROUNDS = 4


def _reserve(path: Path) -> None:
    """4 reservations on worker 1 and one on each other worker, of backlog jobs, from 2 h on."""
    conn = db.connect(path)
    now = time.time()
    with conn:
        conn.executemany("INSERT INTO reservations (job_id, worker_id, tasks, gpus, cpus, memory_mb, start_at, "
                         "planned_at, reason) VALUES (?, ?, 1, 0, 1, 1, ?, ?, 'bench')",
                         [(j, 1, now + 7200, now) for j in range(1, 5)]
                         + [(4 + w, w, now + 7200, now) for w in range(2, BACKLOG_WORKERS + 1)])
    conn.close()


def reservations_check(args, workdir: Path) -> list[dict]:
    """acquire with and without reservations, rounds interleaved on two copies of one backlog file."""
    template = workdir / "reservations.db"
    build_backlog(template, args.reservations, args.backlog_acquisitions * RESERVATION_ROUNDS)
    files = {"without": fresh_copy(template, workdir, "without"), "with": fresh_copy(template, workdir, "with")}
    _reserve(files["with"])
    spent: dict[str, list[float]] = {"without": [], "with": []}
    for _ in range(RESERVATION_ROUNDS):
        for name, path in files.items():
            spent[name] += time_acquires(path, args.backlog_acquisitions)[0]
    out = [{"reservations": name, "backlog": args.reservations, **benchlib.summary_ms(s)} for name, s in spent.items()]
    for r in out:
        r["ratio"] = round(r["p50_ms"] / out[0]["p50_ms"], 3)
    return out


def build_teams(path: Path, queued: int) -> None:
    """8 workers of 8 GPUs; three projects with a GPU quota of 8 and 8 to borrow, three users with a running-jobs
    limit of 40; 30 running 1-GPU jobs (some borrowed), `queued` queued 1-GPU jobs spread over the projects and
    users, and fair-share usage for each."""
    conn = db.connect(path)
    db.ensure_schema(conn)
    spec = json.dumps(to_wire(validate_job({"command": ["true"], "gpus": 1})))
    now = time.time()
    with conn:
        conn.executemany(
            "INSERT INTO workers (id, name, state, cpus, gpus, memory_mb, slots, registered_at, last_seen_at, "
            "lease_expires_at, session_hash) VALUES (?, ?, 'online', 64, 8, 1048576, 8, ?, ?, ?, ?)",
            [(i + 1, f"w{i}", now, now, now + 1e9, f"h{i}") for i in range(8)])
        conn.execute("UPDATE projects SET gpu_quota = 8, gpu_borrow = 8 WHERE id = 1")
        conn.executemany("INSERT INTO projects (id, name, gpu_quota, gpu_borrow, created_at) VALUES (?, ?, 8, 8, ?)",
                         [(2, "ml", now), (3, "cv", now)])
        conn.execute("UPDATE users SET max_running_jobs = 40 WHERE id = 1")
        conn.executemany("INSERT INTO users (id, name, max_running_jobs, created_at) VALUES (?, ?, 40, ?)",
                         [(2, "ann", now), (3, "bob", now)])
        running = 30
        conn.executemany(
            "INSERT INTO jobs (id, state, spec, gpus, created_at, project_id, user_id) VALUES (?, ?, ?, 1, ?, ?, ?)",
            [(i + 1, "running" if i < running else "queued", spec, now, 1 + i % 3, 1 + (i // 3) % 3)
             for i in range(running + queued)])
        conn.executemany(
            "INSERT INTO tasks (id, job_id, state, worker_id, lease_expires_at, gpu_indices, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(i + 1, i + 1, "running" if i < running else "queued", 2 + i % 7 if i < running else None,
              now + 1e9 if i < running else None, json.dumps([i // 7]) if i < running else "[]", now)
             for i in range(running + queued)])
        conn.executemany("INSERT INTO fairshare (project_id, user_id, usage, updated_at, running) VALUES (?, ?, ?, ?, ?)",
                         [(p, u, 1000.0 * p * u, now - 600, 10.0 * u) for p in (1, 2, 3) for u in (1, 2, 3)])
    conn.execute("ANALYZE")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def query_at(rev: str, name: str) -> str:
    """The named query `name` as git revision `rev` wrote it (store/queries/*.sql, or the older store/queries.sql)."""
    root = Path(__file__).resolve().parents[1]
    listed = subprocess.run(["git", "-C", str(root), "ls-tree", "-r", "--name-only", rev, "gpulayer/server/store/"],
                            capture_output=True, text=True, check=True).stdout.split()
    for path in listed:
        if path.endswith(".sql") and "/migrations/" not in path and not path.endswith("schema.sql"):
            text = subprocess.run(["git", "-C", str(root), "show", f"{rev}:{path}"], capture_output=True, text=True,
                                  check=True).stdout
            found = parse_blocks(text)
            if name in found:
                return found[name]
    raise SystemExit(f"{rev} has no query named {name}")


def compare_claims(path: Path, old: str, new: str, rounds: int) -> dict:
    """Microseconds per one-task claim of each text, alternating (which goes first alternates too), each claim
    rolled back; raises when the two claim different tasks."""
    conn = db.connect(path, synchronous="normal")
    spent: dict[str, list[float]] = {"old": [], "new": []}
    clock = time.perf_counter
    try:
        for i in range(rounds):
            params = {"worker_id": 1, "now": time.time(), "lease_expires_at": time.time() + LEASE_TTL, "address": None}
            claimed = {}
            for label in (("old", "new") if i % 2 == 0 else ("new", "old")):
                conn.execute("BEGIN IMMEDIATE")
                t0 = clock()
                got = conn.execute(old if label == "old" else new, params).fetchall()
                spent[label].append(clock() - t0)
                conn.execute("ROLLBACK")
                claimed[label] = got[0]["id"] if got else None
            if claimed["old"] != claimed["new"] or claimed["new"] is None:
                raise RuntimeError(f"round {i}: the revision claims {claimed['old']}, this tree {claimed['new']}")
    finally:
        conn.close()
    old_us, new_us = (benchlib.median(spent[k]) * 1e6 for k in ("old", "new"))
    return {"rev_us_p50": round(old_us, 1), "tree_us_p50": round(new_us, 1), "ratio": round(new_us / old_us, 3),
            "rev_us_p90": round(benchlib.percentile(spent["old"], 90) * 1e6, 1),
            "tree_us_p90": round(benchlib.percentile(spent["new"], 90) * 1e6, 1), "rounds": rounds}


def compare_check(args, workdir: Path) -> list[dict]:
    # The one-task claim: acquire_one since acquire_task claims several (issue 23), acquire_task before.
    try:
        old = query_at(args.compare, "acquire_one")
    except SystemExit:
        old = query_at(args.compare, "acquire_task")
    new = QUERIES["acquire_one"]
    cases = [(f"{args.finished:,} finished + {args.queued:,} queued", lambda p: build_template(p, args.finished, args.queued, 8)),
             ("10,000 queued of a user at a limit of 0, 400 behind", lambda p: build_backlog(p, 10_000, 400, "user")),
             (f"teams: quotas, borrowing, limits, fair share; {args.queued:,} queued", lambda p: build_teams(p, args.queued))]
    out = []
    for i, (label, build) in enumerate(cases):
        path = workdir / f"compare{i}.db"
        build(path)
        out.append({"state": label, **compare_claims(path, old, new, args.compare_rounds)})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--finished", type=int, default=100_000, help="finished tasks in the table (default 100000)")
    p.add_argument("--queued", type=int, default=2_000, help="queued tasks in the table (default 2000)")
    p.add_argument("--acquisitions", type=int, default=1_500, help="acquisitions per repetition (default 1500)")
    p.add_argument("--max-seconds", type=float, default=3.0, help="time cap per repetition and variant")
    p.add_argument("--reps", type=int, default=5, help="repetitions (median reported)")
    p.add_argument("--synchronous", nargs="+", default=["normal", "full"], choices=["normal", "full"])
    p.add_argument("--index-acquisitions", type=int, default=200)
    p.add_argument("--index-reps", type=int, default=3)
    p.add_argument("--skip-index-check", action="store_true")
    p.add_argument("--backlog", type=lambda v: [int(x) for x in v.split(",")], default=None,
                   help="measure acquire against these backlogs instead, e.g. 0,1000,10000,100000")
    p.add_argument("--backlog-acquisitions", type=int, default=400, help="timed acquisitions per backlog")
    p.add_argument("--backlog-seconds", type=float, default=5.0, help="seconds of heartbeats per backlog")
    p.add_argument("--backlog-blocked", choices=["gpus", "user"], default="gpus",
                   help="why worker 1 cannot take the backlog: it asks for 8 GPUs (no worker fits it), or it "
                        "fits but its user is at a running-jobs limit of 0 (teams: judged per group)")
    p.add_argument("--reservations", type=int, default=None, metavar="N",
                   help="acquire with N queued tasks no worker fits, with and without reservations (issue 38)")
    p.add_argument("--compare", metavar="REV", default=None,
                   help="time acquire_task as git revision REV wrote it against this tree's, alternating (and nothing else)")
    p.add_argument("--compare-rounds", type=int, default=2000, help="claims of each per state file with --compare")
    p.add_argument("--dir", type=Path, default=None, help="where the files go (default: a temp dir)")
    p.add_argument("--json", action="store_true", help="print JSON")
    args = p.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="bench-sql-", dir=args.dir))
    if args.compare is not None:
        result = _measured(args, workdir, "compare", compare_check)
        benchlib.emit(result, args.json, "\n".join([
            benchlib.machine_line(result["machine"]),
            f"the one-task claim at {args.compare} (rev) against this tree's, alternating, each claim rolled back; "
            "tree/rev ratio of the medians",
            benchlib.table(result["compare"], ["state", "rev_us_p50", "tree_us_p50", "ratio", "rev_us_p90",
                                               "tree_us_p90", "rounds"])]))
        return 0
    if args.reservations is not None:
        result = _measured(args, workdir, "reservations", reservations_check)
        benchlib.emit(result, args.json, "\n".join([
            benchlib.machine_line(result["machine"]),
            f"{args.reservations:,} queued 8-GPU tasks no worker fits, ahead of the CPU tasks worker 1 takes; "
            f"{RESERVATION_ROUNDS} interleaved rounds of {args.backlog_acquisitions} acquisitions each",
            benchlib.table(result["reservations"], ["reservations", "backlog", "p50_ms", "p99_ms", "n", "ratio"])]))
        return 0
    if args.backlog is not None:
        result = _measured(args, workdir, "backlog", backlog_check)
        benchlib.emit(result, args.json, "\n".join([
            benchlib.machine_line(result["machine"]),
            ("queued 8-GPU tasks no worker fits" if args.backlog_blocked == "gpus" else
             "queued CPU tasks of a user at a running-jobs limit of 0")
            + ", ahead of the CPU tasks worker 1 takes; "
            f"heartbeats while {BACKLOG_WORKERS - 1} idle workers poll",
            benchlib.table(result["backlog"], ["backlog", "acquire_p50_ms", "acquire_p99_ms", "acquires",
                                               "no_commit_p50_ms", "no_commit_p99_ms",
                                               "heartbeat_p50_ms", "heartbeat_p99_ms", "heartbeats",
                                               "aging_batch_p50_ms", "aging_batch_max_ms", "aging_batches",
                                               "aging_idle_ms"])]))
        return 0
    try:
        template = workdir / "template.db"
        build_template(template, args.finished, args.queued, 8)
        result = {"machine": benchlib.machine(), "args": _args_of(args),
                  "throughput": throughput(args, template, workdir)}
        if not args.skip_index_check:
            result["index_check"] = index_check(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    text = [benchlib.machine_line(result["machine"]),
            f"table: {args.finished:,} finished + {args.queued:,} queued tasks; {args.reps} reps, median", "",
            benchlib.table(result["throughput"], ["synchronous", "variant", "median_per_s", "min_per_s",
                                                  "max_per_s", "us_per_acquire", "vs_minimal"])]
    if "index_check" in result:
        text += ["", f"index task_queue_shape, {args.finished:,} finished + 1,000 queued (real_direct):",
                 benchlib.table(result["index_check"], ["variant", "median_per_s", "ms_per_acquire"])]
    benchlib.emit(result, args.json, "\n".join(text))
    return 0


def _args_of(args: argparse.Namespace) -> dict:
    """The run's arguments as JSON can hold them."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}


def _measured(args: argparse.Namespace, workdir: Path, key: str, check) -> dict:
    """{machine, args, key: check(args, workdir)}, the work dir removed whatever happens."""
    try:
        return {"machine": benchlib.machine(), "args": _args_of(args), key: check(args, workdir)}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
