#!/usr/bin/env python3
"""Fractions of a GPU (issue 40, point 1): its three targets, through the real scheduler on a real state file.

  pack           16 jobs of `gpu_fraction 0.25` on a 4-GPU worker sharing its GPUs with MPS: how many run at
                 once and on how many GPUs (target: all 16, on exactly 4). tests/integration/test_gpu_shares_end_to_end.py
                 does the same with a real control plane and worker processes.
  fragmentation  a generated stream of fractional (0.1 to 0.75) and whole-GPU (1 or 2) jobs on one 8-GPU
                 worker, run in simulated time (finishes at their runtimes, claims as a worker's acquires
                 make them): GPU-hours lost to fragmentation, that is the room left on GPUs that shares hold
                 while a whole-GPU job waits for want of a whole GPU, against an offline best-fit simulation of
                 the same stream in the same order (target: at most 1.05x)
  acquire        the one-task claim of a fractional task (acquire, then its task started and finished) behind
                 --small and --large queued tasks no worker can take, shares of a GPU and whole GPUs (as
                 bench_sql.py --backlog; target: the large one at most 1.2x), the two interleaved

    python scripts/bench_fractions.py                 # all three
    python scripts/bench_fractions.py --only acquire --large 20000 --json
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

from gpulayer.server.config import ControlPlaneConfig  # noqa: E402
from gpulayer.server.scheduler.core import Scheduler  # noqa: E402
from gpulayer.server.scheduler.placement import best_fit  # noqa: E402
from gpulayer.server.security.auth import Principal, init_home  # noqa: E402
from gpulayer.server.store.db import Store  # noqa: E402

JOIN = Principal(kind="join", jti="server-join", name="server")
FRACTIONS = (0.1, 0.25, 0.5, 0.75)


class SimClock:
    def __init__(self, now: float = 1_700_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def scheduler(workdir: Path, clock) -> tuple[Scheduler, Store]:
    home = workdir / f"home-{time.monotonic_ns()}"
    home.mkdir(parents=True)
    init_home(home)
    config = ControlPlaneConfig(home=home)
    store = Store(config.layout.state)
    return Scheduler(store, config, clock), store


def add_worker(sched: Scheduler, gpus: int, slots: int) -> int:
    body = {"name": "w", "labels": {}, "slots": slots, "version": "bench",
            "resources": {"cpus": 1024, "gpus": gpus, "memory_mb": 1 << 22, "gpu_models": [],
                          "gpu_sharing": "mps", "gpu_memory_mb": 81920}}
    return sched.register(body=body, token=JOIN, session_hash="bench", peer_address="127.0.0.1")["worker_id"]


def take_all(sched: Scheduler, worker: int) -> list[dict]:
    taken = []
    while True:
        got = sched.acquire_many(worker, 0, 16)
        for a in got:
            sched.start(worker, a["task_id"], 1)
        taken += got
        if len(got) < 16:
            return taken


def pack(workdir: Path) -> dict:
    sched, store = scheduler(workdir, time.time)
    try:
        worker = add_worker(sched, 4, 64)
        for _ in range(16):
            sched.submit({"command": ["true"], "gpu_fraction": 0.25})
        taken = take_all(sched, worker)
        return {"running": len(taken), "gpus": len({a["gpus"][0] for a in taken}), "target": "16 on 4"}
    finally:
        store.close()


def stream(n: int, seed: int) -> list[dict]:
    """Jobs arriving over time: 2 in 3 a share, else 1 or 2 whole GPUs; runtimes 5 to 60 minutes."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for _ in range(n):
        t += rng.expovariate(1 / 90)
        whole = rng.random() < 1 / 3
        out.append({"at": t, "runtime": rng.uniform(300, 3600), "gpus": rng.choice((1, 1, 2)) if whole else 0,
                    "fraction": 0.0 if whole else rng.choice(FRACTIONS)})
    return out


def lost(held: dict[int, float], free_whole: int, waiting_whole: bool, dt: float) -> float:
    """GPU-seconds lost to fragmentation over dt: the room on GPUs shares hold, while a whole-GPU job waits
    and no whole GPU is free for it."""
    if not waiting_whole or free_whole > 0:
        return 0.0
    return sum(1 - used for used in held.values()) * dt


