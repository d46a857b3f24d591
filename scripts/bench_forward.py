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
- the control plane's RSS (VmRSS) before, at its peak during the transfers, and after;
- where the control plane's and the agent's CPU went during the forwards, per thread name (granian's Rust
  threads, the asyncio loop, the falcon pool, ...), from /proc/PID/task;
- with `--profile DIR`: py-spy (raw stacks, `--native`-less) of the control plane, the agent and the
  port-forward client during the first forwarded run.

The heartbeats come from a process of their own (`--beater inline` puts them back in the bench's process, as
before 2026-12-04 afternoon: there they wait on the bench's own GIL, which the port-forward client's threads
and the sha256 of the transfer hold, and measure the bench more than the control plane). The port-forward
client runs in a process of its own too (`gpulayer port-forward`, as a user runs it), unless `--client
inline`.

    python scripts/bench_forward.py                       # 1 GiB, 3 runs
    python scripts/bench_forward.py --mib 256 --runs 1 --json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from gpulayer.client.api import connect  # noqa: E402
from gpulayer.protocol import PROTOCOL, PROTOCOL_HEADER  # noqa: E402

sys.path.insert(0, str(REPO / "scripts"))
from benchlib import cpu_seconds, print_result, rss_mib  # noqa: E402
from gpulayer.testing import CLI, ControlPlaneProcess, clean_env, echo_round_trip, wait_for  # noqa: E402

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


def beat(url: str, verify: str, headers: dict, stop: threading.Event, out) -> None:
    """Heartbeat every 50 ms until `stop`, each latency (seconds) to `out(seconds)`."""
    session = requests.Session()
    while not stop.is_set():
        began = time.perf_counter()
        answer = session.post(url + "/v1/worker/heartbeat", json={"tasks": []}, headers=headers, verify=verify, timeout=30)
        assert answer.status_code == 200, answer.text
        out(time.perf_counter() - began)
        stop.wait(0.05)


BEATER_MAIN = """
import json, sys, threading
sys.path.insert(0, sys.argv[1])
from bench_forward import beat
url, verify, headers = sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
beat(url, verify, headers, stop, lambda s: print(repr(s), flush=True))
"""


class Beater:
    """A registered worker heartbeating every 50 ms, from a process of its own (or a thread of this one with
    `inline`); `mark()` starts a new series of latencies and returns the last."""

    def __init__(self, plane, inline: bool = False):
        self.plane = plane
        answer = requests.post(
            plane.url + "/v1/workers/register",
            verify=plane.verify,
            timeout=30,
            json={"name": "beater", "labels": {}, "resources": {"cpus": 1, "gpus": 0, "memory_mb": 64}, "version": "bench", "slots": 1},
            headers={**plane.headers(plane.join_token), PROTOCOL_HEADER: str(PROTOCOL)},
        ).json()
        headers = {"Authorization": f"Bearer {answer['session_token']}", PROTOCOL_HEADER: str(PROTOCOL)}
        self.series: list[list[float]] = [[]]
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.proc: subprocess.Popen | None = None
        if inline:
            self.thread = threading.Thread(target=beat, args=(plane.url, plane.verify, headers, self.stop, self._add), daemon=True)
        else:
            argv = [sys.executable, "-c", BEATER_MAIN, str(REPO / "scripts"), plane.url, str(plane.verify), json.dumps(headers)]
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            self.thread = threading.Thread(target=self._read, daemon=True)

    def _add(self, seconds: float) -> None:
        with self.lock:
            self.series[-1].append(seconds)

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self._add(float(line))

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        if self.proc is not None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(30)
        self.thread.join()

    def mark(self) -> list[float]:
        with self.lock:
            done = self.series[-1]
            self.series.append([])
        return done


