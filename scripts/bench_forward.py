#!/usr/bin/env python3
"""Port-forward (issue 26 part 2): throughput against direct loopback TCP, and heartbeats while it runs.

Starts a real control plane (granian, TLS on 127.0.0.1) and one real worker (its default sandbox), runs a
job whose task serves an echo on 127.0.0.1:18802 (the worker's own network, so a direct connect works for
the baseline), then:

- bulk: `--mib` MiB written to the echo and read back at once (so that many bytes each way, checksummed),
  through `Job.port_forward` (client -> control plane -> agent -> task and back), against the same
  transfer to the same server over direct loopback TCP (same-run baseline); `--runs` times, interleaved,
  medians and the ratio (direct time / forward time: the issue's target is >= 0.25);
- heartbeats: a registered worker heartbeating every 50 ms (its own session, requests over TLS), idle for
  `--idle-s` seconds and then during the forwarded transfers: p50 / p99 of each and the ratio (target
  <= 1.5x);
- the control plane's RSS (VmRSS) before, at its peak during the transfers, and after.

    python scripts/bench_forward.py                       # 1 GiB, 3 runs
    python scripts/bench_forward.py --mib 256 --runs 1 --json
"""

from __future__ import annotations

import argparse
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
from gpulayer.client.api import connect  # noqa: E402
from gpulayer.protocol import PROTOCOL, PROTOCOL_HEADER  # noqa: E402

sys.path.insert(0, str(REPO / "scripts"))
from benchlib import cpu_seconds, print_result, rss_mib  # noqa: E402
from gpulayer.testing import ControlPlaneProcess, echo_round_trip, wait_for  # noqa: E402

PORT = 18802
BLOCK = 4 * 1024 * 1024
ECHO = r"""
import socket, socketserver

class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while chunk := self.request.recv(262144):
            self.request.sendall(chunk)
        self.request.shutdown(socket.SHUT_WR)

class Server(socketserver.ThreadingTCPServer):
    daemon_threads = allow_reuse_address = True

server = Server(("127.0.0.1", 18802), Echo)
print("listening", flush=True)
server.serve_forever()
"""


def echo(port: int, size: int, block: bytes) -> float:
    """`size` bytes to the echo at 127.0.0.1:`port` and back, checksummed; seconds."""
    return echo_round_trip(port, size, block)


class Beater:
    """A registered worker heartbeating every 50 ms; `mark()` starts a new series of latencies."""

    def __init__(self, plane):
        self.plane = plane
        answer = requests.post(
            plane.url + "/v1/workers/register",
            verify=plane.verify,
            timeout=30,
            json={"name": "beater", "labels": {}, "resources": {"cpus": 1, "gpus": 0, "memory_mb": 64}, "version": "bench", "slots": 1},
            headers={**plane.headers(plane.join_token), PROTOCOL_HEADER: str(PROTOCOL)},
        ).json()
        self.headers = {"Authorization": f"Bearer {answer['session_token']}", PROTOCOL_HEADER: str(PROTOCOL)}
        self.series: list[list[float]] = [[]]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.session = requests.Session()

    def _run(self) -> None:
        while not self.stop.is_set():
            began = time.perf_counter()
            answer = self.session.post(
                self.plane.url + "/v1/worker/heartbeat", json={"tasks": []}, headers=self.headers, verify=self.plane.verify, timeout=30
            )
            assert answer.status_code == 200, answer.text
            self.series[-1].append(time.perf_counter() - began)
            self.stop.wait(0.05)

    def mark(self) -> list[float]:
        done = self.series[-1]
        self.series.append([])
        return done


def relay_links(plane) -> int:
    """Agents' relay links open now (the gpulayer_relay_links gauge)."""
    text = plane.request("GET", "/metrics").text
    return int(float(next(line.split()[-1] for line in text.splitlines() if line.startswith("gpulayer_relay_links "))))


