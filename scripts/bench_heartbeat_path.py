"""The heartbeat's own cost in one process, without the load generator or sockets sharing the cores.

scheduler: Scheduler.heartbeat from one caller over --workers workers (--busy of them reporting a
           running task), upkeep's expire every 500 heartbeats: heartbeats/s and CPU per heartbeat.
wsgi:      POST /v1/worker/heartbeat through the real falcon app (falcon.testing, so auth, wire
           checks and JSON included) from --threads callers, upkeep's expire every second on a thread:
           heartbeats/s, CPU per heartbeat (the callers' simulate_post included), p50/p99.

`--tree DIR` measures another checkout (a `git worktree` of an older commit): run both in one sitting
and compare them, not figures of different days.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path


def _tree(path: str) -> None:
    sys.path[:0] = [path, f"{path}/tests", f"{path}/tests/unit"]


def scheduler_level(args) -> dict:
    from gpulayer.server.config import ControlPlaneConfig
    from gpulayer.server.scheduler.core import Scheduler
    from gpulayer.server.store.db import Store
    from helpers import add_worker, job
    home = Path(tempfile.mkdtemp())
    sched = Scheduler(Store(home / "state.db"), ControlPlaneConfig(home=home, heartbeat_interval_s=2, lease_ttl_s=6.0))
    workers = [add_worker(sched, f"w{i}") for i in range(args.workers)]
    tasks = {}
    for w in workers[:args.busy]:
        sched.submit(job(["sleep", "1000"]))
        task = sched.acquire(w)
        sched.start(w, task["task_id"], 1)
        tasks[w] = task["task_id"]
    sched.expire()
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(args.n):
        w = workers[i % len(workers)]
        sched.heartbeat(w, [{"task_id": tasks[w], "state": "running", "endpoint": None, "restarts": 0}]
                        if w in tasks else [])
        if i % 500 == 0:
            sched.expire()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"level": "scheduler", "heartbeats_per_s": round(args.n / wall), "cpu_ms_per_heartbeat": round(cpu / args.n * 1e3, 3)}


def wsgi_level(args) -> dict:
    import falcon.testing
    from gpulayer.server.config import ControlPlaneConfig
    from gpulayer.server.http.app import create_app, new_deps
    from gpulayer.server.security.auth import init_home
    home = Path(tempfile.mkdtemp()) / "home"
    tokens = init_home(home)
    deps = new_deps(ControlPlaneConfig(home=home, heartbeat_interval_s=2.0, lease_ttl_s=6.0))
    api = falcon.testing.TestClient(create_app(deps))

    def bearer(token):
        return {"X-GpuLayer-Protocol": "1", "Authorization": f"Bearer {token}"}
    workers = []
    for i in range(args.workers):
        r = api.simulate_post("/v1/workers/register", headers=bearer(tokens["join_token"]), json={
            "name": f"w{i}", "labels": {}, "version": "t",
            "resources": {"cpus": 8, "gpus": 0, "memory_mb": 1000, "gpu_models": []}})
        workers.append((bearer(r.json["session_token"]), []))
    for headers, tasks in workers[:args.busy]:
        api.simulate_post("/v1/jobs", headers=bearer(tokens["client_token"]), json={"command": ["sleep", "1000"]})
        task = api.simulate_post("/v1/worker/acquire", headers=headers, json={}).json["task"]
        api.simulate_post(f"/v1/worker/tasks/{task['task_id']}/start", headers=headers, json={})
        tasks.append(task["task_id"])
    order, lock, lat = iter(range(args.n)), threading.Lock(), []

    def loop():
        mine = []
        while True:
            with lock:
                i = next(order, None)
            if i is None:
                break
            headers, tasks = workers[i % len(workers)]
            t0 = time.perf_counter()
            r = api.simulate_post("/v1/worker/heartbeat", headers=headers, json={"tasks": [
                {"task_id": t, "state": "running", "endpoint": None, "restarts": 0} for t in tasks]})
            mine.append(time.perf_counter() - t0)
            assert r.status_code == 200 and not r.json["cancel_task_ids"], r.text
        with lock:
            lat.extend(mine)
    stop = threading.Event()
    threading.Thread(target=lambda: [deps.scheduler.expire() for _ in iter(lambda: stop.wait(1.0), True)],
                     daemon=True).start()
    t0, c0 = time.perf_counter(), time.process_time()
    callers = [threading.Thread(target=loop) for _ in range(args.threads)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    stop.set()
    lat.sort()
    return {"level": "wsgi", "heartbeats_per_s": round(args.n / wall), "cpu_ms_per_heartbeat": round(cpu / args.n * 1e3, 3),
            "p50_ms": round(lat[len(lat) // 2] * 1e3, 2), "p99_ms": round(lat[int(len(lat) * 0.99)] * 1e3, 2)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]), help="the checkout to measure")
    p.add_argument("--level", choices=["scheduler", "wsgi"], default="scheduler")
    p.add_argument("--workers", type=int, default=400)
    p.add_argument("--busy", type=int, default=40)
    p.add_argument("--n", type=int, default=8000, help="heartbeats timed")
    p.add_argument("--threads", type=int, default=4, help="callers (wsgi)")
    args = p.parse_args(argv)
    _tree(args.tree)
    import os
    result = (scheduler_level if args.level == "scheduler" else wsgi_level)(args)
    print(json.dumps({**result, "tree": args.tree, "loadavg_at_end": round(os.getloadavg()[0], 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
