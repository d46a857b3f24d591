"""Webhook deliveries against heartbeats (issue 28): do 1,000 webhooks' deliveries move heartbeat p99?

A real control plane process (`--allow-private-webhooks`), --webhooks webhooks (every event kind the
bench makes: job.submitted) to a receiver process on loopback (HTTP/1.1, keep-alive) that answers each
POST after --delay-ms,
and --workers simulated workers heartbeating from --threads callers (LeanSession, keep-alive). Rounds
alternate two phases of --seconds each, in the same run:

  idle:  the webhooks are caught up: nothing to deliver; heartbeats only.
  busy:  --jobs-per-s submits, so --webhooks deliveries per submit: the pool (--webhook-concurrency)
         works through them while the heartbeats go on.

Heartbeat latency (p50, p99) per phase, medians over the rounds, the busy/idle ratio of p99, and the
deliveries the busy phases made (webhook_deliveries rows, read from the state file), and the CPU
seconds per phase of the server process and, apart, of its children (the delivery process).
`--history N`: N delivered rows per webhook written into the state file before the rounds, as the
deliveries of the weeks `--job-retention` keeps would leave them (the outbox's every tick looks at each
webhook's deliveries). `--profile DIR`: py-spy records the server process during each phase (raw stacks, DIR/{phase}{round}.txt;
scripts/profile_buckets.py sums them).

    python scripts/bench_webhooks.py --webhooks 1000 --workers 200 --rounds 3 --seconds 10
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time

from pathlib import Path

import gpulayer
from benchlib import PROTOCOL_HEADER, LeanSession, Server, cpu_seconds, machine, machine_line, median, percentile, register_worker, session

RECEIVER = textwrap.dedent("""
    import sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    delay = float(sys.argv[1])
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            time.sleep(delay)
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()
        def log_message(self, *a):
            pass
    s = ThreadingHTTPServer(("127.0.0.1", 0), H)
    s.daemon_threads = True
    print(s.server_port, flush=True)
    s.serve_forever()
