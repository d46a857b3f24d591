"""What writing into the page cache costs on this machine: files kept cached against dropped after their fsync.

100 files of 10 MiB (--files, --mib) are written and fsynced into a folder (--dir, default a temporary
one on the state file's disk), alternately with each file's pages kept in the cache and dropped right
after its fsync (posix_fadvise DONTNEED), --rounds times; the CPU (user + system) and wall seconds of
each pass. On a VM that gives free memory back to its host, writing into memory not touched lately
costs several times more than writing into pages just freed: why ArtifactStore.put writes behind
itself (docs/benchmarks/issue-27.md, "Checkpoint upload: the artifact store writes behind itself").

    python scripts/bench_page_cache.py --rounds 3
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import time


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def one_pass(folder: str, files: int, mib: int, drop: bool) -> tuple[float, float]:
    block = os.urandom(1 << 20)
    cpu, wall = _cpu(), time.perf_counter()
    for i in range(files):
        with open(os.path.join(folder, f"f{i}"), "wb") as out:
            for _ in range(mib):
                out.write(block)
            out.flush()
            os.fsync(out.fileno())
            if drop:
                os.posix_fadvise(out.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    cpu, wall = _cpu() - cpu, time.perf_counter() - wall
    for i in range(files):
        os.unlink(os.path.join(folder, f"f{i}"))
    return cpu, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--mib", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pause-s", type=float, default=5.0, help="between passes (freed memory goes back)")
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="bench-page-cache-", dir=args.dir)
    runs: dict[str, list] = {"kept": [], "dropped": []}
    for _ in range(args.rounds):
        for way in runs:
            runs[way].append(one_pass(folder, args.files, args.mib, way == "dropped"))
            time.sleep(args.pause_s)
    os.rmdir(folder)
    print(json.dumps({
        "gib": args.files * args.mib / 1024,
        **{f"{way}_cpu_s": statistics.median(c for c, _ in each) for way, each in runs.items()},
        **{f"{way}_wall_s": statistics.median(w for _, w in each) for way, each in runs.items()},
        "each": {way: [[round(c, 3), round(w, 3)] for c, w in each] for way, each in runs.items()},
    }, indent=2))


if __name__ == "__main__":
    main()
