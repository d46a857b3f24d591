#!/usr/bin/env python3
"""Job arrays (issue 16), in one sitting, each figure beside its same-run baseline.

1. submit: POST /v1/jobs of one array of --size elements (default 10,000) to a real
   server subprocess with no worker, --repeat times; beside it, POST of a one-task job.
2. run: --run-size `true` elements (default 1,000) as one array through a real server
   and one real worker (`--parallel 2`), from POST until the job has finished; beside
   it `xargs -P2` running as many `true` on this machine. Interleaved, --repeat times.
3. acquire: acquisition by one worker, in-process on a state file: of plain tasks, with
   --backlog plain queued tasks behind them; then of an array's elements (one %16-capped
   array of --held elements, each finished before the next acquire), with the same backlog
   and --waiting dependent jobs besides (their tasks held, outside task_queue).
4. read: what `GET /v1/jobs/{id}` renders (views.render), in-process, for an array of --held
   elements half of them ended (a quarter failed, a quarter cancelled) and the rest queued;
   beside it the render of a one-task job on the same state file.

    python scripts/bench_arrays.py [--size 10000] [--run-size 1000] [--repeat 5] [--json]

Medians, and ratios to the baseline of the same run.
"""
from __future__ import annotations

import argparse
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import benchlib  # noqa: E402


def submit_times(size: int, repeat: int) -> dict:
    array, single = [], []
    with benchlib.Server() as srv:
        s, headers = benchlib.session(srv.verify), srv.client_headers()
        for _ in range(repeat):
            for spec, out in (({"command": ["true"], "array": f"0-{size - 1}"}, array), ({"command": ["true"]}, single)):
                t0 = time.perf_counter()
                s.post(srv.url + "/v1/jobs", headers=headers, json=spec).raise_for_status()
                out.append(time.perf_counter() - t0)
    return {"elements": size, "array_submit_p50_ms": round(benchlib.median(array) * 1e3, 1),
            "one_task_submit_p50_ms": round(benchlib.median(single) * 1e3, 2),
            "array_submit_max_ms": round(max(array) * 1e3, 1)}


def run_times(size: int, repeat: int) -> dict:
    ours, xargs, server_cpu, agent_cpu = [], [], [], []
    with benchlib.Server() as srv:
        worker = srv.start_worker("bench", parallel=2)
        db = sqlite3.connect(f"file:{srv.state}?mode=ro", uri=True)
        try:
            s, headers = benchlib.session(srv.verify), srv.client_headers()
            for _ in range(repeat):
                t0 = time.perf_counter()
                subprocess.run(["xargs", "-P2", "-n1", "true"], input="\n".join(["x"] * size), text=True, check=True)
                xargs.append(time.perf_counter() - t0)
                cpu0 = benchlib.cpu_seconds(srv.proc.pid), benchlib.cpu_seconds(worker.pid)
                t0 = time.perf_counter()
                job = s.post(srv.url + "/v1/jobs", headers=headers,
                             json={"command": ["true"], "array": f"0-{size - 1}"}).json()
                while True:  # read off the state file, as bench_vs_slurm does: no Job renders on the server's CPU
                    state = db.execute("SELECT state FROM jobs WHERE id = ?", (job["id"],)).fetchone()[0]
                    if state not in ("queued", "running"):
                        break
                    time.sleep(0.01)
                ours.append(time.perf_counter() - t0)
                server_cpu.append(benchlib.cpu_seconds(srv.proc.pid) - cpu0[0])
                agent_cpu.append(benchlib.cpu_seconds(worker.pid) - cpu0[1])  # the agent alone, not its tasks
                if state != "succeeded":
                    raise RuntimeError(f"the array ended {state}")
        finally:
            db.close()
            worker.stop()
    return {"elements": size, "gpulayer_p50_s": round(benchlib.median(ours), 2),
            "xargs_p50_s": round(benchlib.median(xargs), 3),
            "ratio": round(benchlib.median(ours) / benchlib.median(xargs), 2),
            "gpulayer_elements_per_s": round(size / benchlib.median(ours), 1),
            "server_cpu_ms_per_element": round(benchlib.median(server_cpu) / size * 1e3, 2),
            "agent_cpu_ms_per_element": round(benchlib.median(agent_cpu) / size * 1e3, 2)}


