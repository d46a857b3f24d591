#!/usr/bin/env python3
"""The relay (issue 26 part 1): bulk throughput and keystroke round trips through `gpulayer exec`.

Starts a real control plane (granian, TLS on 127.0.0.1) and one real worker (its default sandbox), runs a
`sleep` job, then:

- bulk: `cat` in the task through the relay (Python client, `run_exec`), fed `--mib` MiB of stdin and
  drained of as much stdout (so the bytes cross the relay twice: client -> server -> agent -> cat and
  back), against the same `cat` as a local child process fed and drained the same way (same-run
  baseline); `--runs` times, medians, and the ratio;
- keystrokes: one exec stream of `cat`; 1 byte written, its echo awaited, `--keys` times: p50 / p99;
- the control plane's RSS (VmRSS) before and after.

    python scripts/bench_relay.py                   # 256 MiB, 3 runs, 500 keystrokes
    python scripts/bench_relay.py --mib 64 --runs 1 --json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from gpulayer.client.api import connect  # noqa: E402
from gpulayer.client.relay import open_exec, run_exec  # noqa: E402
from gpulayer.protocol.relay import DATA  # noqa: E402
from gpulayer.testing import ControlPlaneProcess, wait_for  # noqa: E402

CHUNK = 64 * 1024


class Zeros:
    """`size` bytes of zeros, read1() in CHUNK pieces (stdin for run_exec)."""

    def __init__(self, size: int):
        self.left = size
        self.block = bytes(CHUNK)

    def read1(self, n: int = CHUNK) -> bytes:
        take = min(n, CHUNK, self.left)
        self.left -= take
        return self.block[:take]

    read = read1


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("VmRSS:")) / 1024


def through_relay(client, job_id: int, size: int) -> float:
    got = [0]

    def count(chunk: bytes) -> None:
        got[0] += len(chunk)

    began = time.perf_counter()
    code = run_exec(client, job_id, ["cat"], stdin=Zeros(size), on_stdout=count, on_stderr=lambda b: None)
    elapsed = time.perf_counter() - began
    assert code == 0 and got[0] == size, (code, got[0])
    return elapsed


def through_pipe(size: int) -> float:
    began = time.perf_counter()
    proc = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None

    def feed() -> None:
        zeros = Zeros(size)
        while True:
            chunk = zeros.read1()
            if not chunk:
                break
            proc.stdin.write(chunk)  # type: ignore[union-attr]
        proc.stdin.close()  # type: ignore[union-attr]

    feeder = threading.Thread(target=feed)
    feeder.start()
    got = 0
    while True:
        chunk = proc.stdout.read1(CHUNK)
        if not chunk:
            break
        got += len(chunk)
    feeder.join()
    proc.wait()
    assert got == size
    return time.perf_counter() - began


def keystrokes(client, job_id: int, count: int) -> list[float]:
    link, stream = open_exec(client, job_id, ["cat"])
    times = []
    try:
        for _ in range(count):
            began = time.perf_counter()
            stream.write(b"x")
            frame = stream.recv(timeout=30)
            assert frame is not None and frame.type == DATA and frame.data == b"x", frame
            stream.consumed(1)
            times.append(time.perf_counter() - began)
        stream.eof()
    finally:
        link.close()
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keys", type=int, default=500)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    size = args.mib * 1024 * 1024
    with ControlPlaneProcess(tls=True) as plane:
        plane.start_worker("w1")
        job_id = plane.submit({"command": ["sleep", "3600"], "name": "bench-relay"})
        wait_for(lambda: plane.job(job_id)["tasks"][0]["state"] == "running", 60, "the job to run")
        client = connect(url=plane.url, token=plane.client_token, ca_file=str(plane.ca_file))
        assert plane.pid is not None
        client.get_job(job_id).exec(["true"])  # the agent's link is up
        rss_before = rss_mib(plane.pid)
        relay_s, pipe_s, peak = [], [], rss_before
        for _ in range(args.runs):
            relay_s.append(through_relay(client, job_id, size))
            peak = max(peak, rss_mib(plane.pid))
            pipe_s.append(through_pipe(size))
        keys = sorted(keystrokes(client, job_id, args.keys))
        rss_after = rss_mib(plane.pid)
        plane.cli("job", "cancel", str(job_id))
    relay_med, pipe_med = statistics.median(relay_s), statistics.median(pipe_s)
    result = {
        "mib": args.mib,
        "runs": args.runs,
        "relay_s": relay_s,
        "pipe_s": pipe_s,
        "relay_mib_s": round(args.mib / relay_med, 1),
        "pipe_mib_s": round(args.mib / pipe_med, 1),
        "ratio": round(pipe_med / relay_med, 3),
        "keystroke_p50_ms": round(keys[len(keys) // 2] * 1000, 2),
        "keystroke_p99_ms": round(keys[min(len(keys) - 1, int(len(keys) * 0.99))] * 1000, 2),
        "server_rss_mib_before": round(rss_before, 1),
        "server_rss_mib_peak": round(peak, 1),
        "server_rss_mib_after": round(rss_after, 1),
        "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load": os.getloadavg(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:24} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
