#!/usr/bin/env python3
"""Placement that knows the wiring (issue 40, point 3): its target, through the real scheduler on a real state file.

A generated stream of 1-, 2- and 4-GPU jobs (runtimes 1 to 10 simulated minutes) on one 8-GPU worker whose
NVLink joins GPUs 0-3 and 4-7 (tests/agent/fake_nvml `nvlink_box`, as the agent reports it), run in simulated
time: claims as the worker's acquires make them, finishes at their runtimes. For every 4-GPU task placed while a
whole NVLink set was free: did it get one set (target: always)? Baseline: the same stream on the same box
reported without its topology (the lowest free indices, as before issue 40).

    python scripts/bench_topology.py --jobs 100 --seeds 1 2 3
"""
from __future__ import annotations

import argparse
import heapq
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
from bench_fractions import JOIN, SimClock, scheduler  # noqa: E402

SETS = ({0, 1, 2, 3}, {4, 5, 6, 7})
WIRING = [{"index": i, "nvlink_peers": sorted(SETS[i // 4] - {i}), "pcie_switch": i - i % 2, "numa_node": i // 4}
          for i in range(8)]


def run(workdir: Path, jobs: int, seed: int, wired: bool) -> dict:
    clock = SimClock()
    sched, store = scheduler(workdir, clock)
    body = {"name": "box", "labels": {}, "slots": 8, "version": "bench",
            "resources": {"cpus": 1024, "gpus": 8, "memory_mb": 1 << 22, "gpu_models": []}}
    if wired:
        body["gpu_topology"] = WIRING
    worker = sched.register(body=body, token=JOIN, session_hash="bench", peer_address="127.0.0.1")["worker_id"]
    rng = random.Random(seed)
    runtime = {}
    for _ in range(jobs):
        gpus = rng.choice((1, 1, 2, 4))
        job_id = sched.submit({"command": ["true"], "gpus": gpus, "cpus": 1, "memory_mb": 1})
        runtime[job_id] = rng.uniform(60, 600)
    ends: list[tuple[float, int]] = []
    held: dict[int, list[int]] = {}
    four = on_one_set = 0
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
                heapq.heappush(ends, (clock.now + runtime[a["job_id"]], a["task_id"]))
            if not ends:
                break
            clock.now, task_id = heapq.heappop(ends)
            sched.finish(worker, task_id, exit_code=0, outcome="succeeded", outputs={}, reason=None)
            del held[task_id]
    finally:
        store.close()
    return {"seed": seed, "topology": "reported" if wired else "none", "four_gpu_with_a_set_free": four,
            "on_one_nvlink_set": on_one_set, "share": round(on_one_set / four, 3) if four else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run(Path(tmp), args.jobs, seed, wired) for seed in args.seeds for wired in (True, False)]
    result = {"bench": "topology", "machine": benchlib.machine(), "jobs": args.jobs, "runs": rows}
    benchlib.emit(result, args.json, benchlib.table(rows) + "\n" + benchlib.machine_line(result["machine"]))


if __name__ == "__main__":
    main()
