#!/usr/bin/env python3
"""The HTTP front ends (cheroot, granian) serving the same control plane, under the same load.

For each front end, in turn, in one run: a real `gpulayer server start --http
FRONT` subprocess (temporary home, loopback, plain HTTP or TLS), the whole
ControlPlane behind it (writer, upkeep, explorer mount). The load is --procs
processes x --threads keep-alive http.client connections, each sending its
route back to back for --duration seconds:

health:    GET /v1/health (no token)
jobs:      GET /v1/jobs?limit=1 with the client token (one job submitted first)
heartbeat: POST /v1/worker/heartbeat round-robin over --workers registered
           workers (no tasks)

Reported per front end and route: requests/s, p50/p99, the server's CPU
(cores), and each front end's requests/s over cheroot's.
"""
from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import ssl
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

H = benchlib.PROTOCOL_HEADER
ROUTES = ("health", "jobs", "heartbeat")


def _connect(url: str, cafile):
    parts = urlsplit(url)
    if parts.scheme == "https":
        ctx = ssl.create_default_context(cafile=cafile)
        return http.client.HTTPSConnection(parts.hostname, parts.port, context=ctx, timeout=60)
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)


def _load_proc(url, cafile, route, client_headers, worker_tokens, threads, duration, start_at, out):
    """One load process: `threads` keep-alive connections sending `route` until --duration is up."""
    lat: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def loop(i):
        conn = _connect(url, cafile)
        mine = []
        clock = time.perf_counter
        hb_body = json.dumps({"tasks": []}).encode()
        tokens = worker_tokens[i::threads] or worker_tokens
        n = 0
        while time.time() < start_at:
            time.sleep(0.001)
        end = start_at + duration
        try:
            while time.time() < end:
                t0 = clock()
                if route == "health":
                    conn.request("GET", "/v1/health", headers=H)
                elif route == "jobs":
                    conn.request("GET", "/v1/jobs?limit=1", headers=client_headers)
                else:
                    token = tokens[n % len(tokens)]
                    conn.request("POST", "/v1/worker/heartbeat", body=hb_body,
                                 headers={**H, "Authorization": f"Bearer {token}",
                                          "Content-Type": "application/json"})
                response = conn.getresponse()
                response.read()
                mine.append(clock() - t0)
                n += 1
                if response.status != 200:
                    errors.append(f"HTTP {response.status}")
                    break
        except Exception as exc:  # noqa: BLE001 - reported
            errors.append(repr(exc))
        with lock:
            lat.extend(mine)

    pool = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    out.put({"lat": lat, "errors": errors[:10]})


def run_route(ctx, args, srv, route, worker_tokens) -> dict:
    cafile = str(srv.ca_file) if srv.ca_file else None
    out = ctx.Queue()
    start_at = time.time() + 1.5
    per_proc = [worker_tokens[p::args.procs] for p in range(args.procs)]
    procs = [ctx.Process(target=_load_proc, args=(srv.url, cafile, route, srv.client_headers(), per_proc[p],
                                                  args.threads, args.duration, start_at, out))
             for p in range(args.procs)]
    for p in procs:
        p.start()
    while time.time() < start_at:
        time.sleep(0.01)
    cpu0, wall0 = benchlib.cpu_seconds(srv.proc.pid), time.perf_counter()
    results = [out.get(timeout=args.duration + 120) for _ in procs]
    wall = time.perf_counter() - wall0
    cpu = benchlib.cpu_seconds(srv.proc.pid) - cpu0
    for p in procs:
        p.join()
    lat = [x for r in results for x in r["lat"]]
    errors = [e for r in results for e in r["errors"]]
    s = benchlib.summary_ms(lat)
    return {"route": route, "requests": len(lat), "req_per_s": round(len(lat) / wall, 1),
            "p50_ms": s["p50_ms"], "p99_ms": s["p99_ms"], "server_cpu": round(cpu / wall, 2), "errors": errors}


def run_front_end(ctx, args, front: str) -> list[dict]:
    with benchlib.Server(tls=args.tls, extra_args=["--http", front]) as srv:
        s = benchlib.session(srv.verify)
        s.post(srv.url + "/v1/jobs", json={"command": ["true"]}, headers=srv.client_headers(),
               timeout=30).raise_for_status()
        join = srv.tokens["join_token"]
        tokens = [benchlib.register_worker(s, srv.url, join, f"hb-{i}")["session_token"]
                  for i in range(args.workers)]
        rows = []
        for route in args.routes:
            row = {"front_end": front, **run_route(ctx, args, srv, route, tokens)}
            rows.append(row)
            print(f"  {front:8} {route:10} {row['req_per_s']:>9,.1f}/s  p50 {row['p50_ms']:.2f} ms  "
                  f"p99 {row['p99_ms']:.2f} ms  cpu {row['server_cpu']}", file=sys.stderr)
        return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--front-ends", nargs="+", default=["cheroot", "granian"], choices=["cheroot", "granian"])
    p.add_argument("--routes", nargs="+", default=list(ROUTES), choices=ROUTES)
    p.add_argument("--procs", type=int, default=2, help="load processes (default 2)")
    p.add_argument("--threads", type=int, default=6, help="keep-alive connections per process (default 6)")
    p.add_argument("--duration", type=float, default=8.0, help="seconds per route and front end (default 8)")
    p.add_argument("--workers", type=int, default=16, help="registered workers the heartbeats go round (default 16)")
    p.add_argument("--tls", action="store_true", help="serve HTTPS (certificates as `gpulayer up` makes them)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    info = benchlib.machine()
    ctx = mp.get_context("fork")
    rows = [row for front in args.front_ends for row in run_front_end(ctx, args, front)]
    base = {r["route"]: r["req_per_s"] for r in rows if r["front_end"] == "cheroot"}
    for r in rows:
        r["vs_cheroot"] = round(r["req_per_s"] / base[r["route"]], 2) if base.get(r["route"]) else None
    result = {"machine": info, "settings": {k: v for k, v in vars(args).items() if k != "json"}, "rows": rows}
    columns = ["front_end", "route", "req_per_s", "p50_ms", "p99_ms", "server_cpu", "vs_cheroot"]
    text = "\n".join([benchlib.machine_line(info),
                      f"{args.procs} processes x {args.threads} keep-alive connections, {args.duration:g} s per route, "
                      f"{'TLS' if args.tls else 'plain HTTP'}",
                      benchlib.table(rows, columns)])
    benchlib.emit(result, args.json, text)
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