""")


def heartbeats(url: str, workers: list[str], threads: int, stop: threading.Event) -> list[float]:
    """Heartbeat latencies (seconds) from `threads` callers, round-robin over `workers`, until `stop`."""
    found: list[float] = []
    lock = threading.Lock()

    def loop(mine: list[str]) -> None:
        s = LeanSession(url)
        lat = []
        while not stop.is_set():
            for token in mine:
                t0 = time.perf_counter()
                r = s.post(url + "/v1/worker/heartbeat", json={"tasks": []}, headers={**PROTOCOL_HEADER, "Authorization": f"Bearer {token}"})
                lat.append(time.perf_counter() - t0)
                r.raise_for_status()
                if stop.is_set():
                    break
        with lock:
            found.extend(lat)

    callers = [threading.Thread(target=loop, args=(workers[i::threads],)) for i in range(threads)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    return found


def delivered(state) -> int:
    with sqlite3.connect(f"file:{state}?mode=ro", uri=True, timeout=30) as conn:
        return conn.execute("SELECT count(*) FROM webhook_deliveries WHERE status = 'delivered'").fetchone()[0]


def keep(state, n: int) -> None:
    """`n` delivered rows per webhook, under event seqs no real event has (below 1): what weeks of
    deliveries leave in webhook_deliveries (kept for --job-retention), written beside the running server."""
    with sqlite3.connect(state, timeout=60) as conn:
        conn.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
            "INSERT INTO webhook_deliveries (webhook_id, event_seq, event, status, attempts, first_try_at, last_try_at, http_status) "
            "SELECT w.id, -n.i, 'job.submitted', 'delivered', 1, 0, 0, 204 FROM webhooks w, n",
            (n,),
        )


def children(pid: int) -> list[int]:
    """The direct children of `pid` (the server's delivery process), from /proc."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def cpu(pid: int) -> tuple[float, float]:
    """(CPU seconds of `pid` itself, of its children now alive)."""
    kids = 0.0
    for child in children(pid):
        try:
            kids += cpu_seconds(child)
        except OSError:
            continue
    return cpu_seconds(pid), kids


def profile(pid: int, seconds: float, dest: Path) -> subprocess.Popen:
    dest.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        ["py-spy", "record", "-p", str(pid), "-d", str(int(max(1, seconds - 1))), "-r", "200", "-f", "raw", "-o", str(dest), "--nonblocking"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--webhooks", type=int, default=1000)
    p.add_argument("--workers", type=int, default=200)
    p.add_argument("--threads", type=int, default=4, help="heartbeat callers")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=10.0, help="each phase")
    p.add_argument("--jobs-per-s", type=float, default=2.0)
    p.add_argument("--delay-ms", type=float, default=20.0, help="the receiver's answer time")
    p.add_argument("--webhook-concurrency", type=int, default=16)
    p.add_argument("--history", type=int, default=0, metavar="N", help="delivered rows per webhook kept from before the run")
    p.add_argument("--profile", metavar="DIR", help="py-spy the server process in each phase, raw stacks into DIR")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    info = machine()
    loadavg_at_start = os.getloadavg()[0]
    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER, str(args.delay_ms / 1000)], stdout=subprocess.PIPE, text=True)
    port = int(receiver.stdout.readline())
    server = Server(
        extra_args=[
            "--allow-private-webhooks",
            "--webhook-concurrency",
            str(args.webhook_concurrency),
            "--heartbeat-interval",
            "30",
            "--lease-ttl",
            "120",
        ]
    )
    server.start()
    try:
        s = session()
        client = server.client_headers()
        for i in range(args.webhooks):
            r = s.post(
                f"{server.url}/v1/webhooks",
                headers=client,
                timeout=60,
                json={"url": f"http://127.0.0.1:{port}/hook/{i}", "events": ["job.submitted"]},
            )
            r.raise_for_status()
        if args.history:
            keep(server.state, args.history)
        workers = [register_worker(s, server.url, server.join_token, f"w{i}")["session_token"] for i in range(args.workers)]
        # Warm-up: one submit, its deliveries drained, so the rounds measure the steady state (connections
        # open, the delivery process started), not the first delivery's set-up.
        kept = delivered(server.state)
        s.post(f"{server.url}/v1/jobs", headers=client, json={"command": ["true"]}, timeout=60)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and delivered(server.state) < kept + args.webhooks:
            time.sleep(0.5)
        rows = []
        for n in range(args.rounds):
            for phase in ("idle", "busy"):
                before = delivered(server.state)
                spy = profile(server.proc.pid, args.seconds, Path(args.profile) / f"{phase}{n}.txt") if args.profile else None
                cpu_before = cpu(server.proc.pid)
                stop = threading.Event()
                out: list[list[float]] = []
                t = threading.Thread(target=lambda o=out, st=stop: o.append(heartbeats(server.url, workers, args.threads, st)))
                t.start()
                end = time.monotonic() + args.seconds
                submitted = 0
                while time.monotonic() < end:
                    if phase == "busy":
                        s.post(f"{server.url}/v1/jobs", headers=client, json={"command": ["true"]}, timeout=60)
                        submitted += 1
                    time.sleep(1 / args.jobs_per_s if phase == "busy" else 0.1)
                stop.set()
                t.join()
                cpu_after = cpu(server.proc.pid)
                if spy is not None:
                    spy.wait()
                lat = out[0]
                rows.append(
                    {
                        "round": n,
                        "phase": phase,
                        "heartbeats": len(lat),
                        "p50_ms": round(percentile(lat, 50) * 1e3, 2),
                        "p99_ms": round(percentile(lat, 99) * 1e3, 2),
                        "submitted": submitted,
                        "delivered": delivered(server.state) - before,
                        "server_cpu_s": round(cpu_after[0] - cpu_before[0], 2),
                        "children_cpu_s": round(cpu_after[1] - cpu_before[1], 2),
                    }
                )
                if phase == "busy":  # let the backlog drain, so the next idle phase is idle
                    deadline = time.monotonic() + 120
                    while time.monotonic() < deadline and delivered(server.state) < submitted * args.webhooks + before:
                        time.sleep(0.5)
        idle = [r for r in rows if r["phase"] == "idle"]
        busy = [r for r in rows if r["phase"] == "busy"]
        result = {
            "machine": info,
            "args": vars(args),
            "rows": rows,
            "idle_p99_ms": median(r["p99_ms"] for r in idle),
            "busy_p99_ms": median(r["p99_ms"] for r in busy),
            "idle_p50_ms": median(r["p50_ms"] for r in idle),
            "busy_p50_ms": median(r["p50_ms"] for r in busy),
            "deliveries_per_s_busy": median(r["delivered"] / args.seconds for r in busy),
            "idle_server_cpu_s": median(r["server_cpu_s"] for r in idle),
            "busy_server_cpu_s": median(r["server_cpu_s"] for r in busy),
            "busy_children_cpu_s": median(r["children_cpu_s"] for r in busy),
            "source": str(Path(gpulayer.__file__).parent.parent),  # the code the server ran
            "loadavg_at_start": loadavg_at_start,
            "loadavg_at_end": os.getloadavg()[0],
        }
        result["p99_ratio"] = round(result["busy_p99_ms"] / result["idle_p99_ms"], 2)
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            print(machine_line(info))
            for r in rows:
                print(r)
            print({k: v for k, v in result.items() if k not in ("machine", "args", "rows")})
    finally:
        server.close()
        receiver.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
