#!/usr/bin/env python3
"""Load with chaos: a simulated fleet and submitters against a real control plane.

    python scripts/chaos.py                       # the full run: 200 workers, 10 submitters, 60 s
    python scripts/chaos.py --workers 50 --seconds 20 --processes 2 --submitters 5   # what CI runs

A real `gpulayer server start` process (plain HTTP on 127.0.0.1). Simulated
workers (tests/faultlib.SimWorker: register, heartbeat, acquire, start,
finish over plain HTTP, no task processes) run as threads in --processes
processes; --kill-rate of the tasks they take end with their worker "SIGKILLed":
it stops heartbeating and never finishes, and a fresh worker registers in its
place. Submitters queue jobs (max_attempts 3) and cancel a random earlier job
on --cancel-rate of their submits.

Once a second during the run the live state file is sampled for a task held by
a worker that is not online. At the end the load stops, the leases of every
silent worker expire, and tests/invariants.sql plus the event-log replay
(faultlib.check_state) must hold: at most one running attempt of a task at a
time, every acknowledged job present and ended or still queued/running with a
task that can move, no lease outliving its worker. Prints throughput and
p50/p99 latencies per call; exit status 1 when an invariant broke or the
server answered 5xx.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))   # faultlib, beside the tests
import apsw  # noqa: E402
import requests  # noqa: E402

from faultlib import (INVARIANTS, Recorder, SimWorker, check_state, job_states, percentile,  # noqa: E402
                      submit_storm)
from gpulayer.testing import ControlPlaneProcess  # noqa: E402


def fleet_process(url: str, join_token: str, names: list[str], seconds: float, kill_rate: float, seed: int,
                  out: mp.Queue) -> None:
    """One process of simulated workers, each a thread; puts its Recorder's figures on `out`."""
    rec = Recorder()
    deadline = time.monotonic() + seconds
    stop = threading.Event()

    def run(name: str, rng: random.Random) -> None:
        generation = 0
        worker = SimWorker(url, join_token, name, rec, rng=rng)
        while time.monotonic() < deadline:
            try:
                if worker.worker_id is None:
                    worker.register()
                had = worker.current
                pause = worker.step(acquire_wait_s=0.5)
                if worker.current is not None and had is None and rng.random() < kill_rate:
                    stop.wait(rng.uniform(0, 0.3))
                    worker.die()
                    generation += 1
                    worker = SimWorker(url, join_token, f"{name}-r{generation}", rec, rng=rng)
                    continue
                stop.wait(min(pause, max(0.0, deadline - time.monotonic())))
            except requests.RequestException as exc:
                rec.count[f"unreachable_{type(exc).__name__}"] += 1
                stop.wait(0.1)

    threads = [threading.Thread(target=run, args=(n, random.Random(seed * 100_003 + i)), daemon=True)
               for i, n in enumerate(names)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 30)
    out.put(rec.as_dict())


def submit_process(url: str, token: str, threads: int, seconds: float, cancel_rate: float, seed: int,
                   out: mp.Queue) -> None:
    """The submitters, one thread each; puts their figures and acknowledged ids on `out`."""
    rec = Recorder()
    stop = threading.Event()
    acked: list[int] = []
    loops = [threading.Thread(target=submit_storm, args=(url, token, stop, acked, rec),
                              kwargs={"cancel_rate": cancel_rate, "pause_s": (0.0, 0.05),
                                      "rng": random.Random(seed + i)}, daemon=True) for i in range(threads)]
    for t in loops:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in loops:
        t.join(30)
    out.put({**rec.as_dict(), "acked": acked})


