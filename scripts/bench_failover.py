#!/usr/bin/env python3
"""Losing the control plane's machine: RPO, RTO and the cost of replication (Litestream), measured.

Overhead: a submit storm (--threads clients, --overhead-s seconds) against a
control plane without replication and one with `--replicate DIR`, alternated
--rounds times in the same run; jobs/s and submit p50/p99.

RPO and RTO, --runs times: a control plane with `--replicate DIR
--replicate-interval I` and a real worker (`gpulayer worker start`, running
each job), a submit storm; at --storm-s the server and its Litestream are
SIGKILLed and the home is removed (the machine is gone). A new home is
restored from the replica (`gpulayer server restore --force`: the bench knows
the machine is gone; an operator who does not waits for the writer lease, 10 s)
and started at the same address. Counted: acknowledged jobs missing from the
restored state and how long before the kill the oldest of them was
acknowledged (the window of loss; the target is one interval); the time from
the kill to /v1/health answering, to the worker heartbeating again, and to a
job submitted to the restored plane having run (RTO), and to the first task
acquired there (not counting tasks adopted from what the worker reported).

    python scripts/bench_failover.py --json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

from gpulayer.testing import ControlPlaneProcess, run_cli, wait_for  # noqa: E402


def storm(url: str, token: str, stop: threading.Event, acked: list, latencies: list) -> None:
    """Submit `true` jobs until stopped; (job id, time of the 201) into `acked`."""
    s = benchlib.session()
    headers = {"Authorization": f"Bearer {token}"}
    while not stop.is_set():
        began = time.perf_counter()
        try:
            r = s.post(f"{url}/v1/jobs", json={"command": ["true"]}, headers=headers, timeout=10)
        except requests.RequestException:
            stop.wait(0.05)
            continue
        if r.status_code == 201:
            acked.append((r.json()["id"], time.time()))
            latencies.append(time.perf_counter() - began)


def run_storm(srv: ControlPlaneProcess, threads: int, seconds: float | None, stop: threading.Event | None = None):
    """A storm for `seconds` (or until `stop`); returns (acked, latencies, elapsed)."""
    stop = stop or threading.Event()
    acked: list = []
    latencies: list = []
    workers = [threading.Thread(target=storm, args=(srv.url, srv.client_token, stop, acked, latencies), daemon=True)
               for _ in range(threads)]
    began = time.perf_counter()
    for t in workers:
        t.start()
    if seconds is not None:
        time.sleep(seconds)
        stop.set()
    for t in workers:
        t.join(15)
    return acked, latencies, time.perf_counter() - began


def overhead(root: Path, threads: int, seconds: float, rounds: int, interval: float) -> list[dict]:
    out = []
    for i in range(rounds):
        for mode in ("off", "on"):
            args = ["--replicate", str(root / f"ovh-replica-{i}"), "--replicate-interval", str(interval)] \
                if mode == "on" else []
            with ControlPlaneProcess(root / f"ovh-{mode}-{i}", args=args) as srv:
                child = srv.get_json("/v1/health").get("replication", {}).get("pid")
                cpu = [benchlib.cpu_seconds(p) for p in (srv.proc.pid, child) if p]
                acked, lat, elapsed = run_storm(srv, threads, seconds)
                cpu = [benchlib.cpu_seconds(p) - c for p, c in zip((srv.proc.pid, child), cpu)]
            out.append({"round": i, "replication": mode, "jobs_per_s": round(len(acked) / elapsed, 1),
                        **benchlib.summary_ms(lat), "server_cores": round(cpu[0] / elapsed, 2),
                        "litestream_cores": round(cpu[1] / elapsed, 2) if len(cpu) > 1 else 0.0,
                        "loadavg": round(os.getloadavg()[0], 2)})
    return out


def one_failover(root: Path, threads: int, storm_s: float, interval: float, heartbeat: float) -> dict:
    replica = root / "replica"
    args = ["--replicate", str(replica), "--replicate-interval", str(interval)]
    old = ControlPlaneProcess(root / "old", heartbeat_interval=heartbeat, args=args).start()
    worker = old.start_worker("w1", parallel=4)
    stop = threading.Event()
    holder: dict = {}
    storming = threading.Thread(target=lambda: holder.update(zip(("acked", "lat", "elapsed"),
                                                                 run_storm(old, threads, None, stop))), daemon=True)
    storming.start()
    time.sleep(storm_s)
    litestream = old.get_json("/v1/health")["replication"]["pid"]
    killed_at = time.time()   # the machine is gone: its server and its Litestream at once
    old.proc.send_signal(signal.SIGKILL)
    os.kill(litestream, signal.SIGKILL)
    old.proc.wait()
    stop.set()
    storming.join(20)
    shutil.rmtree(old.home)
    began = time.time()
    done = run_cli("server", "restore", "--from", str(replica), "--home", str(root / "new" / "home"), "--json",
                   "--force", timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"restore failed: {done.stderr}")
    restore_s = time.time() - began
    new = ControlPlaneProcess(root / "new", heartbeat_interval=heartbeat, args=args, port=old.port)
    new.client_token, new.join_token = old.client_token, old.join_token
    new.start(timeout=60)
    serving_at = time.time()
    wait_for(lambda: (new.online_worker("w1") or {}).get("last_seen_at", 0) > serving_at, 60, "the worker's heartbeat")
    online = time.time()
    # The storm's backlog is queued ahead of anything new: the probe jumps it (priority), as urgent work would.
    probe = new.submit({"command": ["true"], "priority": 1000})
    new.wait_job(probe, timeout=120)
    ran_at = time.time()
    first_acquire = new.sql("SELECT min(at) FROM events WHERE kind = 'task_assigned' AND at > ? "
                            "AND json_extract(data, '$.reason') IS NOT 'reconciled'", (killed_at,))
    present = {r[0] for r in new.sql("SELECT id FROM jobs")}
    acked = holder.get("acked", [])
    missing = [(job_id, at) for job_id, at in acked if job_id not in present]
    window = killed_at - min(at for _, at in missing) if missing else 0.0
    worker.kill()
    new.stop()
    return {"acked": len(acked), "missing": len(missing), "loss_window_s": round(window, 3),
            "restore_s": round(restore_s, 2), "rto_serving_s": round(serving_at - killed_at, 2),
            "rto_worker_s": round(online - killed_at, 2),
            "rto_acquire_s": round(first_acquire[0][0] - killed_at, 2) if first_acquire[0][0] else None,
            "rto_job_s": round(ran_at - killed_at, 2), "loadavg": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="failovers (RPO, RTO)")
    parser.add_argument("--threads", type=int, default=6, help="submitting clients")
    parser.add_argument("--storm-s", type=float, default=5.0, help="seconds of submits before the kill")
    parser.add_argument("--interval", type=float, default=1.0, help="--replicate-interval, seconds")
    parser.add_argument("--heartbeat", type=float, default=2.0, help="--heartbeat-interval, seconds")
    parser.add_argument("--overhead-s", type=float, default=5.0, help="seconds of each overhead storm")
    parser.add_argument("--rounds", type=int, default=2, help="off/on pairs of the overhead storm")
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args()
    info = benchlib.machine()
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp:
        root = Path(tmp)
        cost = overhead(root, opts.threads, opts.overhead_s, opts.rounds, opts.interval)
        runs = [one_failover(root / f"run-{i}", opts.threads, opts.storm_s, opts.interval, opts.heartbeat)
                for i in range(opts.runs)]
    med = {mode: benchlib.median(r["jobs_per_s"] for r in cost if r["replication"] == mode) for mode in ("off", "on")}
    p99 = {mode: benchlib.median(r["p99_ms"] for r in cost if r["replication"] == mode) for mode in ("off", "on")}
    result = {"machine": info, "settings": vars(opts), "overhead": cost, "failovers": runs,
              "summary": {"jobs_per_s_off": med["off"], "jobs_per_s_on": med["on"],
                          "throughput_ratio_on_off": round(med["on"] / med["off"], 3) if med["off"] else None,
                          "p99_ms_off": p99["off"], "p99_ms_on": p99["on"],
                          "missing_acked_total": sum(r["missing"] for r in runs),
                          "largest_loss_window_s": max((r["loss_window_s"] for r in runs), default=0.0),
                          "rto_job_s_median": benchlib.median(r["rto_job_s"] for r in runs),
                          "rto_acquire_s_median": benchlib.median(r["rto_acquire_s"] for r in runs
                                                                  if r["rto_acquire_s"] is not None),
                          "rto_worker_s_median": benchlib.median(r["rto_worker_s"] for r in runs),
                          "loss_window_s_median": benchlib.median(r["loss_window_s"] for r in runs),
                          "rto_serving_s_median": benchlib.median(r["rto_serving_s"] for r in runs)}}
    text = "\n\n".join([benchlib.machine_line(info), benchlib.table(cost), benchlib.table(runs),
                        json.dumps(result["summary"], indent=2)])
    benchlib.emit(result, opts.json, text)


if __name__ == "__main__":
    main()
