#!/usr/bin/env python3
"""Placement that knows the wiring (issue 40, point 3): its target, through the real scheduler on a real state file.

A generated stream of 1-, 2- and 4-GPU jobs (runtimes 1 to 10 simulated minutes) on one 8-GPU worker whose
NVLink joins GPUs 0-3 and 4-7 (tests/agent/fake_nvml `nvlink_box`, as the agent reports it), run in simulated
time: claims as the worker's acquires make them, finishes at their runtimes. For every 4-GPU task placed while a
whole NVLink set was free: did it get one set (target: always)? Baseline: the same stream on the same box
reported without its topology (the lowest free indices, as before issue 40).

--required: the same stream with every 2- and 4-GPU job requiring NVLink (`gpu_link` nvlink), and as baseline
the same stream preferring it (the default), on the box with its topology: how many multi-GPU tasks were placed
and how many on one NVLink set (target with the requirement: all, every one waiting for a set).
--acquire: the one-task claim of a `gpu_link` nvlink 2-GPU task on the box (acquire, its task started and
finished, another queued) behind --small and --large queued tasks no worker can take (half 16 whole GPUs, half
8 GPUs of one NVLink set, which no set of 4 holds), the two interleaved (as bench_fractions.py --only acquire;
issue 40's target: the large one at most 1.2x).

    python scripts/bench_topology.py --jobs 100 --seeds 1 2 3
    python scripts/bench_topology.py --jobs 100 --seeds 1 2 3 --required
    python scripts/bench_topology.py --acquire --small 200 --large 20000 --claims 300 --json
"""
from __future__ import annotations

import argparse
import heapq
import os
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
import bench_fractions  # noqa: E402
from bench_fractions import JOIN, SimClock, scheduler  # noqa: E402

SETS = ({0, 1, 2, 3}, {4, 5, 6, 7})
WIRING = [{"index": i, "nvlink_peers": sorted(SETS[i // 4] - {i}), "pcie_switch": i - i % 2, "numa_node": i // 4}
          for i in range(8)]


def box(sched, wired: bool) -> int:
    """The 8-GPU box registered, with its topology or without; its worker id."""
    body = {"name": "box", "labels": {}, "slots": 8, "version": "bench",
            "resources": {"cpus": 1024, "gpus": 8, "memory_mb": 1 << 22, "gpu_models": []}}
    if wired:
        body["gpu_topology"] = WIRING
    return sched.register(body=body, token=JOIN, session_hash="bench", peer_address="127.0.0.1")["worker_id"]


def run(workdir: Path, jobs: int, seed: int, wired: bool, required: bool = False) -> dict:
    clock = SimClock()
    sched, store = scheduler(workdir, clock)
    worker = box(sched, wired)
    rng = random.Random(seed)
    runtime = {}
    for _ in range(jobs):
        gpus = rng.choice((1, 1, 2, 4))
        link = {"gpu_link": "nvlink"} if required and gpus > 1 else {}
        job_id = sched.submit({"command": ["true"], "gpus": gpus, "cpus": 1, "memory_mb": 1, **link})
        runtime[job_id] = rng.uniform(60, 600)
    ends: list[tuple[float, int]] = []
    held: dict[int, list[int]] = {}
    four = on_one_set = linked = linked_on_one_set = 0
    try:
        while True:
            while True:
                free_sets = sum(1 for s in SETS if not s & {g for gs in held.values() for g in gs})
                got = sched.acquire_many(worker, 0, 1)
                if not got:
                    break
                a = got[0]
                sched.start(worker, a["task_id"], 1)
                held[a["task_id"]] = a["gpus"]
                if len(a["gpus"]) == 4 and free_sets:
                    four += 1
                    on_one_set += set(a["gpus"]) in SETS
                if len(a["gpus"]) > 1:
                    linked += 1
                    linked_on_one_set += any(set(a["gpus"]) <= s for s in SETS)
                heapq.heappush(ends, (clock.now + runtime[a["job_id"]], a["task_id"]))
            if not ends:
                break
            clock.now, task_id = heapq.heappop(ends)
            sched.finish(worker, task_id, exit_code=0, outcome="succeeded", outputs={}, reason=None)
            del held[task_id]
    finally:
        store.close()
    out = {"seed": seed, "topology": "reported" if wired else "none", "four_gpu_with_a_set_free": four,
           "on_one_nvlink_set": on_one_set, "share": round(on_one_set / four, 3) if four else None}
    out.update(gpu_link="nvlink" if required else "-", multi_gpu_placed=linked, multi_gpu_on_one_set=linked_on_one_set)
    return out


class Backlog(bench_fractions.Backlog):
    """bench_fractions.py's backlog on the NVLink box: `queued` tasks no worker can take (half 16 whole GPUs,
    half 8 GPUs of one NVLink set) ahead of `gpu_link` nvlink 2-GPU tasks the box takes, each on one set."""

    def add_worker(self) -> int:
        return box(self.sched, True)

    def blocked(self, i: int) -> dict:
        return {"gpus": 8, "gpu_link": "nvlink"} if i % 2 else {"gpus": 16}

    def one_more(self) -> None:
        self.sched.submit({"command": ["true"], "gpus": 2, "gpu_link": "nvlink"})

    def check(self, assigned: dict) -> None:
        if len(assigned["gpus"]) != 2 or not any(set(assigned["gpus"]) <= s for s in SETS):
            raise AssertionError(f"a gpu_link nvlink task got {assigned['gpus']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--required", action="store_true", help="2- and 4-GPU jobs require NVLink")
    parser.add_argument("--acquire", action="store_true", help="the claim behind --small and --large backlogs")
    parser.add_argument("--small", type=int, default=200)
    parser.add_argument("--large", type=int, default=20_000)
    parser.add_argument("--claims", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        if args.acquire:
            found = bench_fractions.acquire(Path(tmp), args.small, args.large, args.claims, Backlog)
            result = {"bench": "topology_acquire", "machine": benchlib.machine(), "load": load, **found,
                      "load_after": os.getloadavg()}
            benchlib.emit(result, args.json, "\n".join(f"{k}: {v}" for k, v in result.items()))
            return
        cases = ((True, True), (True, False)) if args.required else ((True, False), (False, False))
        rows = [run(Path(tmp), args.jobs, seed, wired, required) for seed in args.seeds for wired, required in cases]
    result = {"bench": "topology", "machine": benchlib.machine(), "jobs": args.jobs, "runs": rows,
              "load": load, "load_after": os.getloadavg()}
    benchlib.emit(result, args.json, benchlib.table(rows) + "\n" + benchlib.machine_line(result["machine"]))


if __name__ == "__main__":
    main()