def sample(state: Path, stop: threading.Event, seen: list[str]) -> None:
    """Once a second: is any task held by a worker that is not online (a lease outliving its worker)?"""
    while not stop.wait(1.0):
        try:
            conn = apsw.Connection(f"file:{state}?mode=ro", flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
            conn.set_busy_timeout(5000)
            for name in ("active_task_without_live_worker", "two_active_copies"):
                bad = conn.execute(INVARIANTS[name]).fetchall()
                if bad:
                    seen.append(f"{name} (live sample): {bad[:3]}")
            conn.close()
        except apsw.Error as exc:
            seen.append(f"sample failed: {exc}")


def run(args) -> dict:
    root = Path(args.home or tempfile.mkdtemp(prefix="gpulayer-chaos-"))
    srv = ControlPlaneProcess(root, heartbeat_interval=args.heartbeat, lease_ttl=args.ttl).start()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    names = [f"sim-{i:03d}" for i in range(args.workers)]
    fleet = [ctx.Process(target=fleet_process, args=(srv.url, srv.tokens["join_token"], names[p::args.processes],
                                                      args.seconds, args.kill_rate, args.seed + p, out))
             for p in range(args.processes)]
    submitters = ctx.Process(target=submit_process, args=(srv.url, srv.tokens["client_token"], args.submitters,
                                                          args.seconds, args.cancel_rate, args.seed, out))
    live: list[str] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample, args=(srv.state, stop, live), daemon=True)
    began = time.monotonic()
    for p in fleet + [submitters]:
        p.start()
    sampler.start()
    rec, acked = Recorder(), []
    for _ in fleet + [submitters]:
        got = out.get(timeout=args.seconds + 120)
        acked += got.pop("acked", [])
        rec.merge(got)
    elapsed = time.monotonic() - began
    for p in fleet + [submitters]:
        p.join(30)
    time.sleep(args.ttl + 2 * args.heartbeat + 1)   # every silent worker's lease expires; upkeep acts
    stop.set()
    sampler.join(5)
    srv.stop()
    violations = live + check_state(srv.state, acknowledged=set(acked))
    lat = {op: {"n": len(v), "p50_ms": round(percentile(v, 50) * 1000, 1), "p99_ms": round(percentile(v, 99) * 1000, 1)}
           for op, v in sorted(rec.latency.items())}
    finished = rec.count.get("finished_accepted", 0)
    return {
        "command": " ".join(sys.argv),
        "workers": args.workers, "processes": args.processes, "submitters": args.submitters,
        "seconds": round(elapsed, 1), "heartbeat_s": args.heartbeat, "lease_ttl_s": args.ttl,
        "acknowledged_jobs": len(acked), "submits_per_s": round(len(acked) / elapsed, 1),
        "tasks_finished": finished, "tasks_finished_per_s": round(finished / elapsed, 1),
        "late_finishes": rec.count.get("finished_late", 0),
        "workers_killed": rec.count.get("workers_killed", 0),
        "cancels": rec.count.get("cancel_200", 0),
        "server_errors": rec.count.get("server_errors", 0) + sum(n for k, n in rec.count.items()
                                                               if k.startswith("submit_5") or k.startswith("cancel_5")),
        "unreachable": sum(n for k, n in rec.count.items() if "unreachable" in k),
        "job_states": job_states(srv.state),
        "latency": lat,
        "violations": violations,
        "state_file": str(srv.state),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=200, help="simulated workers (default 200)")
    parser.add_argument("--processes", type=int, default=4, help="processes the workers are spread over (default 4)")
    parser.add_argument("--submitters", type=int, default=10, help="submitter threads (default 10)")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the load runs (default 60)")
    parser.add_argument("--kill-rate", type=float, default=0.02, help="share of taken tasks whose worker is killed")
    parser.add_argument("--cancel-rate", type=float, default=0.05, help="share of submits followed by a cancel")
    parser.add_argument("--heartbeat", type=float, default=1.0, help="--heartbeat-interval of the server")
    parser.add_argument("--ttl", type=float, default=4.0, help="--lease-ttl of the server")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--home", help="folder for the server's home and logs (default: a new temporary one)")
    parser.add_argument("--json", help="also write the report as JSON to this file")
    args = parser.parse_args(argv)
    report = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(f"{report['workers']} workers in {report['processes']} processes, {report['submitters']} submitters, "
          f"{report['seconds']} s (heartbeat {report['heartbeat_s']} s, TTL {report['lease_ttl_s']} s)")
    print(f"acknowledged jobs {report['acknowledged_jobs']} ({report['submits_per_s']}/s), tasks finished "
          f"{report['tasks_finished']} ({report['tasks_finished_per_s']}/s), workers killed {report['workers_killed']}, "
          f"cancels {report['cancels']}, late finishes {report['late_finishes']}, 5xx {report['server_errors']}, "
          f"unreachable {report['unreachable']}")
    print(f"jobs by state at the end: {report['job_states']}")
    for op, figures in report["latency"].items():
        print(f"  {op:<11} n={figures['n']:<7} p50={figures['p50_ms']:>7} ms  p99={figures['p99_ms']:>7} ms")
    for violation in report["violations"]:
        print(f"VIOLATION {violation}")
    print("invariants: " + ("all held" if not report["violations"] else f"{len(report['violations'])} broken"))
    return 1 if report["violations"] or report["server_errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