def acquire_times(backlog: int, held: int, waiting: int, n: int) -> dict:
    from gpulayer.server.scheduler import jobs, lifecycle, placement
    from gpulayer.server.scheduler.spec import validate_job
    from gpulayer.server.store import db

    def measure(with_arrays: bool) -> list[float]:
        path = Path(tempfile.mkdtemp(prefix="bench-arrays-")) / "state.db"
        store = db.Store(path, synchronous="normal")
        now = time.time()
        store.write(lambda c: c.execute(
            "INSERT INTO workers (name, state, cpus, memory_mb, slots, registered_at, last_seen_at, lease_expires_at)"
            " VALUES ('w', 'online', 64, 1048576, 1, ?, ?, ?)", (now, now, now + 1e9)))
        for _ in range(backlog + n):
            store.write(jobs.submit, validate_job({"command": ["true"], "priority": -1}), now)
        if with_arrays:
            blocker = store.write(jobs.submit, validate_job({"command": ["true"], "gpus": 8}), now)
            store.write(jobs.submit, validate_job({"command": ["true"], "array": f"0-{held - 1}%16"}), now)
            spec = validate_job({"command": ["true"], "after": [blocker]})
            store.write(lambda c: [jobs.submit(c, spec, now) for _ in range(waiting)])
        conn = db.connect(path)
        spent = []
        for _ in range(n):
            t0 = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            task = placement.acquire(conn, 1, time.time(), 60.0)
            conn.execute("COMMIT")
            spent.append(time.perf_counter() - t0)
            if task is None:
                raise RuntimeError("acquire found nothing")
            with conn:
                lifecycle.finish(conn, 1, task, 0, "succeeded", {}, None, time.time())
        conn.close()
        store.close()
        return spent

    plain, arrays = measure(False), measure(True)
    return {"backlog": backlog, "held_elements": held, "waiting_jobs": waiting,
            "plain_p50_ms": round(benchlib.median(plain) * 1e3, 3),
            "with_arrays_p50_ms": round(benchlib.median(arrays) * 1e3, 3),
            "ratio": round(benchlib.median(arrays) / benchlib.median(plain), 2)}


def read_times(elements: int, n: int) -> dict:
    from gpulayer.server.scheduler import jobs, views
    from gpulayer.server.scheduler.spec import validate_job
    from gpulayer.server.store import db

    path = Path(tempfile.mkdtemp(prefix="bench-arrays-read-")) / "state.db"
    store = db.Store(path, synchronous="normal")
    now = time.time()
    single = store.write(jobs.submit, validate_job({"command": ["true"]}), now)
    array = store.write(jobs.submit, validate_job({"command": ["true"], "array": f"0-{elements - 1}"}), now)

    def end_half(conn):  # as if run: a quarter failed, a quarter cancelled, the job still running
        conn.execute("UPDATE jobs SET state = 'running' WHERE id = ?", (array,))
        conn.execute("DELETE FROM task_queue WHERE task_id IN (SELECT id FROM tasks WHERE job_id = ? AND \"index\" < ?)",
                     (array, elements // 2))
        conn.execute("UPDATE tasks SET state = CASE WHEN \"index\" % 2 THEN 'failed' ELSE 'cancelled' END, "
                     "exit_code = 1, started_at = ?, finished_at = ? WHERE job_id = ? AND \"index\" < ?",
                     (now, now, array, elements // 2))
    store.write(end_half)
    conn = db.connect(path)
    spent: dict[int, list[float]] = {single: [], array: []}
    for _ in range(n):
        for job_id, out in spent.items():
            t0 = time.perf_counter()
            views.render(conn, job_id)
            out.append(time.perf_counter() - t0)
    conn.close()
    store.close()
    return {"elements": elements, "one_task_p50_ms": round(benchlib.median(spent[single]) * 1e3, 3),
            "array_p50_ms": round(benchlib.median(spent[array]) * 1e3, 2),
            "ratio": round(benchlib.median(spent[array]) / benchlib.median(spent[single]), 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=10_000, help="elements of the submitted array")
    parser.add_argument("--run-size", type=int, default=1_000, help="`true` elements run through one worker")
    parser.add_argument("--repeat", type=int, default=5, help="submits and runs of each")
    parser.add_argument("--backlog", type=int, default=1_000, help="plain queued tasks acquire sees")
    parser.add_argument("--held", type=int, default=100_000, help="elements of the capped array (held)")
    parser.add_argument("--waiting", type=int, default=10_000, help="waiting dependent jobs")
    parser.add_argument("--acquisitions", type=int, default=300, help="timed acquisitions")
    parser.add_argument("--reads", type=int, default=15, help="timed renders of each job (part read)")
    parser.add_argument("--skip", default="", help="comma list of parts to skip: submit, run, acquire, read")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    result: dict = {"machine": benchlib.machine()}
    if "submit" not in skip:
        result["submit"] = submit_times(args.size, args.repeat)
    if "run" not in skip:
        result["run"] = run_times(args.run_size, args.repeat)
    if "acquire" not in skip:
        result["acquire"] = acquire_times(args.backlog, args.held, args.waiting, args.acquisitions)
    if "read" not in skip:
        result["read"] = read_times(args.held, args.reads)
    text = "\n\n".join([benchlib.machine_line(result["machine"])] +
                       [f"{part}:\n" + benchlib.table([result[part]]) for part in ("submit", "run", "acquire", "read")
                        if part in result])
    benchlib.emit(result, args.json, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
