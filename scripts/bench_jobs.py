#!/usr/bin/env python3
"""Trivial jobs end to end, submit-to-running latency, and the cost of idle workers.

throughput: --jobs jobs `true` through a real server (subprocess) and one real
            worker (`gpulayer worker start --parallel 2`, subprocess), timed from
            the first POST /v1/jobs to the last job's finished_at; against the
            same commands run directly, --parallel at a time (subprocess), same run;
            and the agent's own CPU (utime+stime of the worker process, not its
            tasks) over those jobs, per task.
latency:    with the worker idle (long-polling acquire), --latency-jobs jobs one
            after another: time from just before POST /v1/jobs to the task's
            started_at (the task_started event's time, same clock).
idle:       a fresh server, --idle-workers simulated workers (plain requests) that
            behave like the agent: long-poll acquire for at most one heartbeat
            interval and skip the heartbeats while parked (the server says any
            request renews: `requests_renew_lease`); --idle-old-agent: heartbeat
            every 2 s and park 20 s. Answered at once past max_parked_acquires,
            they poll again after 2 s. The server's CPU (utime+stime from /proc) over --idle-seconds.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

H = benchlib.PROTOCOL_HEADER


SANDBOX = {"mode": "auto"}  # the worker's --sandbox: the default, or none for the sandbox's share (--sandbox)


def start_worker(srv, parallel: int):
    """A real worker process (gpulayer.testing.WorkerProcess), once online and long-polling."""
    worker = srv.start_worker("bench-worker", parallel=parallel, timeout=60, args=["--sandbox", SANDBOX["mode"]])
    time.sleep(0.5)  # let it reach its first long-poll
    return worker


def wait_all_done(srv, s, job_ids: list[int], timeout_s: float) -> list[dict]:
    """Poll until no job is queued or running; returns the jobs (rendered)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        busy = 0
        for state in ("queued", "running"):
            busy += len(s.get(srv.url + "/v1/jobs", params={"state": state, "limit": 1},
                              headers=srv.client_headers(), timeout=30).json()["jobs"])
        if not busy:
            break
        time.sleep(0.05)
    found, before = [], None
    while True:
        params = {"limit": 1000, **({"before": before} if before else {})}
        page = s.get(srv.url + "/v1/jobs", params=params, headers=srv.client_headers(), timeout=60).json()["jobs"]
        if not page:
            break
        found += page
        before = page[-1]["id"]
    wanted = set(job_ids)
    return [j for j in found if j["id"] in wanted]


def throughput(args) -> dict:
    with benchlib.Server() as srv:
        worker = start_worker(srv, args.parallel)
        try:
            local = threading.local()

            def submit(_):
                s = getattr(local, "s", None)
                if s is None:
                    s = local.s = benchlib.session()
                r = s.post(srv.url + "/v1/jobs", json={"command": [args.command]}, headers=srv.client_headers(),
                           timeout=60)
                r.raise_for_status()
                return r.json()["id"]

            agent_cpu0 = benchlib.cpu_seconds(worker.pid)
            t0 = time.time()
            with ThreadPoolExecutor(args.submitters) as pool:
                ids = list(pool.map(submit, range(args.jobs)))
            submitted = time.time()
            jobs = wait_all_done(srv, benchlib.session(), ids, args.timeout)
            agent_cpu = benchlib.cpu_seconds(worker.pid) - agent_cpu0  # the agent alone, not its tasks
        finally:
            worker.stop()
    states = {}
    for j in jobs:
        states[j["state"]] = states.get(j["state"], 0) + 1
    done = [j for j in jobs if j["finished_at"]]
    last = max(j["finished_at"] for j in done) if done else float("nan")
    # not all done within --timeout: project the rate of the ones that finished
    gp_s = (last - t0) * args.jobs / len(done) if done else float("nan")

    t1 = time.perf_counter()
    with ThreadPoolExecutor(args.parallel) as pool:
        list(pool.map(lambda _: subprocess.run([args.command], check=False), range(args.jobs)))
    direct_s = time.perf_counter() - t1
    return {"jobs": args.jobs, "parallel": args.parallel, "states": states, "completed": len(done),
            "projected": len(done) < args.jobs,
            "gpulayer_s": round(gp_s, 2), "submit_s": round(submitted - t0, 2),
            "agent_cpu_s": round(agent_cpu, 2), "agent_cpu_ms_per_task": round(1000 * agent_cpu / max(1, len(done)), 2),
            "direct_s": round(direct_s, 2), "ratio": round(gp_s / direct_s, 2),
            "gpulayer_jobs_per_s": round(args.jobs / gp_s, 1), "direct_jobs_per_s": round(args.jobs / direct_s, 1)}


