#!/usr/bin/env python3
"""Big cancels and cascades (issue 22 item 2): the longest writer hold, and heartbeat latency, meanwhile.

In-process on a state file: --arrays arrays of --size elements wait (`after`) on one job; a thread
sends a worker's heartbeat every 50 ms; then the one job is cancelled, which cancels every array
(dependency_failed). Two ways, interleaved, --repeat times each, on fresh state files:

- one write (the baseline: how it ran before issue 22, and how a direct `store.write(jobs.cancel)`
  with no cascade driver still runs it): the whole cascade in one transaction;
- steps: `Scheduler.cancel`, the cascade in bounded writes (scheduler/cascades.py), until done.

For each: the longest writer hold (one group's BEGIN to COMMIT) and the 99th percentile of the holds,
how many writes, heartbeat latency p50/p99/max while it ran, how long until every array had ended,
and the events in the state file per 1,000 elements (both ways now write one `elements_cancelled`
per batch of elements; before issue 22 the one write also wrote an event per element).

    python scripts/bench_cascades.py [--arrays 4] [--size 25000] [--repeat 3] [--json]

Medians over the repeats.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
import benchlib  # noqa: E402

from gpulayer.server.config import ControlPlaneConfig  # noqa: E402
from gpulayer.server.errors import GpulayerError  # noqa: E402
from gpulayer.server.http import wire  # noqa: E402
from gpulayer.server.scheduler import jobs  # noqa: E402
from gpulayer.server.scheduler.core import Scheduler  # noqa: E402
from gpulayer.server.security.auth import Principal, init_home  # noqa: E402
from gpulayer.server.store import db  # noqa: E402

NOWHERE = {"labels": {"pool": "nowhere"}}
HOLDS: list[float] = []
_run_group = db.Store._run_group


def _timed_group(self, group) -> None:
    began = time.perf_counter()
    try:
        _run_group(self, group)
    finally:
        HOLDS.append(time.perf_counter() - began)


def one_run(root_dir: Path, arrays: int, size: int, stepped: bool) -> dict:
    home = root_dir / f"home-{time.monotonic_ns()}"
    init_home(home)
    config = ControlPlaneConfig(home=home)
    store = db.Store(config.layout.state)
    sched = Scheduler(store, config)
    try:
        body = wire.register({"name": "w", "labels": {}, "resources": {"cpus": 8}, "slots": 1})
        worker = sched.register(body=body, token=Principal(kind="join", jti="server-join"), session_hash="w",
                                peer_address="127.0.0.1")["worker_id"]
        root = sched.submit({"command": ["true"], **NOWHERE})
        for _ in range(arrays):
            sched.submit({"command": ["true"], "array": f"0-{size - 1}", "after": [root]})
        beats: list[float] = []
        failed = []
        stop = threading.Event()

        def heartbeats():
            while not stop.wait(0.05):
                began = time.perf_counter()
                try:
                    sched.heartbeat(worker, [])
                except GpulayerError:  # 503: the writer did not take it within 30 s
                    failed.append(1)
                beats.append(time.perf_counter() - began)

        beating = threading.Thread(target=heartbeats, daemon=True)
        beating.start()
        time.sleep(0.3)
        HOLDS.clear()
        began = time.perf_counter()
        if stepped:
            sched.cancel(root)
            sched.cascades.join(3600)
        else:
            store.write(jobs.cancel, root, time.time())
        took = time.perf_counter() - began
        time.sleep(0.2)
        stop.set()
        beating.join()
        counts = store.read(lambda conn: conn.execute(
            "SELECT (SELECT count(*) FROM jobs WHERE finished_at IS NULL) AS active,"
            " (SELECT count(*) FROM events) AS events").fetchall()[0])
        assert counts["active"] == 0, counts
        return {"longest_hold_ms": max(HOLDS) * 1e3, "hold_p99_ms": benchlib.percentile(HOLDS, 99) * 1e3,
                "writes": len(HOLDS), "heartbeat_p50_ms": benchlib.percentile(beats, 50) * 1e3,
                "heartbeat_p99_ms": benchlib.percentile(beats, 99) * 1e3, "heartbeat_max_ms": max(beats) * 1e3,
                "heartbeats_503": len(failed), "cascade_s": took, "events_per_1000_elements": counts["events"] / (arrays * size) * 1000}
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arrays", type=int, default=4)
    parser.add_argument("--size", type=int, default=25_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    db.Store._run_group = _timed_group  # type: ignore[method-assign]
    runs: dict[str, list[dict]] = {"one write": [], "steps": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeat):
            for name, stepped in (("one write", False), ("steps", True)):
                runs[name].append(one_run(Path(tmp), args.arrays, args.size, stepped))
    rows = [{"how": name, **{k: round(benchlib.median([r[k] for r in found]), 2) for k in found[0]}}
            for name, found in runs.items()]
    result = {"machine": benchlib.machine(), "settings": {k: v for k, v in vars(args).items() if k != "json"},
              "medians": rows}
    text = "\n".join([benchlib.machine_line(), f"{args.arrays} arrays of {args.size} elements after one job, "
                      f"that job cancelled; medians of {args.repeat}", benchlib.table(rows)])
    benchlib.emit(result, args.json, text)


if __name__ == "__main__":
    main()
