#!/usr/bin/env python3
"""Service ingress (issue 26): small GETs through the control plane's ingress against direct to the replica,
and many server-sent-event streams at once.

Starts a real control plane (granian, TLS on 127.0.0.1) and one real worker (its default sandbox), runs a
one-replica service with `--ingress` (a token) whose replica is a threaded HTTP/1.1 server on $PORT (the
worker's own network, so the direct baseline can reach it), then:

- gets: `--clients` threads, each with its own keep-alive session, GET a 13-byte answer for `--seconds`,
  through `ingress_url` (client -> control plane over TLS -> relay -> agent -> replica, one relay stream and
  one replica connection per request) and direct to the replica's endpoint (plain HTTP, keep-alive): req/s and
  latency p50/p99 of each, `--runs` times interleaved, medians, and the ratio (ingress req/s / direct req/s;
  the issue's targets: >= 0.3, p99 <= 20 ms);
- sse: `--streams` streams opened at once through the ingress, each `--events` events 50 ms apart: how many
  completed whole, time to the first event p50/p99, and the control plane's RSS during them.

    python scripts/bench_ingress.py                  # 4 clients, 5 s, 3 runs, 200 SSE streams
    python scripts/bench_ingress.py --runs 1 --json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from gpulayer.testing import ControlPlaneProcess, wait_for  # noqa: E402

REPLICA = r"""
import http.server, os, time

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # the head and the body are two writes: no delayed-ACK stall between them

    def log_message(self, *a):
        pass

    def do_GET(self):
        if self.path.startswith("/sse"):
            n = int(self.path.split("n=")[1])
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for i in range(n):
                self.wfile.write(f"data: {i}\n\n".encode())
                self.wfile.flush()
                time.sleep(0.05)
            self.close_connection = True
            return
        body = b"hello, world\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024

Server(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
"""


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def hammer(url: str, clients: int, seconds: float, headers: dict, verify) -> dict:
    """`clients` threads GETting `url` for `seconds`: req/s, latency p50/p99 (ms), errors."""
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    stop = time.perf_counter() + seconds
    start = threading.Barrier(clients)

    def one() -> None:
        session = requests.Session()
        session.headers.update(headers)
        mine = []
        start.wait()
        while time.perf_counter() < stop:
            began = time.perf_counter()
            try:
                answer = session.get(url, verify=verify, timeout=30)
                ok = answer.status_code == 200 and answer.content == b"hello, world\n"
            except requests.RequestException:
                ok = False
            if ok:
                mine.append(time.perf_counter() - began)
            else:
                with lock:
                    errors[0] += 1
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=one) for _ in range(clients)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    ordered = sorted(latencies)
    return {
        "requests": len(latencies),
        "errors": errors[0],
        "req_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(1000 * ordered[len(ordered) // 2], 2) if ordered else None,
        "p99_ms": round(1000 * ordered[int(len(ordered) * 0.99)], 2) if ordered else None,
    }


def streams(url: str, count: int, events: int, headers: dict, verify, pid: int) -> dict:
    """`count` SSE streams at once, `events` events each: completed, time to first event p50/p99, peak RSS."""
    firsts: list[float] = []
    complete = [0]
    lock = threading.Lock()
    start = threading.Barrier(count + 1)

    def one() -> None:
        start.wait()
        began = time.perf_counter()
        try:
            with requests.get(f"{url}/sse?n={events}", headers=headers, verify=verify, stream=True, timeout=120) as answer:
                got = 0
                for line in answer.iter_lines():
                    if line.startswith(b"data: "):
                        if got == 0:
                            with lock:
                                firsts.append(time.perf_counter() - began)
                        got += 1
            if got == events:
                with lock:
                    complete[0] += 1
        except requests.RequestException:
            pass

    threads = [threading.Thread(target=one) for _ in range(count)]
    for thread in threads:
        thread.start()
    base = rss_kib(pid)
    start.wait()
    peak = base
    began = time.perf_counter()
    while any(t.is_alive() for t in threads):
        peak = max(peak, rss_kib(pid))
        time.sleep(0.05)
    elapsed = time.perf_counter() - began
    ordered = sorted(firsts)
    return {
        "streams": count,
        "events_each": events,
        "complete": complete[0],
        "seconds": round(elapsed, 2),
        "first_event_p50_ms": round(1000 * ordered[len(ordered) // 2], 1) if ordered else None,
        "first_event_p99_ms": round(1000 * ordered[int(len(ordered) * 0.99)], 1) if ordered else None,
        "rss_kib_before": base,
        "rss_kib_peak": peak,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--events", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with ControlPlaneProcess(tls=True, args=["--http", "granian"]) as plane:
        plane.start_worker("bench", parallel=2, timeout=120)
        done = plane.cli("submit", "--service", "--ingress", "--", sys.executable, "-c", REPLICA, timeout=180)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.split()
        job_id, ingress_url, endpoint = int(lines[0]), lines[2], lines[3]
        auth = {"Authorization": f"Bearer {plane.client_token}"}
        verify = str(plane.ca_file)
        wait_for(lambda: requests.get(f"{ingress_url}/", headers=auth, verify=verify, timeout=10).status_code == 200, 30, "the ingress")
        hammer(f"{ingress_url}/", args.clients, 1.0, auth, verify)  # warm up both paths
        hammer(f"http://{endpoint}/", args.clients, 1.0, {}, False)
        runs = []
        for _ in range(args.runs):
            direct = hammer(f"http://{endpoint}/", args.clients, args.seconds, {}, False)
            through = hammer(f"{ingress_url}/", args.clients, args.seconds, auth, verify)
            runs.append(
                {"direct": direct, "ingress": through, "ratio": round(through["req_per_s"] / direct["req_per_s"], 3) if direct["req_per_s"] else None}
            )
        sse = streams(ingress_url, args.streams, args.events, auth, verify, plane.pid)
        plane.cli("job", "cancel", str(job_id))
    result = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "load_average": os.getloadavg(),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}",
        "command": " ".join(["python", "scripts/bench_ingress.py", *sys.argv[1:]]),
        "clients": args.clients,
        "seconds": args.seconds,
        "runs": runs,
        "median": {
            "direct_req_per_s": statistics.median(r["direct"]["req_per_s"] for r in runs),
            "ingress_req_per_s": statistics.median(r["ingress"]["req_per_s"] for r in runs),
            "ratio": statistics.median(r["ratio"] for r in runs if r["ratio"] is not None),
            "direct_p99_ms": statistics.median(r["direct"]["p99_ms"] for r in runs),
            "ingress_p50_ms": statistics.median(r["ingress"]["p50_ms"] for r in runs),
            "ingress_p99_ms": statistics.median(r["ingress"]["p99_ms"] for r in runs),
        },
        "sse": sse,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        m = result["median"]
        print(f"{result['when']}  load {result['load_average']}  {result['machine']}")
        print(
            f"small GETs, {args.clients} clients: direct {m['direct_req_per_s']} req/s (p99 {m['direct_p99_ms']} ms), "
            f"ingress {m['ingress_req_per_s']} req/s (p50 {m['ingress_p50_ms']} ms, p99 {m['ingress_p99_ms']} ms): "
            f"ratio {m['ratio']} (target >= 0.3, p99 <= 20 ms)"
        )
        print(
            f"SSE: {sse['complete']}/{sse['streams']} streams of {sse['events_each']} events complete in {sse['seconds']} s, "
            f"first event p50 {sse['first_event_p50_ms']} ms p99 {sse['first_event_p99_ms']} ms, control plane RSS "
            f"{sse['rss_kib_before']} -> peak {sse['rss_kib_peak']} KiB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