def latency(args) -> dict:
    with benchlib.Server() as srv:
        worker = start_worker(srv, args.parallel)
        s = benchlib.session()
        samples, server_side = [], []
        try:
            time.sleep(1.0)
            for _ in range(args.latency_jobs):
                t0 = time.time()
                r = s.post(srv.url + "/v1/jobs", json={"command": [args.command]}, headers=srv.client_headers(),
                           timeout=30)
                r.raise_for_status()
                job = r.json()
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    j = s.get(f"{srv.url}/v1/jobs/{job['id']}", headers=srv.client_headers(), timeout=30).json()
                    started = [t["started_at"] for t in j["tasks"] if t["started_at"]]
                    if started and j["state"] not in ("queued", "running"):
                        samples.append(started[0] - t0)
                        server_side.append(started[0] - j["created_at"])
                        break
                    time.sleep(0.02)
                time.sleep(args.latency_gap)  # the worker is idle (long-polling) again
        finally:
            worker.stop()
    return {"jobs": len(samples), "submit_to_running": benchlib.summary_ms(samples),
            "created_to_running": benchlib.summary_ms(server_side)}


def idle_cpu(args) -> dict:
    with benchlib.Server() as srv:
        stop_ev = threading.Event()
        stats = {"acquires": 0, "immediate": 0, "heartbeats": 0, "skipped": 0, "errors": 0}
        lock = threading.Lock()
        s0 = benchlib.session()
        answers = [benchlib.register_worker(s0, srv.url, srv.tokens["join_token"], f"idle-{i}")
                   for i in range(args.idle_workers)]
        tokens = [a["session_token"] for a in answers]
        # As the agent: a server that renews leases on any request lets an idle worker whose acquire is
        # parked skip its heartbeats (docs/protocol.md, `requests_renew_lease`); --idle-old-agent beats anyway.
        may_skip = answers[0].get("requests_renew_lease") is True and not args.idle_old_agent
        # Such an agent parks for at most one heartbeat interval (agent/session.py `_acquire_wait_s`): the wait
        # renews nothing, so its acquire is its one request per interval. An old agent parks 20 s.
        wait_s = min(20.0, float(answers[0].get("heartbeat_interval_s") or 2.0)) if may_skip else 20.0
        parked: set[str] = set()

        def heartbeats(token):
            s, hdr = benchlib.session(), {**H, "Authorization": f"Bearer {token}"}
            while not stop_ev.wait(2.0):
                if may_skip and token in parked:
                    with lock:
                        stats["skipped"] += 1
                    continue
                try:
                    s.post(srv.url + "/v1/worker/heartbeat", json={"tasks": []}, headers=hdr, timeout=30)
                    with lock:
                        stats["heartbeats"] += 1
                except Exception:  # noqa: BLE001
                    with lock:
                        stats["errors"] += 1

        def acquires(token):
            s, hdr = benchlib.session(), {**H, "Authorization": f"Bearer {token}"}
            while not stop_ev.is_set():
                t0 = time.monotonic()
                try:
                    parked.add(token)
                    s.post(srv.url + "/v1/worker/acquire", json={"wait_s": wait_s}, headers=hdr, timeout=40)
                    parked.discard(token)
                except Exception:  # noqa: BLE001
                    parked.discard(token)
                    with lock:
                        stats["errors"] += 1
                    stop_ev.wait(2.0)
                    continue
                with lock:
                    stats["acquires"] += 1
                if time.monotonic() - t0 < wait_s / 2:  # not parked: poll gently, like the agent
                    with lock:
                        stats["immediate"] += 1
                    stop_ev.wait(2.0)

        threads = [threading.Thread(target=f, args=(t,), daemon=True) for t in tokens for f in (heartbeats, acquires)]
        for t in threads:
            t.start()
        time.sleep(3.0)  # settle: everyone parked or polling
        with lock:
            for k in stats:
                stats[k] = 0
        cpu0, wall0 = benchlib.cpu_seconds(srv.proc.pid), time.perf_counter()
        time.sleep(args.idle_seconds)
        cpu = benchlib.cpu_seconds(srv.proc.pid) - cpu0
        wall = time.perf_counter() - wall0
        snapshot = dict(stats)
        stop_ev.set()
    return {"workers": args.idle_workers, "seconds": round(wall, 1), "server_cpu_s": round(cpu, 2),
            "server_cpu_pct_of_core": round(100 * cpu / wall, 2), **snapshot}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--command", default="true")
    p.add_argument("--submitters", type=int, default=4, help="threads submitting jobs")
    p.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for the jobs; past it the time is projected from those done")
    p.add_argument("--latency-jobs", type=int, default=50)
    p.add_argument("--latency-gap", type=float, default=0.2)
    p.add_argument("--idle-workers", type=int, default=100)
    p.add_argument("--idle-seconds", type=float, default=30.0)
    p.add_argument("--idle-old-agent", action="store_true",
                   help="idle workers heartbeat every 2 s even when the server says any request renews the lease")
    p.add_argument("--only", choices=["throughput", "latency", "idle"], default=None)
    p.add_argument("--json", action="store_true")
    p.add_argument("--sandbox", choices=("auto", "none"), default="auto",
                   help="the worker's --sandbox (default auto, as `worker start`; none: the sandbox's share)")
    args = p.parse_args(argv)
    SANDBOX["mode"] = args.sandbox

    result = {"machine": benchlib.machine(), "args": vars(args)}
    if args.only in (None, "throughput"):
        result["throughput"] = throughput(args)
    if args.only in (None, "latency"):
        result["latency"] = latency(args)
    if args.only in (None, "idle"):
        result["idle"] = idle_cpu(args)

    text = [benchlib.machine_line(result["machine"]), ""]
    if "throughput" in result:
        t = result["throughput"]
        text += [f"{t['jobs']} x `{args.command}` (target: gpulayer within 3x of direct):",
                 benchlib.table([{"path": "gpulayer (server + worker --parallel %d)" % t["parallel"],
                                  "seconds": t["gpulayer_s"], "jobs_per_s": t["gpulayer_jobs_per_s"]},
                                 {"path": "direct subprocess, %d at a time" % t["parallel"],
                                  "seconds": t["direct_s"], "jobs_per_s": t["direct_jobs_per_s"]}]),
                 f"ratio {t['ratio']}x; job states {t['states']}; submitting took {t['submit_s']} s; "
                 f"agent CPU {t['agent_cpu_s']} s ({t['agent_cpu_ms_per_task']} ms per task)"
                 + (f"; PROJECTED from the {t['completed']} done within --timeout" if t["projected"] else ""), ""]
    if "latency" in result:
        lat = result["latency"]
        text += ["submit -> running with an idle worker (target p50 <= 100 ms, p99 <= 500 ms):",
                 benchlib.table([{"measure": "POST -> started_at", **lat["submit_to_running"]},
                                 {"measure": "created_at -> started_at", **lat["created_to_running"]}]), ""]
    if "idle" in result:
        i = result["idle"]
        text += [f"{i['workers']} idle workers over {i['seconds']} s (target <= 5% of a core):",
                 benchlib.table([i])]
    benchlib.emit(result, args.json, "\n".join(text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
