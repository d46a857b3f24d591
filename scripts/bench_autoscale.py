#!/usr/bin/env python3
"""Autoscaling (issue 39, points 1, 2 and 5): a load step, a scale-down under load, a cold start from zero, and
the ingress's throughput with autoscaling on against off.

Starts a real control plane (granian, plain HTTP on 127.0.0.1) and `--workers` real workers (a service's
replicas each need their own), services behind a `public` ingress whose replica (REPLICA: a threaded HTTP/1.1
server on $PORT) answers GET /work after `--work-ms`, and drives them with closed-loop Python clients (threads,
one keep-alive session each) from this process:

- step: a service (min 1, max 4, target `--target` requests in flight per replica, up_after_s `--up-after`) under
  `--target` clients (1x one replica's target), then 4x that: the seconds from the step to the `service_scaled`
  decision and to every replica ready, against `--up-after` + one replica's start (the first replica's, submit
  to ready, in the same run; target: within it);
- down: a service started at 3 replicas (min 1, max 3, down_after_s `--down-after`) under `--target` clients:
  3 -> 1 in one decision, its two newest replicas drained; the requests that failed (a connection error or a
  5xx) over the whole phase (target: 0);
- cold: a service with min 0 whose replica takes `--start-delay` s to listen (a model's load), scaled to zero,
  then one request: its answer time against the replica's own start (a scale-up's task assigned to ready, from
  its events; target: within it + 1 s), `--cold-runs` times;
- throughput: small GETs through the ingress from `--clients` clients for `--seconds`, a one-replica service
  with autoscaling (min 1, max 2, a target it never reaches: the autoscaler samples it every tick) against one
  without, `--runs` times interleaved: req/s medians and their ratio (target >= 0.95).

The step prints where its new replicas' time went from the decision (`decision_to_ready_legs`: queued ->
assigned, assigned -> started, started -> endpoint reported); `--step-runs N` repeats it.

    python scripts/bench_autoscale.py            # about three minutes
    python scripts/bench_autoscale.py --phases step --step-runs 3
    python scripts/bench_autoscale.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from benchlib import machine, machine_line  # noqa: E402

from gpulayer.client.specs import service  # noqa: E402
from gpulayer.testing import ControlPlaneProcess, wait_for  # noqa: E402

REPLICA = r"""
import http.server, os, time
time.sleep(float(os.environ.get("START_DELAY", "0")))
WORK = float(os.environ.get("WORK_MS", "0")) / 1000

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *a):
        pass

    def do_GET(self):
        if self.path.startswith("/work"):
            time.sleep(WORK)
        body = os.environ["GPULAYER_TASK_ID"].encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024

