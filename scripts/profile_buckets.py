#!/usr/bin/env python3
"""Where a server's CPU goes: py-spy raw stacks summed into a few buckets.

    python scripts/bench_http.py --only cycles --transports http --finish-next --profile
    python scripts/profile_buckets.py /tmp/gpulayer-bench-profile/cycles.txt [--json]

py-spy's raw format is one line per distinct stack, `frame;frame;...;frame COUNT`, outermost
frame first, each frame `function (path:line)`. py-spy's idle filter does not catch every
blocked thread (a request thread waiting for the writer in `Event.wait`, a pool thread in
`Queue.get`, an idle pool thread in `SimpleQueue.get`, which is C: the pool's loop is the innermost
frame), so a stack whose innermost frame is a wait (WAITS) is counted as waiting and
left out of the shares. Every other stack is charged to the bucket of its innermost frame
that matches one (JSON encoding inside a resource counts as JSON; an apsw call made from
the store counts as the store's SQL, apsw being C): the share of busy samples per bucket
is the share of the process's CPU.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

# (bucket, pattern on "function (file:line)"), tried innermost frame first; first match wins.
BUCKETS = [
    ("SQL and the writer (gpulayer/server/store, apsw)", re.compile(r"gpulayer/server/store/|apsw")),
    ("JSON", re.compile(r"\bjson/|orjson")),
    ("token check (gpulayer/server/security)", re.compile(r"gpulayer/server/security/")),
    ("scheduler, Python (gpulayer/server/scheduler)", re.compile(r"gpulayer/server/scheduler/")),
    ("thread hand-offs (threading, queue)", re.compile(r"\((threading|queue)\.py")),
    ("gpulayer HTTP layer (resources, wire, middleware, server)", re.compile(r"gpulayer/server/(http|frontends)/")),
    ("falcon", re.compile(r"\bfalcon/")),
    ("cheroot (HTTP parsing, connections)", re.compile(r"\bcheroot/")),
    ("granian (WSGI bridge)", re.compile(r"\bgranian/")),
    ("socket and ssl", re.compile(r"\((socket|ssl|selectors)\.py")),
]
OTHER = "other (stdlib, logging, interpreter)"
# The one writer thread (store/db.py): its loop, and its group runner where BEGIN, SAVEPOINTs and COMMIT run.
WRITER = "Store._run (gpulayer/server/store/db.py"
WRITER_GROUP = "Store._run_group (gpulayer/server/store/db.py"
# Innermost frames that mean the thread was blocked, not running.
# An idle thread of a concurrent.futures pool waits in C (SimpleQueue.get, GIL released) under `_worker`'s
# `work_queue.get` line, which py-spy's idle filter misses: counted as waiting too.
WAITS = re.compile(r"^(Condition\.wait|Event\.wait|Queue\.get|Thread\.join|_wait_for_tstate_lock|"
                   r"\w*Selector\.select|select|sleep|poll|accept|_ThreadsafeSelector\.select) \(|"
                   # a pool thread idle in SimpleQueue.get (C, so the pool's own frame is the innermost):
                   # concurrent.futures' worker, and granian_bridge's pool
                   r"^(_worker \(\S*concurrent/futures/thread\.py|_Pool\._work \(\S*granian_bridge\.py)")


def bucket(stack: list[str]) -> str:
    for frame in reversed(stack):
        for name, pattern in BUCKETS:
            if pattern.search(frame):
                return name
    return OTHER


def summarise(path: Path) -> dict:
    counts: Counter[str] = Counter()
    writer: Counter[str] = Counter()
    total = waiting = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = stack.split(";")
        if WAITS.match(frames[-1]):
            waiting += int(n)
            continue
        counts[bucket(frames[1:] if frames and frames[0].startswith("process ") else frames)] += int(n)
        total += int(n)
        if any(f.startswith(WRITER) for f in frames):
            inner = frames[-1]
            writer["its transactions (scheduler code and SQL)" if not inner.startswith(("Store._run", "Queue"))
                   else "BEGIN, SAVEPOINT, COMMIT, its queue" ] += int(n)
    return {"file": str(path), "samples": total, "waiting_samples": waiting,
            "writer_thread": {"samples": sum(writer.values()), **writer},
            "buckets": [{"bucket": k, "samples": v, "share": round(v / total, 3) if total else 0.0}
                        for k, v in counts.most_common()]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", type=Path, help="py-spy raw (collapsed) stack files")
    p.add_argument("--json", action="store_true")
    p.add_argument("--seconds", type=float, default=0.0,
                   help="the profile's length: with --rate, the writer thread's busy fraction is printed")
    p.add_argument("--rate", type=float, default=200.0, help="py-spy's samples a second (bench_http.py: 200)")
    args = p.parse_args(argv)
    results = []
    for f in args.files:
        if not f.is_file():
            print(f"no such file: {f}", file=sys.stderr)
            return 2
        results.append(summarise(f))
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    for r in results:
        print(f"{r['file']}: {r['samples']} busy samples ({r['waiting_samples']} waiting, left out)")
        for b in r["buckets"]:
            print(f"  {100 * b['share']:5.1f}%  {b['bucket']}")
        w = r["writer_thread"]
        busy = f", busy {w['samples'] / (args.rate * args.seconds):.0%} of the time" if args.seconds else ""
        print(f"  writer thread: {w['samples']} samples ({w['samples'] / max(1, r['samples']):.0%} of the busy)"
              f"{busy}; " + ", ".join(f"{k}: {v}" for k, v in w.items() if k != "samples"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
