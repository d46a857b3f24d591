"""What the bubblewrap sandbox costs a task (issue 24): one sitting, with and without it.

1. The raw launch: `true` as the agent starts it, bare and as `Sandbox.wrap` wraps it (env, bwrap with its
   namespaces and mounts, setpriv when root, env), N times each, interleaved; medians.
2. A `true` job through a real server and two real workers of this tree (`--sandbox bwrap`, `--sandbox none`),
   submitted one at a time, alternating: the median of submit-to-succeeded per job.

    python scripts/bench_sandbox.py [--launches 200] [--jobs 60] [--json]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import Server, emit, machine, machine_line, median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agent.sandbox import resolve  # noqa: E402


def launches(count: int) -> dict:
    """Median seconds of `true` bare and wrapped, interleaved so that load falls on both alike."""
    sandbox = resolve("bwrap", hidden=[], shown=[sys.base_prefix, sys.prefix])
    with tempfile.TemporaryDirectory() as workdir:
        wrapped = sandbox.wrap(["true"], workdir, gpu_nodes=[])
        bare_s, boxed_s = [], []
        for _ in range(count):
            for argv, into in ((["true"], bare_s), (wrapped, boxed_s)):
                start = time.perf_counter()
                subprocess.run(argv, check=True, start_new_session=True)
                into.append(time.perf_counter() - start)
    return {"bare_ms": median(bare_s) * 1000, "sandboxed_ms": median(boxed_s) * 1000}


def jobs(count: int) -> dict:
    """Median submit-to-succeeded (ms) of `true` jobs on a sandboxed and a bare worker."""
    with Server() as server:
        for mode in ("bwrap", "none"):
            server.start_worker(mode, labels={"pool": mode}, args=["--sandbox", mode])
        spans: dict[str, list[float]] = {"bwrap": [], "none": []}
        for _ in range(count):
            for mode in ("bwrap", "none"):
                start = time.perf_counter()
                job_id = server.submit({"command": ["true"], "labels": {"pool": mode}})
                assert server.wait_job(job_id, timeout=60)["state"] == "succeeded"
                spans[mode].append(time.perf_counter() - start)
        return {mode: median(spans[mode]) * 1000 for mode in spans}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=60)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    raw = launches(args.launches)
    through = jobs(args.jobs)
    result = {"machine": machine(), "launch": raw, "jobs": through}
    lines = [machine_line(result["machine"]),
             f"launch of `true` (median of {args.launches}): bare {raw['bare_ms']:.2f} ms, sandboxed "
             f"{raw['sandboxed_ms']:.2f} ms: +{raw['sandboxed_ms'] - raw['bare_ms']:.2f} ms "
             f"({raw['sandboxed_ms'] / raw['bare_ms']:.1f}x)"]
    boxed, bare = through["bwrap"], through["none"]
    lines.append(f"`true` job, submit to succeeded (median of {args.jobs}): --sandbox none {bare:.1f} ms, "
                 f"bwrap {boxed:.1f} ms: +{boxed - bare:.1f} ms ({boxed / bare:.2f}x)")
    emit(result, args.json, "\n".join(lines))


if __name__ == "__main__":
    main()