def simulate(jobs: list[dict], gpus: int, step: float, place) -> float:
    """Run `jobs` in time steps; `place(t, queue, running)` places what it can. GPU-hours lost."""
    loss, t, i = 0.0, 0.0, 0
    queue: list[dict] = []
    end = max(j["at"] for j in jobs) + 4 * 3600
    while t < end:
        while i < len(jobs) and jobs[i]["at"] <= t:
            queue.append(jobs[i])
            i += 1
        held, free_whole = place(t, queue)
        loss += lost(held, free_whole, any(j["gpus"] for j in queue), step)
        t += step
    return loss / 3600


def offline(jobs: list[dict], gpus: int, step: float) -> float:
    """The reference: the same queue order (first come), every job that fits placed, shares by best fit."""
    running: list[tuple[float, dict, list[int]]] = []
    whole: set[int] = set()
    shares: dict[int, float] = {}

    def place(t: float, queue: list[dict]):
        for item in [r for r in running if r[0] <= t]:
            running.remove(item)
            for g in item[2]:
                if item[1]["fraction"]:
                    shares[g] -= item[1]["fraction"]
                    if shares[g] < 1e-9:
                        del shares[g]
                else:
                    whole.discard(g)
        for job in list(queue):
            free = [g for g in range(gpus) if g not in whole and g not in shares]
            if job["fraction"]:
                g = best_fit(shares, free, job["fraction"])
                if g is None:
                    continue
                shares[g] = shares.get(g, 0) + job["fraction"]
                got = [g]
            elif len(free) >= job["gpus"]:
                got = free[:job["gpus"]]
                whole.update(got)
            else:
                continue
            queue.remove(job)
            running.append((t + job["runtime"], job, got))
        return dict(shares), gpus - len(whole) - len(shares)

    return simulate(jobs, gpus, step, place)


def online(jobs: list[dict], gpus: int, step: float, workdir: Path) -> float:
    """The scheduler itself, in the same steps: finishes due, arrivals submitted, then the worker's acquires
    until it gets nothing; what its state file holds then is measured as `offline`'s is. GPU-hours lost."""
    clock = SimClock()
    start = clock.now
    sched, store = scheduler(workdir, clock)
    runtime: dict[int, float] = {}
    running: dict[int, float] = {}
    loss, t, i = 0.0, 0.0, 0
    end = max(j["at"] for j in jobs) + 4 * 3600
    try:
        worker = add_worker(sched, gpus, 256)
        while t < end:
            clock.now = start + t
            for task_id in [k for k, ends in running.items() if ends <= t]:
                sched.finish(worker, task_id, exit_code=0, outcome="succeeded", outputs={}, reason=None)
                del running[task_id]
            while i < len(jobs) and jobs[i]["at"] <= t:
                job = jobs[i]
                spec = {"command": ["true"], **({"gpu_fraction": job["fraction"]} if job["fraction"] else
                                                {"gpus": job["gpus"]})}
                runtime[sched.submit(spec)] = job["runtime"]
                i += 1
            for a in take_all(sched, worker):
                running[a["task_id"]] = t + runtime[a["job_id"]]
            held, free, waiting = store.read(measure, worker)
            loss += lost(held, free, waiting, step)
            t += step
        return loss / 3600
    finally:
        store.close()


def measure(conn, worker: int) -> tuple[dict[int, float], int, bool]:
    """The shares held on each GPU, the free whole GPUs, whether a whole-GPU job waits."""
    held = {r["i"]: r["used"] for r in conn.execute(
        "SELECT x.value AS i, sum(t.gpu_share) AS used FROM tasks t, json_each(t.gpu_indices) x "
        "WHERE t.worker_id = ? AND t.state IN ('assigned', 'running') AND t.gpu_share > 0 GROUP BY 1",
        (worker,)).fetchall()}
    free = conn.execute("SELECT free_gpus FROM worker_load WHERE worker_id = ?", (worker,)).fetchall()[0]["free_gpus"]
    waiting = conn.execute("SELECT 1 FROM jobs WHERE state = 'queued' AND gpus > 0 LIMIT 1").fetchall()
    return held, free, bool(waiting)


