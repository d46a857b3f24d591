#!/usr/bin/env python3
"""Submit-to-all-endpoints-ready time of a 2-replica service on idle workers.

Starts a real control plane (`gpulayer server start`, plain HTTP on
127.0.0.1) and two real workers (`gpulayer worker start`, each with its own
--state-dir), then, --runs times: submit a 2-replica service
(`python -m http.server $PORT`) through the Python client, poll
GET /v1/jobs/{id}/endpoints every 5 ms until it is ready, check that both
endpoints answer a GET, cancel, and wait until both workers are idle again.

Prints the median and the spread, and the median of each phase taken from
the job's events (submit -> both assigned -> both started -> both endpoints
reported). `--json` prints everything as JSON.

    python scripts/bench_services.py                 # 7 runs, heartbeat interval 2 s (the default)
    python scripts/bench_services.py --runs 15 --json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from gpulayer.testing import ControlPlaneProcess, TimedOut, wait_for  # noqa: E402


def start_workers(fleet: ControlPlaneProcess) -> None:
    """Two workers (--gpus 0, each its own --state-dir) as subprocesses; returns once both are online."""
    for name in ("w1", "w2"):
        fleet.start_worker(name, wait=False, parallel=None, gpus=0)
    fleet.wait_workers_online(2)


def idle(fleet: ControlPlaneProcess) -> bool:
    online = [w for w in fleet.get_json("/v1/workers")["workers"] if w["state"] == "online"]
    return all(w.get("free", {}).get("slots", w.get("free_slots", 1)) >= 1 for w in online)


def phases(job) -> dict:
    """Seconds from submit to: both assigned, both started, both endpoints reported (from events)."""
    events = job.events()
    t0 = next(e["at"] for e in events if e["kind"] == "job_submitted")
    def last(kind, pred=lambda e: True):
        times = [e["at"] for e in events if e["kind"] == kind and pred(e)]
        return max(times) - t0 if times else float("nan")
    return {"assigned_s": last("task_assigned"), "started_s": last("task_started"),
            "reported_s": last("task_reported", lambda e: e["data"].get("endpoint"))}


def one_run(client, fleet: ControlPlaneProcess) -> dict:
    import gpulayer as gl

    spec = gl.service([sys.executable, "-m", "http.server", "--bind", "127.0.0.1"], replicas=2)
    spec["command"] = ["sh", "-c", f'exec {sys.executable} -m http.server --bind 127.0.0.1 "$PORT"']
    wait_for(lambda: idle(fleet), 30, "idle workers")
    began = time.perf_counter()
    job = client.submit(spec)
    endpoints = wait_for(lambda: (lambda a: a["ready"] and a["endpoints"])(
        client.call("GET", f"/jobs/{job.id}/endpoints")), 60, "both endpoints", interval=0.005)
    ready = time.perf_counter() - began
    answered = all(requests.get(f"http://{e}/", timeout=5).ok for e in endpoints)
    job.cancel()
    wait_for(lambda: all(t["state"] not in ("assigned", "running") for t in job.info()["tasks"]), 30,
             "both replicas to stop")
    return {"ready_s": ready, "answered": answered, **phases(job)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="submissions to time (default 7)")
    parser.add_argument("--heartbeat-interval", type=float, default=2.0, help="server --heartbeat-interval (default 2)")
    parser.add_argument("--json", action="store_true", help="print everything as JSON")
    args = parser.parse_args()
    import gpulayer as gl

    try:
        with ControlPlaneProcess(heartbeat_interval=args.heartbeat_interval) as fleet:
            start_workers(fleet)
            client = gl.connect(url=fleet.url, token=fleet.client_token)
            one_run(client, fleet)  # warm-up: imports, page cache
            runs = [one_run(client, fleet) for _ in range(args.runs)]
    except TimedOut as exc:
        raise SystemExit(f"bench_services: {exc}")
    ready = [r["ready_s"] for r in runs]
    result = {
        "runs": runs, "median_ready_s": statistics.median(ready), "min_ready_s": min(ready), "max_ready_s": max(ready),
        "median_phases_s": {k: statistics.median(r[k] for r in runs) for k in ("assigned_s", "started_s", "reported_s")},
        "all_answered": all(r["answered"] for r in runs), "heartbeat_interval_s": args.heartbeat_interval,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_average": os.getloadavg()},
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"2-replica service, idle workers, {args.runs} runs (heartbeat interval {args.heartbeat_interval:g} s)")
        print(f"submit -> all endpoints ready: median {result['median_ready_s'] * 1e3:.0f} ms "
              f"(min {result['min_ready_s'] * 1e3:.0f}, max {result['max_ready_s'] * 1e3:.0f})")
        for name, value in result["median_phases_s"].items():
            print(f"  median {name:<11} {value * 1e3:7.0f} ms after submit")
        print(f"every endpoint answered a GET: {result['all_answered']}; load average {result['machine']['load_average']}")
    return 0 if result["all_answered"] else 1


if __name__ == "__main__":
    sys.exit(main())