Server(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
"""


class Load:
    """Closed-loop clients GETting `path` through the ingress; answers and failures counted."""

    def __init__(self, url: str):
        self.url, self.ok, self.failed = url, 0, []
        self.latencies: list[float] = []
        self.stopping = threading.Event()
        self.threads: list[tuple[threading.Thread, threading.Event]] = []

    def clients(self, n: int) -> None:
        while len(self.threads) > n:
            self.threads.pop()[1].set()
        while len(self.threads) < n:
            stop = threading.Event()
            thread = threading.Thread(target=self._run, args=(stop,), daemon=True)
            thread.start()
            self.threads.append((thread, stop))

    def _run(self, stop: threading.Event) -> None:
        with requests.Session() as session:
            while not stop.is_set() and not self.stopping.is_set():
                began = time.perf_counter()
                try:
                    answer = session.get(self.url, timeout=60)
                except requests.RequestException as exc:
                    self.failed.append(repr(exc)[:200])
                    continue
                if answer.status_code >= 500:
                    self.failed.append(f"{answer.status_code} {answer.text[:200]}")
                else:
                    self.ok += 1
                    self.latencies.append(time.perf_counter() - began)

    def stop(self) -> None:
        self.stopping.set()
        for thread, _ in self.threads:
            thread.join(timeout=60)
        self.threads.clear()


def _submit(plane, autoscale: dict | None, replicas: int = 1, **env) -> tuple[int, str]:
    spec = service([sys.executable, "-c", REPLICA], ingress="public", replicas=replicas, autoscale=autoscale,
                   env={k: str(v) for k, v in env.items()})
    job_id = plane.submit(spec)
    return job_id, f"{plane.url}/ingress/{job_id}/"


def _ready(plane, job_id: int, n: int, timeout: float = 120) -> float:
    """The time (time.time) when job `job_id` first has `n` replicas ready (an ingress read says so)."""
    def ready():
        job = plane.job(job_id)
        count = job["scaling"]["ready"] if job.get("scaling") else sum(
            t["state"] == "running" and t["endpoint"] is not None for t in job["tasks"])
        return count >= n
    wait_for(ready, timeout, f"{n} replicas of job {job_id} ready", interval=0.05)
    return time.time()


def _events(plane, job_id: int, kind: str) -> list[dict]:
    return [e for e in plane.events(job_id) if e["kind"] == kind]


def _start(plane, job_id: int, task_id: int) -> float:
    """A replica's own start: its task assigned to its endpoint reported (the port answers), from its events."""
    events = [e for e in plane.events(job_id) if e["task_id"] == task_id]
    assigned = next(e["at"] for e in events if e["kind"] == "task_assigned")
    return next(e["at"] for e in events if e["kind"] == "task_reported" and e["data"].get("endpoint")) - assigned


def _breakdown(plane, job_id: int, task_ids: list[int], decided: float) -> dict:
    """Where an added replica's time goes, from the decision (seconds, the slowest replica's of each leg):
    queued -> assigned (a parked acquire wakes and claims), assigned -> started (the agent starts the sandboxed
    process), started -> endpoint reported (the process listens, the agent's probe sees it, a heartbeat tells)."""
    legs: dict[str, list[float]] = {"to_assigned_s": [], "assigned_to_started_s": [], "started_to_endpoint_s": []}
    for task_id in task_ids:
        events = [e for e in plane.events(job_id) if e["task_id"] == task_id]
        assigned = next(e["at"] for e in events if e["kind"] == "task_assigned")
        started = next(e["at"] for e in events if e["kind"] == "task_started")
        ready = next(e["at"] for e in events if e["kind"] == "task_reported" and e["data"].get("endpoint"))
        legs["to_assigned_s"].append(round(assigned - decided, 3))
        legs["assigned_to_started_s"].append(round(started - assigned, 3))
        legs["started_to_endpoint_s"].append(round(ready - started, 3))
    return legs


def step(plane, args) -> dict:
    scale = {"min": 1, "max": 4, "target_concurrency": args.target, "up_after_s": args.up_after, "down_after_s": 600}
    began = time.time()
    job_id, url = _submit(plane, scale, WORK_MS=args.work_ms)
    first_ready = _ready(plane, job_id, 1)
    one_start = first_ready - began
    load = Load(url + "work")
    load.clients(args.target)
    time.sleep(args.up_after + 2)          # 1x: nothing changes
    stepped = time.time()
    load.clients(4 * args.target)
    all_ready = _ready(plane, job_id, 4)
    load.stop()
    decisions = _events(plane, job_id, "service_scaled")
    up = [d for d in decisions if d["data"]["why"] == "up"]
    added = [t for d in up for t in d["data"]["added"]]
    starts = [round(_start(plane, job_id, t), 2) for t in added]
    legs = _breakdown(plane, job_id, added, up[0]["at"]) if up else {}
    plane.cli("job", "cancel", str(job_id))
    wait_for(lambda: all(t["state"] not in ("queued", "assigned", "running") for t in plane.job(job_id)["tasks"]),
             60, "the step's replicas to stop (the next run's first replica starts on a free worker)", interval=0.1)
    return {"one_replica_start_s": round(one_start, 2), "decisions": [(d["data"]["from"], d["data"]["to"]) for d in up],
            "added_replica_starts_s": starts,
            "step_to_decision_s": round(up[0]["at"] - stepped, 2) if up else None,
            "step_to_all_ready_s": round(all_ready - stepped, 2),
            "bound_s": round(args.up_after + one_start, 2), "failed": len(load.failed), "answered": load.ok,
            "decision_to_ready_legs": legs}


def down(plane, args) -> dict:
    scale = {"min": 1, "max": 3, "target_concurrency": args.target, "up_after_s": 600, "down_after_s": args.down_after}
    job_id, url = _submit(plane, scale, replicas=3, WORK_MS=args.work_ms)
    _ready(plane, job_id, 3)
    load = Load(url + "work")
    load.clients(args.target)
    began = time.time()

    def done():
        s = plane.job(job_id)["scaling"]
        return s["replicas"] == 1 and s["draining"] == 0
    wait_for(done, 120, "the scale-down to 1, its drains done", interval=0.1)
    drained = time.time()
    time.sleep(2)                          # the load goes on after the last drain
    load.stop()
    decisions = [(d["data"]["from"], d["data"]["to"]) for d in _events(plane, job_id, "service_scaled")]
    plane.cli("job", "cancel", str(job_id))
    return {"decisions": decisions, "seconds_to_one": round(drained - began, 2), "answered": load.ok,
            "failed": len(load.failed), "failures": load.failed[:5]}


def cold(plane, args) -> dict:
    scale = {"min": 0, "max": 1, "target_concurrency": args.target, "down_after_s": 1, "cold_start_timeout_s": 120}
    job_id, url = _submit(plane, scale, START_DELAY=args.start_delay)
    _ready(plane, job_id, 1)
    runs = []
    for _ in range(args.cold_runs):
        wait_for(lambda: plane.job(job_id)["scaling"]["replicas"] == 0
                 and not any(t["state"] in ("queued", "assigned", "running") for t in plane.job(job_id)["tasks"]),
                 120, "the scale to zero", interval=0.1)
        began = time.perf_counter()
        answer = requests.get(url + "hello", timeout=180)
        took = time.perf_counter() - began
        start = _start(plane, job_id, int(answer.text))
        runs.append({"status": answer.status_code, "answered_s": round(took, 3), "replica_start_s": round(start, 3),
                     "over_start_s": round(took - start, 3)})
    plane.cli("job", "cancel", str(job_id))
    return {"start_delay_s": args.start_delay, "runs": runs,
            "worst_over_start_s": max(r["over_start_s"] for r in runs)}


def hammer(url: str, clients: int, seconds: float) -> float:
    load = Load(url)
    load.clients(clients)
    time.sleep(seconds)
    load.stop()
    return round(load.ok / seconds, 1)


def throughput(plane, args) -> dict:
    on, on_url = _submit(plane, {"min": 1, "max": 2, "target_concurrency": 1000, "up_after_s": 1, "down_after_s": 1})
    off, off_url = _submit(plane, None)
    _ready(plane, on, 1)
    _ready(plane, off, 1)
    hammer(on_url, args.clients, 1.0)
    hammer(off_url, args.clients, 1.0)
    runs = []
    for _ in range(args.runs):
        runs.append({"off": hammer(off_url, args.clients, args.seconds), "on": hammer(on_url, args.clients, args.seconds)})
    for job_id in (on, off):
        plane.cli("job", "cancel", str(job_id))
    off_m, on_m = statistics.median(r["off"] for r in runs), statistics.median(r["on"] for r in runs)
    pairs = [round(r["on"] / r["off"], 3) for r in runs if r["off"]]
    return {"runs": runs, "off_req_per_s": off_m, "on_req_per_s": on_m, "ratio": round(on_m / off_m, 3) if off_m else None,
            "pair_ratios": pairs, "median_pair_ratio": statistics.median(pairs) if pairs else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--target", type=int, default=2, help="target_concurrency (and the 1x load's clients)")
    parser.add_argument("--work-ms", type=float, default=100.0)
    parser.add_argument("--up-after", type=float, default=3.0)
    parser.add_argument("--down-after", type=float, default=5.0)
    parser.add_argument("--start-delay", type=float, default=2.0)
    parser.add_argument("--cold-runs", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--step-runs", type=int, default=1, help="how many load steps (each a service of its own)")
    parser.add_argument("--phases", default="step,down,cold,throughput")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    load_before = os.getloadavg()
    result: dict = {"when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "machine": machine(),
                    "command": " ".join(["python", "scripts/bench_autoscale.py", *sys.argv[1:]]),
                    "load_average_before": load_before}
    phases = {"step": step, "down": down, "cold": cold, "throughput": throughput}
    with ControlPlaneProcess(heartbeat_interval=0.5, lease_ttl=10, args=["--http", "granian"]) as plane:
        for i in range(args.workers):
            plane.start_worker(f"bench-{i}", timeout=120)
        for name in args.phases.split(","):
            if name == "step":
                result["step_runs"] = [step(plane, args) for _ in range(args.step_runs)]
                result["step"] = result["step_runs"][-1]
            else:
                result[name] = phases[name](plane, args)
    result["load_average_after"] = os.getloadavg()
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{result['when']}  {machine_line(result['machine'])}  load {load_before} -> {result['load_average_after']}")
    for s in result.get("step_runs", []):
        print(f"step 1x -> 4x: decision {s['decisions']} {s['step_to_decision_s']} s after the step, all ready "
              f"{s['step_to_all_ready_s']} s (bound: up_after {args.up_after} + one replica start "
              f"{s['one_replica_start_s']} = {s['bound_s']} s; the added replicas' own starts {s['added_replica_starts_s']} s); "
              f"failed {s['failed']}; legs from the decision {s['decision_to_ready_legs']}")
    if "down" in result:
        d = result["down"]
        print(f"down 3 -> 1 under load: {d['decisions']} in {d['seconds_to_one']} s, {d['answered']} answered, "
              f"{d['failed']} failed (target 0)")
    if "cold" in result:
        c = result["cold"]
        print("cold start: " + "; ".join(f"answered {r['answered_s']} s, replica start {r['replica_start_s']} s"
                                         for r in c["runs"]) + f" (worst over start {c['worst_over_start_s']} s; target <= 1 s)")
    if "throughput" in result:
        t = result["throughput"]
        print(f"throughput, {args.clients} clients: off {t['off_req_per_s']} req/s, on {t['on_req_per_s']} req/s, "
              f"ratio {t['ratio']}, pairs {t['pair_ratios']} (target >= 0.95)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
