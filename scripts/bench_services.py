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
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
CLI = [sys.executable, "-m", "gpulayer.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(**extra) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    clean["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), clean.get("PYTHONPATH")]))
    return {**clean, **extra}


def wait_for(predicate, timeout: float, what: str, every: float = 0.005):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"bench_services: timed out waiting for {what}")
        time.sleep(every)


class Fleet:
    """One server and two workers as subprocesses in a temporary directory."""

    def __init__(self, root: Path, heartbeat_interval: float):
        self.root, self.procs = root, []
        home = root / "home"
        tokens = json.loads(subprocess.run([*CLI, "server", "init", "--home", str(home), "--json"], env=env(),
                                           capture_output=True, text=True, check=True).stdout)
        self.token = tokens["client_token"]
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self._spawn("server", [*CLI, "server", "start", "--home", str(home), "--port", str(port),
                               "--heartbeat-interval", str(heartbeat_interval)], env())
        wait_for(self._healthy, 30, "the control plane")
        for name in ("w1", "w2"):
            self._spawn(name, [*CLI, "--url", self.url, "worker", "start", "--name", name, "--gpus", "0",
                               "--state-dir", str(root / name)],
                        env(GPULAYER_JOIN_TOKEN=tokens["join_token"], GPULAYER_ARTIFACT_CACHE=str(root / f"{name}-cache")))
        wait_for(lambda: len(self.online()) == 2, 30, "two workers online", every=0.1)

    def _spawn(self, name, argv, environment):
        log = open(self.root / f"{name}.log", "w")
        self.procs.append(subprocess.Popen(argv, env=environment, stdout=log, stderr=subprocess.STDOUT))

    def _healthy(self) -> bool:
        try:
            return requests.get(f"{self.url}/v1/health", timeout=1).ok
        except requests.RequestException:
            return False

    def online(self) -> list:
        answer = requests.get(f"{self.url}/v1/workers", headers={"Authorization": f"Bearer {self.token}"}, timeout=5)
        return [w for w in answer.json()["workers"] if w["state"] == "online"]

    def idle(self) -> bool:
        return all(w.get("free", {}).get("slots", w.get("free_slots", 1)) >= 1 for w in self.online())

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


def phases(job) -> dict:
    """Seconds from submit to: both assigned, both started, both endpoints reported (from events)."""
    events = job.events()
    t0 = next(e["at"] for e in events if e["kind"] == "job_submitted")
    def last(kind, pred=lambda e: True):
        times = [e["at"] for e in events if e["kind"] == kind and pred(e)]
        return max(times) - t0 if times else float("nan")
    return {"assigned_s": last("task_assigned"), "started_s": last("task_started"),
            "reported_s": last("task_reported", lambda e: e["data"].get("endpoint"))}


def one_run(client, fleet: Fleet) -> dict:
    import gpulayer as gl

    spec = gl.service([sys.executable, "-m", "http.server", "--bind", "127.0.0.1"], replicas=2)
    spec["command"] = ["sh", "-c", f'exec {sys.executable} -m http.server --bind 127.0.0.1 "$PORT"']
    wait_for(fleet.idle, 30, "idle workers", every=0.05)
    began = time.perf_counter()
    job = client.submit(spec)
    endpoints = wait_for(lambda: (lambda a: a["ready"] and a["endpoints"])(
        client.call("GET", f"/jobs/{job.id}/endpoints")), 60, "both endpoints")
    ready = time.perf_counter() - began
    answered = all(requests.get(f"http://{e}/", timeout=5).ok for e in endpoints)
    job.cancel()
    wait_for(lambda: all(t["state"] not in ("assigned", "running") for t in job.info()["tasks"]), 30,
             "both replicas to stop", every=0.05)
    return {"ready_s": ready, "answered": answered, **phases(job)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="submissions to time (default 7)")
    parser.add_argument("--heartbeat-interval", type=float, default=2.0, help="server --heartbeat-interval (default 2)")
    parser.add_argument("--json", action="store_true", help="print everything as JSON")
    args = parser.parse_args()
    import gpulayer as gl

    with tempfile.TemporaryDirectory(prefix="bench-services-") as tmp:
        fleet = Fleet(Path(tmp), args.heartbeat_interval)
        try:
            client = gl.connect(url=fleet.url, token=fleet.token)
            one_run(client, fleet)  # warm-up: imports, page cache
            runs = [one_run(client, fleet) for _ in range(args.runs)]
        finally:
            fleet.stop()
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
