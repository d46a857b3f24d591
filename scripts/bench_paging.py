"""Server memory and heartbeat latency while many clients read a big array's events (issue 22, item 3).

A real control plane (`gpulayer server start`) holds a 100,000-element array with
one event per element (as a cascade that cancels each element writes them),
seeded in-process before the server starts. A simulated worker heartbeats
back to back, timing each, through four phases of --seconds each:

  baseline   heartbeats alone
  page       --readers threads each GET the events again and again (the default page)
  walk       --readers threads each walk every page (limit 10,000), as `gpulayer job events` does
  after      heartbeats alone again, once the readers stopped

The server's resident memory is sampled every 0.1 s (the peak of each phase)
and its VmHWM (the peak since it started) is read at the end. Against a
server from before pages, `page` and `walk` both read the whole 13.7 MB list
in one answer (it has no `next`): run this script from such a tree to compare.

    python3 scripts/bench_paging.py [--elements 100000] [--readers 32] [--seconds 15] [--json]
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

PHASES = ("baseline", "page", "walk", "after")


def seed(home: Path, elements: int) -> int:
    """The array and its per-element events, written in-process on the state file (the server not started)."""
    from gpulayer.server.config import ControlPlaneConfig
    from gpulayer.server.http.app import new_deps
    from gpulayer.server.scheduler import events
    from gpulayer.server.store.queries import rows

    deps = new_deps(ControlPlaneConfig(home=home))
    try:
        job_id = deps.scheduler.submit({"command": ["true"], "array": f"0-{elements - 1}", "name": "sweep"})

        def per_element(conn, now):
            for task in rows(conn, "job_tasks", job_id=job_id):
                events.record(conn, now, "task_cancelled", job_id=job_id, task_id=task["task_id"], index=task["index"])

        deps.store.write(per_element, deps.clock())
        return job_id
    finally:
        deps.store.close()


def rss_kb(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def reader(server, job_id: int, walk: bool, stop: threading.Event, counts: list) -> None:
    """GET the job's events until `stop`: the first page, or (walk) every page following `next`."""
    s = benchlib.session(server.verify)
    s.headers.update(server.headers())
    url = f"{server.url}/v1/jobs/{job_id}/events"
    while not stop.is_set():
        params: dict = {"limit": 10_000} if walk else {}
        while not stop.is_set():
            answer = s.get(url, params=params, timeout=120)
            answer.raise_for_status()
            counts[0] += 1
            counts[1] += len(answer.content)
            following = answer.json().get("next")
            if not walk or following is None:
                break
            params["after"] = following


def phase(server, session, worker_token: str, job_id: int, name: str, readers: int, seconds: float) -> dict:
    stop = threading.Event()
    counts = [0, 0]   # requests answered, bytes read
    threads = [threading.Thread(target=reader, args=(server, job_id, name == "walk", stop, counts), daemon=True)
               for _ in range(readers if name in ("page", "walk") else 0)]
    for t in threads:
        t.start()
    beats: list[float] = []
    refused = 0
    peak = 0
    deadline = time.monotonic() + seconds
    headers = {**benchlib.PROTOCOL_HEADER, "Authorization": f"Bearer {worker_token}"}
    next_sample = 0.0
    while time.monotonic() < deadline:
        t0 = time.perf_counter()
        answer = session.post(f"{server.url}/v1/worker/heartbeat", json={"tasks": []}, headers=headers, timeout=60)
        beats.append(time.perf_counter() - t0)
        refused += answer.status_code != 200   # a heartbeat the server could not serve (503): counted, timed
        if time.monotonic() >= next_sample:
            peak = max(peak, rss_kb(server.pid))
            next_sample = time.monotonic() + 0.1
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(180)
    hb = benchlib.summary_ms(beats)
    return {"phase": name, "readers": len(threads), "requests": counts[0], "mb_read": round(counts[1] / 1e6, 1),
            "rss_peak_mb": round(peak / 1024, 1), "heartbeats": hb["n"], "hb_p50_ms": hb["p50_ms"],
            "hb_p99_ms": hb["p99_ms"], "hb_max_ms": hb["max_ms"], "hb_refused": refused}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--elements", type=int, default=100_000, help="elements of the array (one event each)")
    parser.add_argument("--readers", type=int, default=32, help="parallel event readers")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of each phase")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    result: dict = {"machine": benchlib.machine(), "elements": args.elements}
    server = benchlib.Server()
    server.init()   # the array is seeded before the server starts
    job_id = seed(server.home, args.elements)
    with server.start():
        session = benchlib.session(server.verify)
        worker = benchlib.register_worker(session, server.url, server.join_token, "bench")
        first = session.get(f"{server.url}/v1/jobs/{job_id}/events", headers=server.headers(), timeout=120)
        result["first_answer_mb"] = round(len(first.content) / 1e6, 2)
        result["rss_start_mb"] = round(rss_kb(server.pid) / 1024, 1)
        result["phases"] = [phase(server, session, worker["session_token"], job_id, name, args.readers, args.seconds)
                            for name in PHASES]
        result["vmhwm_mb"] = round(rss_kb(server.pid, "VmHWM") / 1024, 1)
    text = "\n".join([benchlib.machine_line(result["machine"]),
                      f"array of {args.elements:,} elements; GET .../events answers {result['first_answer_mb']} MB; "
                      f"server RSS at start {result['rss_start_mb']} MB, peak (VmHWM) {result['vmhwm_mb']} MB", "",
                      benchlib.table(result["phases"])])
    benchlib.emit(result, args.json, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