def fragmentation(workdir: Path, n: int, seed: int, gpus: int = 8, step: float = 60.0) -> dict:
    jobs = stream(n, seed)
    reference = offline(jobs, gpus, step)
    real = online(jobs, gpus, step, workdir)
    ratio = real / reference if reference else (1.0 if real == 0 else float("inf"))
    return {"jobs": n, "seed": seed, "gpus": gpus, "lost_gpu_hours": round(real, 3),
            "offline_best_fit_gpu_hours": round(reference, 3), "ratio": round(ratio, 3), "target": "<= 1.05"}


class Backlog:
    """A state file with `queued` tasks queued that no worker can take (as bench_sql.py --backlog: half shares
    of more GPU memory than any GPU has, half 16 whole GPUs) ahead of fractional tasks an 8-GPU worker sharing
    its GPUs takes; each timed claim takes one of those, which ends at once and is queued again."""

    def __init__(self, workdir: Path, queued: int):
        self.sched, self.store = scheduler(workdir, time.time)
        self.worker = self.add_worker()
        self.rng = random.Random(7)
        self.queued, self.times = queued, []
        for i in range(queued):
            self.sched.submit({"command": ["true"], **self.blocked(i)})
        for _ in range(8):
            self.one_more()
        self.store.write(lambda conn: conn.execute("ANALYZE"))

    def add_worker(self) -> int:
        return add_worker(self.sched, 8, 64)

    def blocked(self, i: int) -> dict:
        """The size of the i-th queued task that no worker can take."""
        return {"gpu_memory_mb": 200_000} if i % 2 else {"gpus": 16}

    def one_more(self) -> None:
        self.sched.submit({"command": ["true"], "gpu_fraction": self.rng.choice(FRACTIONS)})

    def claim(self) -> None:
        t0 = time.perf_counter()
        a = self.sched.acquire(self.worker)
        self.times.append(time.perf_counter() - t0)
        self.check(a)
        self.sched.start(self.worker, a["task_id"], 1)
        self.sched.finish(self.worker, a["task_id"], exit_code=0, outcome="succeeded", outputs={}, reason=None)
        self.one_more()

    def check(self, assigned: dict) -> None:
        """Raise when the claim gave what it should not (a subclass's rule)."""

    def result(self) -> dict:
        self.store.close()
        return {"queued": self.queued, "claims": len(self.times),
                "median_ms": round(statistics.median(self.times) * 1000, 3),
                "p99_ms": round(benchlib.percentile(self.times, 99) * 1000, 3)}


def acquire(workdir: Path, small: int, large: int, claims: int, kind: type[Backlog] = Backlog) -> dict:
    """The one-task claim at both backlogs, interleaved (a busy machine's noise falls on both alike)."""
    backlogs = [kind(workdir, small), kind(workdir, large)]
    for _ in range(claims):
        for backlog in backlogs:
            backlog.claim()
    low, high = (b.result() for b in backlogs)
    return {"small": low, "large": high, "ratio": round(high["median_ms"] / low["median_ms"], 3), "target": "<= 1.2"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=("pack", "fragmentation", "acquire"), default=None)
    p.add_argument("--jobs", type=int, default=400, help="jobs in the generated stream (default 400)")
    p.add_argument("--seeds", type=lambda v: [int(x) for x in v.split(",")], default=[1, 2, 3])
    p.add_argument("--small", type=int, default=200, help="queued tasks, the small backlog (default 200)")
    p.add_argument("--large", type=int, default=20_000, help="queued tasks, the large backlog (default 20000)")
    p.add_argument("--claims", type=int, default=300, help="timed claims per backlog (default 300)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    result: dict = {"machine": benchlib.machine(), "load": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if args.only in (None, "pack"):
            result["pack"] = pack(workdir)
        if args.only in (None, "fragmentation"):
            result["fragmentation"] = [fragmentation(workdir, args.jobs, seed) for seed in args.seeds]
        if args.only in (None, "acquire"):
            result["acquire"] = acquire(workdir, args.small, args.large, args.claims)
    result["load_after"] = os.getloadavg()
    benchlib.emit(result, args.json, "\n".join(f"{k}: {v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
