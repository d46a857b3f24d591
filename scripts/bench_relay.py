#!/usr/bin/env python3
"""The relay (issue 26 part 1): bulk throughput and keystroke round trips through `gpulayer exec`.

Starts a real control plane (granian, TLS on 127.0.0.1) and one real worker (its default sandbox), runs a
`sleep` job, then:

- bulk: `cat` in the task through the relay (Python client, `run_exec`), fed `--mib` MiB of stdin and
  drained of as much stdout (so the bytes cross the relay twice: client -> server -> agent -> cat and
  back), against the same `cat` as a local child process fed and drained the same way (same-run
  baseline); `--runs` times, medians, and the ratio;
- keystrokes: one exec stream of `cat`; 1 byte written, its echo awaited, `--keys` times: p50 / p99;
- the control plane's RSS (VmRSS) before and after;
- shell keystrokes (`--shell-keys`): one `gpulayer shell` stream (the task's bash on its PTY, 50 x 1000 so
  that no line wraps); one key typed, bash's echo awaited, p50 / p99; first alone, then (`--idle-workers N`)
  with N more simulated workers registered and heartbeating at the control plane's interval from a process
  of their own (issue 26's row: 1,000 idle workers, p50 <= 5 ms, p99 <= 30 ms), in the same run.

    python scripts/bench_relay.py                   # 256 MiB, 3 runs, 500 keystrokes
    python scripts/bench_relay.py --mib 64 --runs 1 --json
    python scripts/bench_relay.py --only shell --idle-workers 1000 --shell-keys 1000
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
sys.path.insert(0, str(REPO / "scripts"))
import benchlib  # noqa: E402
from benchlib import print_result, rss_mib  # noqa: E402
from gpulayer.client.api import connect  # noqa: E402
from gpulayer.client.relay import open_exec, run_exec  # noqa: E402
from gpulayer.client.relay_shell import open_shell  # noqa: E402
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


def _quiet(stream, quiet_s: float) -> bytes:
    """What the stream shows until it falls quiet for `quiet_s`."""
    shown = b""
    while True:
        frame = stream.recv(timeout=quiet_s)
        if frame is None:
            return shown
        assert frame.type == DATA, frame
        shown += frame.data
        stream.consumed(len(frame.data))


def shell_keystrokes(client, job_id: int, count: int) -> list[float]:
    """Keys typed into the task's bash through a shell stream, each until its echo came back (seconds)."""
    link, stream = open_shell(client, job_id, ["bash", "--norc", "--noprofile", "-i"], term="dumb", size=(50, 1000))
    times = []
    try:
        assert _quiet(stream, 1.0), "no prompt"
        for i in range(count):
            if i and i % 100 == 0:  # ^U: the line starts again
                stream.write(b"\x15")
                _quiet(stream, 0.2)
            began = time.perf_counter()
            stream.write(b"x")
            shown = b""
            while b"x" not in shown:
                frame = stream.recv(timeout=30)
                assert frame is not None and frame.type == DATA, frame
                shown += frame.data
                stream.consumed(len(frame.data))
            times.append(time.perf_counter() - began)
        stream.write(b"\x15exit\n")
    finally:
        link.close()
    return times


def idle_workers(url: str, verify, join_token: str, count: int, interval_s: float, ready, stop, out) -> None:
    """`count` simulated idle workers (a process of their own): registered, then each heartbeating once every
    `interval_s` (spread evenly), until `stop`; their heartbeats' count, p50/p99 and errors into `out`."""
    from concurrent.futures import ThreadPoolExecutor

    threads = 8
    shares = [list(range(t, count, threads)) for t in range(threads)]
    tokens: list[str] = [""] * count

    def register(t: int) -> None:
        s = benchlib.LeanSession(url, verify)
        for i in shares[t]:
            tokens[i] = benchlib.register_worker(s, url, join_token, f"idle-{i}")["session_token"]

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(register, range(threads)))
    ready.set()
    lat: list[float] = []
    errors: list[str] = []

    def beat(t: int) -> None:
        s = benchlib.LeanSession(url, verify)
        mine = shares[t]
        gap = interval_s / max(1, len(mine))
        next_at = time.monotonic()
        while not stop.is_set():
            for i in mine:
                next_at += gap
                began = time.perf_counter()
                try:
                    r = s.post(
                        url + "/v1/worker/heartbeat",
                        json={"tasks": []},
                        headers={**benchlib.PROTOCOL_HEADER, "Authorization": f"Bearer {tokens[i]}"},
                        timeout=30,
                    )
                    r.raise_for_status()
                except Exception as exc:  # noqa: BLE001
                    errors.append(repr(exc))
                lat.append(time.perf_counter() - began)
                pause = next_at - time.monotonic()
                if pause > 0:
                    stop.wait(pause)
                if stop.is_set():
                    return

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(beat, range(threads)))
    out.put({"heartbeats": len(lat), "heartbeat": benchlib.summary_ms(lat), "errors": len(errors), "first_errors": errors[:3]})


def percentiles_ms(times: list[float]) -> dict:
    keys = sorted(times)
    return {
        "p50_ms": round(keys[len(keys) // 2] * 1000, 2),
        "p99_ms": round(keys[min(len(keys) - 1, int(len(keys) * 0.99))] * 1000, 2),
        "n": len(keys),
    }


def shell_bench(args) -> dict:
    """Shell keystroke echo alone, then with --idle-workers heartbeating, in one run of one control plane."""
    import multiprocessing as mp

    interval = 2.0
    with ControlPlaneProcess(tls=True, heartbeat_interval=interval, lease_ttl=30).start(timeout=180) as plane:  # a loaded machine
        plane.start_worker("w1", timeout=120)
        job_id = plane.submit({"command": ["sleep", "3600"], "name": "bench-shell"})
        wait_for(lambda: plane.job(job_id)["tasks"][0]["state"] == "running", 60, "the job to run")
        client = connect(url=plane.url, token=plane.client_token, ca_file=str(plane.ca_file))
        client.get_job(job_id).exec(["true"])  # the agent's link is up
        result: dict = {"idle_workers": args.idle_workers, "heartbeat_interval_s": interval}
        result["alone"] = percentiles_ms(shell_keystrokes(client, job_id, args.shell_keys))
        if args.idle_workers:
            ctx = mp.get_context("spawn")
            ready, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
            loader = ctx.Process(
                target=idle_workers, args=(plane.url, str(plane.ca_file), plane.join_token, args.idle_workers, interval, ready, stop, out)
            )
            loader.start()
            assert ready.wait(600), "the idle workers did not register"
            time.sleep(2 * interval)  # every one of them beating
            load = os.getloadavg()
            result["loaded"] = percentiles_ms(shell_keystrokes(client, job_id, args.shell_keys))
            stop.set()
            result["idle_load"] = out.get(timeout=120)
            loader.join(30)
            result["load_during"] = load
        plane.cli("job", "cancel", str(job_id))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keys", type=int, default=500)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--only", choices=["all", "exec", "shell"], default="all")
    parser.add_argument("--shell-keys", type=int, default=500)
    parser.add_argument("--idle-workers", type=int, default=0)
    args = parser.parse_args()
    if args.only == "shell":
        shell = shell_bench(args)
        shell.update(
            at=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), load=os.getloadavg(), cpus=os.cpu_count(), python=platform.python_version()
        )
        print(json.dumps(shell) if args.json else json.dumps(shell, indent=2))
        return 0
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
    if args.only == "all":
        result["shell"] = shell_bench(args)
    print_result(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