def idle_cost(plane, watch_s: float) -> dict:
    """The issue's idle-worker row: seconds until the worker holds no relay link once its streams ended, and
    the control plane's CPU while the link sits idle (before it closes) and once it is gone, per second."""
    began, cpu = time.perf_counter(), cpu_seconds(plane.pid)
    linked_cpu, closed_at = None, None
    while time.perf_counter() - began < watch_s:
        if closed_at is None and relay_links(plane) == 0:
            closed_at = time.perf_counter() - began
            linked_cpu = (cpu_seconds(plane.pid) - cpu) / closed_at
            cpu = cpu_seconds(plane.pid)
        time.sleep(0.5)
    after = (cpu_seconds(plane.pid) - cpu) / (watch_s - closed_at) if closed_at is not None and watch_s > closed_at else None
    return {
        "link_closed_after_s": None if closed_at is None else round(closed_at, 1),
        "server_cpu_pct_link_idle": None if linked_cpu is None else round(100 * linked_cpu, 2),
        "server_cpu_pct_no_link": None if after is None else round(100 * after, 2),
    }


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000, 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--idle-s", type=float, default=20.0)
    parser.add_argument(
        "--link-idle-s",
        type=float,
        default=0.0,
        help="after the runs, watch the agent's relay link this long (its agent closes it 60 s after the last stream)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    size = args.mib * 1024 * 1024
    block = os.urandom(BLOCK)
    load_before = os.getloadavg()
    with ControlPlaneProcess(tls=True) as plane:
        plane.start_worker("w1", timeout=120)
        job_id = plane.submit({"command": [sys.executable, "-c", ECHO], "name": "bench-forward"})
        wait_for(lambda: any("listening" in line["text"] for line in plane.get_json(f"/v1/jobs/{job_id}/logs")["lines"]), 120, "the echo server")
        client = connect(url=plane.url, token=plane.client_token, ca_file=str(plane.ca_file))
        assert plane.pid is not None
        beater = Beater(plane)
        beater.thread.start()
        with client.get_job(job_id).port_forward(PORT) as forward:
            echo(forward.local_port, BLOCK, block)  # the agent's link is up
            time.sleep(args.idle_s)
            idle = beater.mark()
            rss_before = rss_mib(plane.pid)
            peak = [rss_before]
            done = threading.Event()

            def watch() -> None:  # the control plane's RSS all along the runs
                while not done.wait(0.2):
                    peak[0] = max(peak[0], rss_mib(plane.pid))  # type: ignore[arg-type]

            watcher = threading.Thread(target=watch)
            watcher.start()
            forward_s, direct_s, busy, plane_cpu = [], [], [], []
            for _ in range(args.runs):
                beater.mark()
                cpu = cpu_seconds(plane.pid)
                forward_s.append(echo(forward.local_port, size, block))
                plane_cpu.append(cpu_seconds(plane.pid) - cpu)
                busy += beater.mark()
                direct_s.append(echo(PORT, size, block))
            done.set()
            watcher.join()
            rss_after = rss_mib(plane.pid)
        beater.stop.set()
        beater.thread.join()
        idle_link = idle_cost(plane, args.link_idle_s) if args.link_idle_s > 0 else {}
        plane.cli("job", "cancel", str(job_id))
    forward_med, direct_med = statistics.median(forward_s), statistics.median(direct_s)
    result = {
        "mib_each_way": args.mib,
        "runs": args.runs,
        "forward_s": [round(s, 2) for s in forward_s],
        "direct_s": [round(s, 3) for s in direct_s],
        "forward_mib_s": round(args.mib / forward_med, 1),
        "direct_mib_s": round(args.mib / direct_med, 1),
        "ratio": round(direct_med / forward_med, 3),
        # the control plane's CPU seconds per forwarded run (both ways through it), less load-sensitive than time
        "server_cpu_s": [round(c, 2) for c in plane_cpu],
        "heartbeats_idle": len(idle),
        "heartbeat_idle_p50_ms": pct(idle, 0.5),
        "heartbeat_idle_p99_ms": pct(idle, 0.99),
        "heartbeats_busy": len(busy),
        "heartbeat_busy_p50_ms": pct(busy, 0.5),
        "heartbeat_busy_p99_ms": pct(busy, 0.99),
        "heartbeat_p99_ratio": round(pct(busy, 0.99) / pct(idle, 0.99), 2),
        "server_rss_mib_before": round(rss_before, 1),
        "server_rss_mib_peak": round(peak[0], 1),
        "server_rss_mib_after": round(rss_after, 1),
        **idle_link,
        "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    print_result(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
