"""Concurrent acquisition: threads and processes never get the same task, never more than a worker's GPUs.

In one process every write goes through the Store's one writer thread; several
Stores (threads with their own, or separate processes) on one file meet at
SQLite's lock (BEGIN IMMEDIATE with a busy timeout) instead.
"""
from __future__ import annotations

import collections
import json
import multiprocessing
import threading

from gpulayer.server.config import ControlPlaneConfig
from gpulayer.server.store.db import Store
from gpulayer.server.errors import TaskNotAssigned
from gpulayer.server.scheduler.core import Scheduler
from helpers import add_worker, job

GPUS_PER_WORKER = 4
SLOTS = 6
JOIN_S = 30  # a thread or process still running after this is hung: the test fails, not passes on partial results


def run_threads(targets) -> None:
    """Run each callable in its own thread; fail on a thread still alive after JOIN_S or one that raised."""
    errors: list[BaseException] = []

    def guarded(fn):
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread below
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(fn,), daemon=True) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S)
        assert not t.is_alive(), f"{t.name} still running after {JOIN_S} s: hung"
    if errors:
        raise errors[0]


def drain(sched, worker_ids, start=None):
    """Acquire-and-start for these workers, round robin, until none gets anything; returns [(worker, task)]."""
    if start is not None:
        start.wait()
    got, idle = [], 0
    i = 0
    while idle < len(worker_ids):
        w = worker_ids[i % len(worker_ids)]
        i += 1
        a = sched.acquire(w)
        if a is None:
            idle += 1
            continue
        idle = 0
        try:
            sched.start(w, a["task_id"], 1)
        except TaskNotAssigned:
            pass
        got.append((w, a["task_id"], tuple(a["gpus"])))
    return got


def _fleet(sched, n_workers=4, n_jobs=40):
    workers = [add_worker(sched, f"w{i}", gpus=GPUS_PER_WORKER, slots=SLOTS, cpus=64, memory_mb=10**6)
               for i in range(n_workers)]
    for i in range(n_jobs):
        sched.submit(job(gpus=1 + i % 3, name=f"j{i}"))
    sched.submit(job(service={"replicas": 3}, gpus=1, name="svc"))
    return workers


def check_invariants(store, results):
    """No task handed to two workers; GPUs on each worker distinct and within its count; slots kept."""
    owner = {}
    for w, task_id, _ in results:
        assert owner.setdefault(task_id, w) == w, f"task {task_id} given to workers {owner[task_id]} and {w}"

    def read(conn):
        tasks = conn.execute("SELECT t.id, t.job_id, t.worker_id, t.gpu_indices, j.gpus FROM tasks t "
                             "JOIN jobs j ON j.id = t.job_id WHERE t.state IN ('assigned', 'running')").fetchall()
        assigned = conn.execute("SELECT task_id, count(*) AS n FROM events WHERE kind = 'task_assigned' "
                                "GROUP BY task_id HAVING n > 1").fetchall()
        return tasks, assigned

    tasks, assigned_twice = store.read(read)
    assert assigned_twice == []
    by_worker = collections.defaultdict(list)
    for t in tasks:
        indices = json.loads(t["gpu_indices"])
        assert len(indices) == t["gpus"], t
        by_worker[t["worker_id"]].append(t)
    for w, held in by_worker.items():
        indices = [i for t in held for i in json.loads(t["gpu_indices"])]
        assert len(indices) == len(set(indices)), f"worker {w} shares a GPU: {indices}"
        assert all(0 <= i < GPUS_PER_WORKER for i in indices)
        assert sum(t["gpus"] for t in held) <= GPUS_PER_WORKER
        assert len(held) <= SLOTS
        jobs_here = [t["job_id"] for t in held]
        assert len(jobs_here) == len(set(jobs_here)), "two replicas of one job on one worker"
    for w, task_id, gpus in results:
        assert all(0 <= g < GPUS_PER_WORKER for g in gpus)
    return tasks


def test_threads_sharing_one_store(sched):
    workers = _fleet(sched)
    start = threading.Barrier(8, timeout=JOIN_S)
    results: list = []
    lock = threading.Lock()

    def run(ws):
        got = drain(sched, ws, start)
        with lock:
            results.extend(got)

    # two threads per worker (the same worker polling twice at once), each also polling a neighbour
    plan = [[workers[i % 4], workers[(i + 1) % 4]] for i in range(8)]
    run_threads([lambda ws=ws: run(ws) for ws in plan])
    tasks = check_invariants(sched.store, results)
    assert sum(t["gpus"] for t in tasks) == GPUS_PER_WORKER * len(workers)  # the fleet ends full


def test_threads_with_their_own_store(sched, config, clock):
    workers = _fleet(sched)
    sched.store.close()
    stores = [Store(config.layout.state) for _ in range(4)]
    try:
        start = threading.Barrier(len(stores), timeout=JOIN_S)
        results: list = []
        lock = threading.Lock()

        def run(store, ws):
            got = drain(Scheduler(store, config, clock), ws, start)
            with lock:
                results.extend(got)

        run_threads([lambda s=s, i=i: run(s, [workers[i], workers[(i + 1) % 4]]) for i, s in enumerate(stores)])
        check_invariants(stores[0], results)
    finally:
        for s in stores:
            s.close()


def _process_main(home, now, worker_ids, barrier, out):
    config = ControlPlaneConfig(home=home, heartbeat_interval_s=0.5, lease_ttl_s=3.0)
    store = Store(config.layout.state)
    try:
        got = drain(Scheduler(store, config, lambda: now), worker_ids, barrier)
        out.put(("ok", got))
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        out.put(("error", repr(exc)))
    finally:
        store.close()


def test_processes_each_with_its_own_store(sched, config, clock):
    workers = _fleet(sched, n_jobs=30)
    sched.store.close()
    ctx = multiprocessing.get_context("spawn")
    n = 4
    barrier = ctx.Barrier(n, timeout=JOIN_S)
    out = ctx.Queue()
    procs = [ctx.Process(target=_process_main,
                         args=(str(config.home), clock.now, [workers[i], workers[(i + 1) % 4]], barrier, out))
             for i in range(n)]
    for p in procs:
        p.start()
    try:
        answers = [out.get(timeout=2 * JOIN_S) for _ in procs]
        for p in procs:
            p.join(JOIN_S)
            assert not p.is_alive(), f"process {p.pid} still running after {JOIN_S} s: hung"
            assert p.exitcode == 0, f"process {p.pid} exited {p.exitcode}"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    assert all(kind == "ok" for kind, _ in answers), answers
    results = [r for _, got in answers for r in got]
    store = Store(config.layout.state)
    try:
        tasks = check_invariants(store, results)
        assert sum(t["gpus"] for t in tasks) == GPUS_PER_WORKER * len(workers)
    finally:
        store.close()
