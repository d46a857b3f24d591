#!/usr/bin/env python3
"""Rolling updates under load (issue 39, points 3 and 5): requests failed while a service's replicas are replaced,
and a failed rollout's time to roll back.

Starts a real control plane (granian, 127.0.0.1) and `--replicas` + 1 real workers (a service's replicas never
share a worker: the surge needs one more), runs a service of `--replicas` replicas behind `--ingress` with a
health path (every `--interval` s, `--failures` in a row), its replica a threaded HTTP/1.1 server on $PORT that
answers its revision, then, with `--clients` threads each GETting through the ingress without a pause the
whole time (keep-alive sessions):

- update: `gpulayer service update JOB --env REV=r2 --wait` (surge one, ready, drain one, ...): the requests
  answered and failed (a connection error, a timeout or a 5xx) from the update to its end, which revisions
  answered, and how long the rollout took;
- failed: `gpulayer service update JOB --env BROKEN=1 --wait` (the new revision's health path answers 500):
  the requests failed meanwhile, which revisions answered (the old one only), and the time from the new
  replica's start (its task_started event) to the rollout turning around (service_update_rolling_back),
  against the health check's failures x interval.

The machine's load (1-minute average) is printed with the figures: it is shared.

    python scripts/bench_rollout.py                          # 3 replicas, 4 clients
    python scripts/bench_rollout.py --replicas 3 --json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from gpulayer.testing import ControlPlaneProcess, wait_for  # noqa: E402

REPLICA = r"""
import http.server, os
REV, BROKEN = os.environ.get("REV", "?").encode(), bool(os.environ.get("BROKEN"))

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *a):
        pass

    def do_GET(self):
        status, body = (500, b"broken") if self.path == "/healthz" and BROKEN else (200, REV)
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024

Server(("0.0.0.0", int(os.environ["PORT"])), H).serve_forever()
"""


class Load:
    """`clients` threads GETting `url` one request after another: answers by body, failures by kind."""

    def __init__(self, url: str, token: str, clients: int):
        self.url, self.headers, self.clients = url, {"Authorization": f"Bearer {token}"}, clients
        self.answers: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def _run(self) -> None:
        with requests.Session() as session:
            while not self.stop.is_set():
                try:
                    r = session.get(self.url, headers=self.headers, timeout=30)
                    key, bad = f"{r.status_code} {r.text[:12]}", r.status_code >= 500
                except requests.RequestException as exc:
                    key, bad = type(exc).__name__, True
                with self.lock:
                    (self.failed if bad else self.answers)[key] += 1

    def snapshot(self) -> tuple[Counter, Counter]:
        with self.lock:
            return Counter(self.answers), Counter(self.failed)

    def __enter__(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)


def _during(load: Load, run) -> dict:
    """What the load saw while `run()` ran: answered and failed requests (by body / kind), and run's result."""
    answers0, failed0 = load.snapshot()
    started = time.monotonic()
    result = run()
    seconds = time.monotonic() - started
    answers1, failed1 = load.snapshot()
    answers, failed = answers1 - answers0, failed1 - failed0
    return {"seconds": round(seconds, 2), "answered": sum(answers.values()), "failed": sum(failed.values()),
            "answers": dict(answers), "failures": dict(failed), "result": result}


def _update(plane: ControlPlaneProcess, job_id: int, *options: str) -> dict:
    done = plane.cli("service", "update", str(job_id), *options, "--wait", "300", timeout=330)
    return {"exit": done.returncode, "said": done.stdout.strip() or done.stderr.strip()}


def run(args) -> dict:
    health = {"http_path": "/healthz", "interval_s": args.interval, "failures": args.failures}
    with ControlPlaneProcess(heartbeat_interval=0.5, lease_ttl=5, args=["--http", "granian"]).start(timeout=120) as plane:
        for i in range(args.replicas + 1):
            plane.start_worker(f"w{i}", timeout=120)
        job_id = plane.submit({"command": [sys.executable, "-c", REPLICA], "env": {"REV": "r1"},
                               "service": {"replicas": args.replicas, "ingress": {}, "health": health}})
        url = f"{plane.url}/ingress/{job_id}/"
        wait_for(lambda: plane.get_json(f"/v1/jobs/{job_id}/endpoints")["ready"], 120, "the replicas to be ready")
        out: dict = {"replicas": args.replicas, "clients": args.clients, "health": health,
                     "cpus": os.cpu_count(), "python": platform.python_version()}
        with Load(url, plane.client_token, args.clients) as load:
            time.sleep(args.warmup)
            out["load_before"] = round(os.getloadavg()[0], 2)
            out["update"] = _during(load, lambda: _update(plane, job_id, "--env", "REV=r2", "--drain", str(args.drain)))
            time.sleep(args.settle)
            out["failed_rollout"] = _during(load, lambda: _update(plane, job_id, "--env", "BROKEN=1"))
            out["load_after"] = round(os.getloadavg()[0], 2)
        events = plane.events(job_id)
        turned = [e for e in events if e["kind"] == "service_update_rolling_back"][-1]
        started = [e for e in events if e["kind"] == "task_started" and e["at"] <= turned["at"]][-1]
        out["failed_rollout"]["rolled_back_after_start_s"] = round(turned["at"] - started["at"], 3)
        out["failed_rollout"]["health_failures_x_interval_s"] = args.failures * args.interval
        finished = next(e for e in events if e["kind"] == "service_update_finished")
        out["update"]["rollout_s"] = finished["data"]["seconds"] if "data" in finished else finished.get("seconds")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--interval", type=float, default=1.0, help="the health check's interval_s")
    parser.add_argument("--failures", type=int, default=3, help="the health check's failures")
    parser.add_argument("--drain", type=float, default=10.0, help="service update --drain")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--settle", type=float, default=3.0, help="seconds between the two updates")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = run(args)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    u, f = out["update"], out["failed_rollout"]
    print(f"{out['replicas']} replicas, {out['clients']} clients, load {out['load_before']} -> {out['load_after']}")
    print(f"rolling update: {u['failed']} failed of {u['answered'] + u['failed']} in {u['seconds']} s "
          f"(rollout {u['rollout_s']} s); answers {u['answers']}; {u['result']['said']}")
    print(f"failed rollout: {f['failed']} failed of {f['answered'] + f['failed']} in {f['seconds']} s; answers "
          f"{f['answers']}; turned around {f['rolled_back_after_start_s']} s after the new replica started "
          f"(health failures x interval {f['health_failures_x_interval_s']} s); {f['result']['said']}")


if __name__ == "__main__":
    main()
