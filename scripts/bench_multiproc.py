#!/usr/bin/env python3
"""Heartbeats/s with `--front-ends N` against one process, under wrk (issue 41, docs/benchmarks/issue-41.md).

One home, --workers workers registered first (their session tokens in a file); then for each N of --front-ends,
in turn, in one run: a real `gpulayer server start --front-ends N` on a loopback port, and `wrk` (C, a small part
of a core, unlike a Python load generator) sending POST /v1/worker/heartbeat back to back over --connections
keep-alive connections, each request with the next worker's token (a Lua script). Reported per N: heartbeats/s,
p50/p99 (wrk's), non-2xx answers, the server's CPU (every process of it, in cores), and the workers falsely
lost (any worker not online at the end, and `worker_lost` events: none should be, each beats every second or so).

    python3 scripts/bench_multiproc.py --workers 2000 --duration 15 --front-ends 1,2
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
from gpulayer.testing import ControlPlaneProcess, wait_for  # noqa: E402

LUA = r"""
local tokens, i = {}, 0
init = function(args)
  for line in io.lines(args[1]) do tokens[#tokens + 1] = line end
  i = math.random(#tokens)
end
request = function()
  i = i % #tokens + 1
  return wrk.format("POST", "/v1/worker/heartbeat", {["Authorization"] = "Bearer " .. tokens[i],
    ["X-GpuLayer-Protocol"] = "1", ["Content-Type"] = "application/json"}, '{"tasks": []}')
end
"""


def processes(pid: int) -> list[int]:
    """The server's process and its children (a supervisor's writer and front ends)."""
    found = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(child) for child in (task / "children").read_text().split()]
    return found


def cpu(pids: list[int]) -> dict[int, float]:
    """CPU seconds of each process (0 for one gone)."""
    found = {}
    for pid in pids:
        try:
            found[pid] = benchlib.cpu_seconds(pid)
        except OSError:
            found[pid] = 0.0
    return found


def role(pid: int) -> str:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return argv[argv.index(b"gpulayer.server.multiproc.child") + 1].decode() if b"gpulayer.server.multiproc.child" \
        in argv else "server"


def wrk(url: str, lua: Path, tokens: Path, duration: float, connections: int, threads: int) -> dict:
    out = subprocess.run(["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{duration:g}s", "--latency",
                          "-s", str(lua), url, "--", str(tokens)], capture_output=True, text=True, check=True).stdout
    def ms(label: str) -> float:
        found = re.search(rf"^\s+{label}\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        if not found:
            return float("nan")
        return float(found[1]) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[found[2]]
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    return {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1]), "p50_ms": ms("50%"), "p99_ms": ms("99%"),
            "non_2xx": int(non2xx[1]) if non2xx else 0, "socket_errors": errors[1] if errors else "", "raw": out}


def register_all(srv: ControlPlaneProcess, n: int) -> list[str]:
    def one(i: int) -> str:
        with benchlib.session() as s:
            return benchlib.register_worker(s, srv.url, srv.join_token, f"hb-{i}")["session_token"]
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(n)))


def lost(srv: ControlPlaneProcess) -> int:
    not_online = srv.sql("SELECT count(*) FROM workers WHERE state != 'online'")[0][0]
    events = srv.sql("SELECT count(*) FROM events WHERE kind = 'worker_lost'")[0][0]
    return not_online + events


def measure(srv: ControlPlaneProcess, front_ends: int, files: tuple[Path, Path], args) -> dict:
    srv.args = ["--front-ends", str(front_ends)]
    log = srv.root / "server.log"
    def started() -> int:
        return log.read_text(errors="replace").count("control plane listening on") if log.exists() else 0
    seen = started()
    srv.start(timeout=120)
    wait_for(lambda: started() > seen, 120, "every process to serve")
    wrk(srv.url, *files, 2, args.connections, args.wrk_threads)  # warm: connections, caches
    pids = processes(srv.proc.pid)
    roles = {pid: role(pid) for pid in pids}
    before, began = cpu(pids), time.monotonic()
    found = wrk(srv.url, *files, args.duration, args.connections, args.wrk_threads)
    after, took = cpu(pids), time.monotonic() - began
    srv.stop()
    found.pop("raw")
    each = {pid: (after[pid] - before[pid]) / took for pid in pids}
    split = " ".join(f"{roles[pid]} {each[pid]:.2f}" for pid in sorted(pids, key=lambda p: roles[p]))
    return {"front_ends": front_ends, **found, "server_cores": round(sum(each.values()), 2), "processes": len(pids),
            "cores_by_process": split}


def codec_cost(n: int) -> dict:
    """µs to encode and decode one write's request and its answer (codec.py), both ends together, for a write the
    size of the task cycle's (a finish and the next task's acquire: its Assignment in the answer); the function
    is a module-level one (its name is what travels, whichever it is)."""
    from gpulayer.server.multiproc import codec
    from gpulayer.server.scheduler import leases
    shared: dict = {"scheduler": None, "secret_box": None}
    finishes = [{"task_id": 41, "attempt": 1, "exit_code": 0, "outcome": "succeeded", "outputs": {}, "reason": None}]
    request = ("write", 7, leases.heartbeat, (12, finishes, 1796694878.47, True, 1, [], (), ()), {},
               {"wake": True, "until_ended": None, "inline": 2}, "worker:12")
    assignment = {"task_id": 42, "job_id": 42, "attempt": 1, "command": ["true"], "env": {"A": "1"}, "gpus": [],
                  "spec": {"timeout_seconds": None, "outputs": [], "inputs": {}, "cpus": 0, "memory_mb": 0}}
    answer = ("ok", 7, {"results": [{"task_id": 41, "accepted": True}], "found": [assignment], "dropped": []}, [])
    began = time.perf_counter()
    for _ in range(n):
        for message in (request, answer):
            codec.loads(codec.dumps(message, shared)[4:], shared)
    return {"codec_us_per_write": round((time.perf_counter() - began) / n * 1e6, 1)}


def cycles(front_ends: list[int], duration: float, jobs: int) -> list[dict]:
    """bench_http.py's acquire -> start -> finish cycles (16 simulated workers, finish handing out the next task,
    a Python load generator in 2 processes) against `--front-ends N` for each N: what the writer RPC costs a
    cycle (cycles are the writer's work, so more front ends are not expected to add any)."""
    import bench_http
    rows = []
    for n in front_ends:
        class Server(benchlib.Server):
            front_ends = n

            def __init__(self, **options):
                options["extra_args"] = [*options.get("extra_args", ()), "--front-ends", str(self.front_ends)]
                super().__init__(**options)
        bench_http.benchlib.Server = Server  # type: ignore[misc]  # the one knob bench_http lacks
        options = argparse.Namespace(procs=2, threads=8, duration=duration, jobs=jobs, synchronous="normal",
                                     http="granian", finish_next=True, max_tasks=1, profile=False,
                                     profile_dir="/tmp/gpulayer-bench-profile")
        found = bench_http.run_cycles(options, tls=False)
        rows.append({"front_ends": n, "cycles_per_s": found["cycles_per_s"],
                     "cycle_p50_ms": found["cycle"]["p50_ms"], "cycle_p99_ms": found["cycle"]["p99_ms"],
                     "errors": len(found["errors"])})  # its server CPU is the supervisor's alone with N > 1
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2000)
    p.add_argument("--duration", type=float, default=15.0, help="seconds of each measured wrk run")
    p.add_argument("--connections", type=int, default=64)
    p.add_argument("--wrk-threads", type=int, default=1)
    p.add_argument("--front-ends", default="1,2", help="the N to measure, in order (comma-separated)")
    p.add_argument("--codec", type=int, default=0, metavar="N", help="only time the RPC codec, N writes")
    p.add_argument("--cycles", action="store_true", help="task cycles (bench_http.py's) instead of heartbeats")
    p.add_argument("--jobs", type=int, default=4000, help="jobs queued before the cycles (--cycles)")
    args = p.parse_args()
    if args.cycles:
        print(benchlib.machine_line())
        print(benchlib.table(cycles([int(n) for n in args.front_ends.split(",")], args.duration, args.jobs)))
        return 0
    if args.codec:
        print(codec_cost(args.codec))
        return 0
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (apt install wrk)")
    info = benchlib.machine()
    root = Path(tempfile.mkdtemp(prefix="bench-multiproc-"))
    srv = ControlPlaneProcess(root / "plane")
    try:
        srv.start(timeout=120)
        tokens = register_all(srv, args.workers)
        srv.stop()
        files = (root / "hb.lua", root / "tokens.txt")
        files[0].write_text(LUA)
        files[1].write_text("\n".join(tokens) + "\n")
        rows = [measure(srv, int(n), files, args) for n in args.front_ends.split(",")]
        srv.start(timeout=120)
        falsely_lost = lost(srv)
        srv.stop()
    finally:
        srv.close()
        shutil.rmtree(root, ignore_errors=True)
    base = rows[0]["rps"]
    for row in rows:
        row["vs_first"] = round(row["rps"] / base, 2)
    print(benchlib.machine_line(info))
    print(f"{args.workers} workers, wrk -t{args.wrk_threads} -c{args.connections} -d{args.duration:g}s, "
          f"load average at end {os.getloadavg()[0]:.2f}")
    print(benchlib.table(rows, ["front_ends", "rps", "vs_first", "p50_ms", "p99_ms", "non_2xx", "socket_errors",
                                "server_cores", "cores_by_process"]))
    print(f"workers falsely lost over the run: {falsely_lost}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