@contextmanager
def forwarding(plane, client, job_id: int, inline: bool):
    """The local port of a port-forward to the echo: `gpulayer port-forward` as a process of its own, or
    `Job.port_forward` in this one (`inline`). Yields (port, pid of the process that forwards)."""
    if inline:
        with client.get_job(job_id).port_forward(PORT) as forward:
            yield forward.local_port, os.getpid()
        return
    argv = [*CLI, "port-forward", str(job_id), f":{PORT}"]
    proc = subprocess.Popen(argv, env=clean_env(**plane.cli_env()), cwd=plane.root, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "Forwarding from 127.0.0.1:PORT -> 18802"
        assert line.startswith("Forwarding from"), f"port-forward said {line!r}"
        yield int(line.split()[2].rsplit(":", 1)[1]), proc.pid
    finally:
        proc.terminate()
        proc.wait(30)


def thread_cpu(pid: int) -> Counter:
    """CPU seconds (utime + stime) of each of a process's threads so far, summed by thread name."""
    found: Counter = Counter()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
            name = (task / "comm").read_text().strip()
        except OSError:  # the thread ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        found[name.rstrip("0123456789_-") or name] += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return found


def where_cpu(before: Counter, after: Counter) -> dict:
    """CPU seconds by thread name between two thread_cpu() readings, the largest first."""
    spent = {name: round(after[name] - before.get(name, 0.0), 2) for name in after}
    return dict(sorted(((k, v) for k, v in spent.items() if v >= 0.05), key=lambda kv: -kv[1]))


def profile(out: Path, pids: dict[str, int], seconds: float) -> list[subprocess.Popen]:
    """py-spy record (raw collapsed stacks, per thread, idle frames left out) of each named process, and `perf
    record` of the control plane (its Rust threads: granian's WebSocket and TLS) when perf is there."""
    out.mkdir(parents=True, exist_ok=True)
    perf = []
    if shutil.which("perf"):
        argv = ["perf", "record", "-F", "499", "-g", "-p", str(pids["server"]), "-o", str(out / "server.perf"), "--", "sleep", str(seconds)]
        perf.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return perf + [
        subprocess.Popen(
            ["py-spy", "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "200", "--threads", "-f", "raw"]
            + ["-o", str(out / f"{name}.txt"), "--nonblocking"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
    ]


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
    parser.add_argument("--beater", choices=("process", "inline"), default="process", help="where the heartbeats come from")
    parser.add_argument("--client", choices=("process", "inline"), default="process", help="where port-forward runs")
    parser.add_argument("--profile", type=Path, help="py-spy the control plane, the agent and the client during the first forward into DIR")
    parser.add_argument("--profile-s", type=float, default=6.0)
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
        beater = Beater(plane, inline=args.beater == "inline")
        beater.start()
        agent_pid = plane.workers["w1"].pid
        assert agent_pid is not None
        with forwarding(plane, client, job_id, args.client == "inline") as (local_port, client_pid):
            for attempt in range(5):  # the agent's link is up (at a high load its first connect may miss the deadline)
                try:
                    echo(local_port, BLOCK, block)
                    break
                except (AssertionError, OSError) as exc:
                    print(f"warm-up {attempt + 1}: {exc}", file=sys.stderr)
            else:
                raise SystemExit("port-forward never carried the warm-up transfer")
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
            forward_s, direct_s, busy, plane_cpu, agent_cpu, client_cpu = [], [], [], [], [], []
            plane_threads, agent_threads = Counter(), Counter()
            for run in range(args.runs):
                beater.mark()
                cpu, threads_at, agent_at = cpu_seconds(plane.pid), thread_cpu(plane.pid), thread_cpu(agent_pid)
                agent_was, client_was = cpu_seconds(agent_pid), cpu_seconds(client_pid)
                spies = []
                if args.profile and run == 0:
                    spies = profile(args.profile, {"server": plane.pid, "agent": agent_pid, "client": client_pid}, args.profile_s)
                forward_s.append(echo(local_port, size, block))
                plane_cpu.append(cpu_seconds(plane.pid) - cpu)
                agent_cpu.append(cpu_seconds(agent_pid) - agent_was)
                client_cpu.append(cpu_seconds(client_pid) - client_was)
                busy += beater.mark()
                plane_threads.update(where_cpu(threads_at, thread_cpu(plane.pid)))
                agent_threads.update(where_cpu(agent_at, thread_cpu(agent_pid)))
                for spy in spies:
                    spy.wait()
                direct_s.append(echo(PORT, size, block))
            done.set()
            watcher.join()
            rss_after = rss_mib(plane.pid)
        beater.close()
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
        "agent_cpu_s": [round(c, 2) for c in agent_cpu],
        # the port-forward client's (with --client inline: the whole bench process, its echo and sha256 too)
        "client_cpu_s": [round(c, 2) for c in client_cpu],
        # ... and where it went, by thread name, summed over the runs (and the agent's)
        "server_cpu_by_thread": {k: round(v, 2) for k, v in plane_threads.most_common(8)},
        "agent_cpu_by_thread": {k: round(v, 2) for k, v in agent_threads.most_common(8)},
        "beater": args.beater,
        "client": args.client,
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
