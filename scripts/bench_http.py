#!/usr/bin/env python3
"""Task cycles and heartbeats per second through the real server, with p50/p99 per call.

The server is a real subprocess (`gpulayer server start` on a free loopback
port, temporary home), over plain HTTP and over TLS (certificate from
gpulayer.server.security.certs.ensure_tls). The load comes from separate processes (default
2 processes x 8 threads, each thread one simulated worker with a keep-alive
requests.Session). On a 2-core machine the load generator competes with the
server for the CPUs: the figures are a floor for the server alone.

cycles:     jobs `true` are submitted first (untimed); then every simulated
            worker loops acquire -> start -> finish until --duration is up.
heartbeats: --hb-workers workers register (untimed); --hb-busy of them take a
            task and report it running; then heartbeats go round-robin over all
            of them, as fast as the load allows, for --hb-duration seconds.
            The server runs with --lease-ttl --hb-lease-ttl: afterwards no job may be
            lost (a lost one counts as falsely lost when its worker's largest
            gap between heartbeats stayed under the lease TTL). With
            --hb-gpu-samples N each timed heartbeat carries N `gpu_samples`
            (one per GPU, as an agent with N GPUs sends each interval), and the
            rows the server stored are counted afterwards (`gpu_samples_stored`).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

H = benchlib.PROTOCOL_HEADER


def _worker_headers(token: str) -> dict:
    return {**H, "Authorization": f"Bearer {token}"}


# -- load processes ----------------------------------------------------------

def _cycle_proc(url, verify, join_token, threads, duration, start_at, out, name, finish_next=False, max_tasks=1):
    """One load process: `threads` simulated workers doing acquire -> start -> finish.

    With `finish_next`, finish asks for the next task (`next: true`), as the agent does, and
    acquire is called only when a finish brought none back (its time counts in the cycle then).
    With `max_tasks` > 1 each worker has that many slots and asks for that many assignments
    at once (`max_tasks`); it runs them one after another and asks again (acquire, or the
    last one's finish with `next`) once none is left.
    """
    sessions, tokens = [], []
    for i in range(threads):
        s = benchlib.LeanSession(url, verify)
        reg = benchlib.register_worker(s, url, join_token, f"{name}-{i}", slots=max_tasks)
        sessions.append(s)
        tokens.append(reg["session_token"])
    lat = {"acquire": [], "start": [], "finish": [], "cycle": []}
    counts = [0] * threads
    calls = [0] * threads
    errors = []
    lock = threading.Lock()

    def loop(i):
        s, hdr = sessions[i], _worker_headers(tokens[i])
        mine = {k: [] for k in lat}
        clock = time.perf_counter
        while time.time() < start_at:
            time.sleep(0.001)
        end = start_at + duration
        several = {"max_tasks": max_tasks} if max_tasks > 1 else {}
        pending: list = []
        try:
            while time.time() < end:
                t0 = clock()
                if not pending:
                    r = s.post(url + "/v1/worker/acquire", json={"wait_s": 0, **several}, headers=hdr, timeout=30)
                    r.raise_for_status()
                    calls[i] += 1
                    pending = _assignments(r.json())
                t1 = clock()
                if not pending:
                    break
                tid = pending.pop(0)["task_id"]
                r = s.post(f"{url}/v1/worker/tasks/{tid}/start", json={"pid": 1}, headers=hdr, timeout=30)
                t2 = clock()
                r.raise_for_status()
                ask = finish_next and not pending  # those held come back first: ask once they are done
                r = s.post(f"{url}/v1/worker/tasks/{tid}/finish",
                           json={"exit_code": 0, "outcome": "succeeded", "next": ask, **(several if ask else {})},
                           headers=hdr, timeout=30)
                t3 = clock()
                r.raise_for_status()
                calls[i] += 2
                if ask:
                    pending = _assignments(r.json())
                mine["acquire"].append(t1 - t0)
                mine["start"].append(t2 - t1)
                mine["finish"].append(t3 - t2)
                mine["cycle"].append(t3 - t0)
                counts[i] += 1
        except Exception as exc:  # noqa: BLE001 - reported
            errors.append(repr(exc))
        with lock:
            for k in lat:
                lat[k].extend(mine[k])

    pool = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    out.put({"lat": lat, "cycles": sum(counts), "calls": sum(calls), "errors": errors})


def _assignments(answer: dict) -> list:
    """The assignments an acquire (or finish with `next`) answer carries: `task`, then `more`."""
    return [answer["task"], *answer.get("more", [])] if answer.get("task") else []


def _gpu_samples(n: int) -> list[dict]:
    """An agent's `gpu_samples` for N GPUs over one interval (agent/gpu/stats.py's shape)."""
    now = round(time.time(), 3)
    return [{"index": i, "at": now, "utilization_pct": 87.5, "memory_used_mb": 30512, "memory_total_mb": 81559}
            for i in range(n)]


def _heartbeat_proc(url, verify, creds, threads, duration, start_at, out, gpu_samples=0):
    """Heartbeats round-robin over `creds` [(token, [task_id, ...], last heard or None)] from `threads` sessions.

    A worker's largest gap counts from its last word before the load (the warm-up heartbeat),
    or from `start_at` for one that said nothing since registering.
    """
    lat, errors = [], []
    last_seen: dict[int, float] = {}
    max_gap: dict[int, float] = {}
    lock = threading.Lock()
    cursor = [0]

    def next_index():
        with lock:
            i = cursor[0]
            cursor[0] = (i + 1) % len(creds)
            return i

    def loop():
        s = benchlib.LeanSession(url, verify)
        mine = []
        clock = time.perf_counter
        while time.time() < start_at:
            time.sleep(0.001)
        end = start_at + duration
        try:
            while time.time() < end:
                i = next_index()
                token, tasks, _ = creds[i]
                body = {"tasks": [{"task_id": t, "state": "running", "endpoint": None, "restarts": 0} for t in tasks]}
                if gpu_samples:
                    body["gpu_samples"] = _gpu_samples(gpu_samples)
                t0 = clock()
                r = s.post(url + "/v1/worker/heartbeat", json=body, headers=_worker_headers(token), timeout=30)
                mine.append(clock() - t0)
                r.raise_for_status()
                answer = r.json()
                if answer["cancel_task_ids"] or answer["revoked"]:
                    errors.append(f"worker {i}: told to cancel {answer['cancel_task_ids']}")
                now = time.time()
                with lock:
                    prev = last_seen.get(i) or creds[i][2] or start_at
                    max_gap[i] = max(max_gap.get(i, 0.0), now - prev)
                    last_seen[i] = now
        except Exception as exc:  # noqa: BLE001
            errors.append(repr(exc))
        with lock:
            lat.extend(mine)

    pool = [threading.Thread(target=loop) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    busy_gaps = [max_gap.get(i, duration) for i, (_, tasks, _) in enumerate(creds) if tasks]
    out.put({"lat": lat, "errors": errors[:20], "error_count": len(errors),
             "max_gap_busy_s": max(busy_gaps) if busy_gaps else 0.0,
             "max_gap_all_s": max(max_gap.values()) if max_gap else 0.0})


# -- the runs ----------------------------------------------------------------

def submit_jobs(srv, n: int, threads: int = 8) -> float:
    """Submit n `true` jobs; returns the submissions per second (informational)."""
    local = threading.local()

    def one(_):
        s = getattr(local, "s", None)
        if s is None:
            s = local.s = benchlib.session(srv.verify)
        r = s.post(srv.url + "/v1/jobs", json={"command": ["true"]}, headers=srv.client_headers(), timeout=60)
        r.raise_for_status()

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(n)))
    return n / (time.perf_counter() - t0)


def _run_load(ctx, args, srv, label: str, start_at: float, duration: float, target):
    """Start --procs load processes (`target(p, out)` gives each one's function and arguments), time them.

    Returns (their results, wall seconds, server CPU seconds) from `start_at` until every process reported.
    """
    out = ctx.Queue()
    procs = [ctx.Process(target=fn, args=fn_args) for fn, fn_args in (target(p, out) for p in range(args.procs))]
    for p in procs:
        p.start()
    while time.time() < start_at:
        time.sleep(0.01)
    cpu0, wall0 = benchlib.cpu_seconds(srv.proc.pid), time.perf_counter()
    profile = _maybe_profile(args, srv.proc.pid, label)
    results = [out.get(timeout=duration + 120) for _ in procs]
    wall = time.perf_counter() - wall0
    cpu = benchlib.cpu_seconds(srv.proc.pid) - cpu0
    for p in procs:
        p.join()
    if profile:
        profile.wait()
    return results, wall, cpu


def run_cycles(args, tls: bool) -> dict:
    ctx = mp.get_context("fork")
    with benchlib.Server(tls=tls, synchronous=args.synchronous,
                         extra_args=["--http", args.http, *args.server_arg]) as srv:
        submit_rate = submit_jobs(srv, args.jobs)
        start_at = time.time() + 2.0 + 0.3 * args.threads
        results, wall, cpu = _run_load(
            ctx, args, srv, "cycles" + ("-tls" if tls else ""), start_at, args.duration,
            lambda p, out: (_cycle_proc, (srv.url, srv.verify, srv.tokens["join_token"], args.threads,
                                          args.duration, start_at, out, f"p{p}", args.finish_next,
                                          args.max_tasks)))
    lat = {k: [x for r in results for x in r["lat"][k]] for k in ("acquire", "start", "finish", "cycle")}
    cycles = sum(r["cycles"] for r in results)
    calls = sum(r["calls"] for r in results)
    spent = min(wall, args.duration) if cycles else wall
    return {"transport": "tls" if tls else "http", "front_end": args.http,
            "workers": args.procs * args.threads, "cycles": cycles,
            "max_tasks": args.max_tasks, "cycles_per_s": round(cycles / spent, 1),
            "calls_per_s": round(calls / spent, 1), "calls_per_cycle": round(calls / max(1, cycles), 2),
            "server_cpu_cores": round(cpu / wall, 2), "submit_per_s": round(submit_rate, 1),
            **{k: benchlib.summary_ms(v) for k, v in lat.items()},
            "errors": [e for r in results for e in r["errors"]][:10]}


def run_heartbeats(args, tls: bool) -> dict:
    ctx = mp.get_context("fork")
    extra = ["--http", args.http, "--lease-ttl", str(args.hb_lease_ttl),
             "--heartbeat-interval", str(min(2.0, args.hb_lease_ttl / 3))]
    with benchlib.Server(tls=tls, synchronous=args.synchronous, extra_args=extra) as srv:
        # register (untimed), busy workers take a task each and start it
        local = threading.local()

        def reg(i):
            s = getattr(local, "s", None)
            if s is None:
                s = local.s = benchlib.session(srv.verify)
            return benchlib.register_worker(s, srv.url, srv.tokens["join_token"], f"hb-{i}")["session_token"]

        t0 = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            tokens = list(pool.map(reg, range(args.hb_workers)))
        tokens.reverse()   # the busy ones (first below) registered last: their leases are freshest
        register_rate = args.hb_workers / (time.perf_counter() - t0)
        submit_jobs(srv, args.hb_busy)
        s = benchlib.session(srv.verify)
        creds = []
        for i, token in enumerate(tokens):
            tasks = []
            if i < args.hb_busy:
                hdr = _worker_headers(token)
                # a heartbeat first: on a loaded machine this setup outlasts a lease registered at the start
                s.post(srv.url + "/v1/worker/heartbeat", json={"tasks": []}, headers=hdr, timeout=30).raise_for_status()
                task = s.post(srv.url + "/v1/worker/acquire", json={}, headers=hdr, timeout=30).json()["task"]
                s.post(f"{srv.url}/v1/worker/tasks/{task['task_id']}/start", json={}, headers=hdr,
                       timeout=30).raise_for_status()
                tasks = [task["task_id"]]
            creds.append((token, tasks))
        # One untimed heartbeat from each worker (8 at a time) just before the load: a task
        # is lost when its worker's lease lapses, and a busy worker's last word was its
        # registration, seconds ago while the others registered (this ramp lost all 200 busy
        # tasks at a 6 s TTL, on the old code and the new).
        def warm(cred):
            token, tasks = cred
            body = {"tasks": [{"task_id": t, "state": "running", "endpoint": None, "restarts": 0} for t in tasks]}
            hb = getattr(local, "s", None) or benchlib.session(srv.verify)
            local.s = hb
            hb.post(srv.url + "/v1/worker/heartbeat", json=body, headers=_worker_headers(token),
                    timeout=30).raise_for_status()
            return time.time()

        # Every worker says a word before the load, in the order the load visits them, so it measures a fleet that
        # heartbeats, not 2,000 workers coming back online after the setup outlasted their leases.
        with ThreadPoolExecutor(8) as pool:
            heard = list(pool.map(warm, creds))
        creds = [(token, tasks, heard[i] if i < len(heard) else None) for i, (token, tasks) in enumerate(creds)]
        share = [creds[p::args.procs] for p in range(args.procs)]
        start_at = time.time() + 0.5 + 0.05 * args.threads
        results, wall, cpu = _run_load(
            ctx, args, srv, "heartbeats" + ("-tls" if tls else ""), start_at, args.hb_duration,
            lambda p, out: (_heartbeat_proc, (srv.url, srv.verify, share[p], args.threads, args.hb_duration,
                                              start_at, out, args.hb_gpu_samples)))
        time.sleep(1.5)  # one more upkeep round
        stored = srv.sql("SELECT count(*) FROM gpu_samples")[0][0] if args.hb_gpu_samples else None
        jobs = s.get(srv.url + "/v1/jobs", params={"limit": 1000}, headers=srv.client_headers(), timeout=60).json()
        lost = [j["id"] for j in jobs["jobs"] if j["state"] in ("lost", "failed")
                or any(t["state"] == "lost" for t in j["tasks"])]
    lat = [x for r in results for x in r["lat"]]
    max_gap_busy = max(r["max_gap_busy_s"] for r in results)
    return {"transport": "tls" if tls else "http", "front_end": args.http,
            "workers": args.hb_workers, "busy_workers": args.hb_busy,
            "connections": args.procs * args.threads, "heartbeats": len(lat),
            "heartbeats_per_s": round(len(lat) / min(wall, args.hb_duration), 1),
            "server_cpu_cores": round(cpu / wall, 2), "register_per_s": round(register_rate, 1),
            "heartbeat": benchlib.summary_ms(lat), "lease_ttl_s": args.hb_lease_ttl,
            "max_gap_busy_s": round(max_gap_busy, 2), "max_gap_all_s": round(max(r["max_gap_all_s"] for r in results), 2),
            "jobs_lost": len(lost), "falsely_lost": len(lost) if max_gap_busy < args.hb_lease_ttl else 0,
            "gpu_samples_per_heartbeat": args.hb_gpu_samples, "gpu_samples_stored": stored,
            "errors": [e for r in results for e in r["errors"]][:10],
            "error_count": sum(r["error_count"] for r in results)}


def _maybe_profile(args, pid: int, label: str):
    if not args.profile:
        return None
    import subprocess
    dest = Path(args.profile_dir) / f"{label}.txt"
    dest.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(["py-spy", "record", "-p", str(pid), "-d", str(int(max(1, args.duration - 1))),
                             "-r", "200", "-f", "raw", "-o", str(dest), "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--procs", type=int, default=2, help="load-generator processes (default 2)")
    p.add_argument("--threads", type=int, default=8, help="simulated workers (threads) per process (default 8)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of cycles per transport")
    p.add_argument("--jobs", type=int, default=3000, help="jobs submitted before the cycles (an upper bound)")
    p.add_argument("--hb-workers", type=int, default=2000)
    p.add_argument("--hb-busy", type=int, default=200, help="workers that hold a running task during heartbeats")
    p.add_argument("--hb-duration", type=float, default=10.0)
    p.add_argument("--hb-lease-ttl", type=float, default=6.0)
    p.add_argument("--hb-gpu-samples", type=int, default=0,
                   help="`gpu_samples` each timed heartbeat carries (an agent with that many GPUs; default 0)")
    p.add_argument("--transports", nargs="+", default=["http", "tls"], choices=["http", "tls"])
    p.add_argument("--only", choices=["cycles", "heartbeats"], default=None)
    p.add_argument("--synchronous", default="normal", choices=["normal", "full"])
    p.add_argument("--profile", action="store_true", help="py-spy the server (raw stacks into --profile-dir)")
    p.add_argument("--profile-dir", default="/tmp/gpulayer-bench-profile")
    p.add_argument("--finish-next", action="store_true",
                   help="finish asks for the next task (`next: true`, as the agent does): 2 requests per cycle")
    p.add_argument("--max-tasks", type=int, default=1,
                   help="slots per simulated worker, and assignments asked for at once (`max_tasks`; default 1)")
    p.add_argument("--http", default="granian", choices=["granian", "cheroot"],
                   help="the server's front end (`server start --http`; default granian, the server's own)")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="one more argument for `server start` in the cycles run (repeatable, e.g. "
                        "--server-arg=--estimate-max-jobs --server-arg=0)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    result = {"machine": benchlib.machine(), "args": vars(args), "cycles": [], "heartbeats": []}
    for transport in args.transports:
        if args.only in (None, "cycles"):
            result["cycles"].append(run_cycles(args, transport == "tls"))
        if args.only in (None, "heartbeats"):
            result["heartbeats"].append(run_heartbeats(args, transport == "tls"))

    text = [benchlib.machine_line(result["machine"]),
            f"load: {args.procs} processes x {args.threads} threads on the same machine as the server", ""]
    if result["cycles"]:
        rows = []
        for c in result["cycles"]:
            for call in ("acquire", "start", "finish", "cycle"):
                rows.append({"transport": c["transport"], "workers": c["workers"], "cycles_per_s": c["cycles_per_s"],
                             "server_cpu": c["server_cpu_cores"], "call": call, "p50_ms": c[call]["p50_ms"],
                             "p99_ms": c[call]["p99_ms"], "max_ms": c[call]["max_ms"]})
        text += ["acquire -> start -> finish cycles (target >= 1,500/s, p99 < 20 ms):", benchlib.table(rows), ""]
        for c in result["cycles"]:
            if c["errors"]:
                text.append(f"{c['transport']} errors: {c['errors']}")
    if result["heartbeats"]:
        rows = [{"transport": h["transport"], "workers": h["workers"], "busy": h["busy_workers"],
                 "heartbeats_per_s": h["heartbeats_per_s"], "server_cpu": h["server_cpu_cores"],
                 "p50_ms": h["heartbeat"]["p50_ms"], "p99_ms": h["heartbeat"]["p99_ms"],
                 "max_gap_s": h["max_gap_all_s"], "lost": h["jobs_lost"], "falsely_lost": h["falsely_lost"],
                 "errors": h["error_count"]} for h in result["heartbeats"]]
        text += ["heartbeats (target 5,000/s, p99 < 50 ms, none falsely lost):", benchlib.table(rows)]
    benchlib.emit(result, args.json, "\n".join(text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
