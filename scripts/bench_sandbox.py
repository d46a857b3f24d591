"""What the bubblewrap sandbox costs a task (issue 24): one sitting, with and without it.

1. The raw launch: `true` as the agent starts it, bare and as `Sandbox.wrap` wraps it (env, bwrap with its
   namespaces and mounts, setpriv when root, env), N times each, interleaved; medians. Under a root agent with
   nsenter, also as an array element enters its job's shared sandbox (agent/sandbox/shared.py: nsenter, setpriv, env into
   one holder started once).
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
from agent.sandbox.bwrap import resolve  # noqa: E402
from agent.sandbox.shared import SharedSandboxes  # noqa: E402


def launches(count: int) -> dict:
    """Median seconds of `true` bare, wrapped and entered, interleaved so that load falls on all alike."""
    sandbox = resolve("bwrap", hidden=[], shown=[sys.base_prefix, sys.prefix])
    with tempfile.TemporaryDirectory() as tasks:
        workdir = Path(tasks) / "plain"
        workdir.mkdir()
        wrapped = sandbox.wrap(["true"], str(workdir), gpu_nodes=[])
        shared = SharedSandboxes(sandbox, Path(tasks), None) if sandbox.shares(False) else None
        runs: list[tuple[list[str], list[float]]] = [(["true"], []), (wrapped, [])]
        if shared is not None:
            holder = shared.hold(1, True)
            element = holder.job_dir / "1-1"
            element.mkdir()
            sandbox.give(element)
            runs.append((sandbox.enter_argv(shared.started(holder), ["true"], str(element), network=True), []))
        try:
            for _ in range(count):
                for argv, into in runs:
                    start = time.perf_counter()
                    subprocess.run(argv, check=True, start_new_session=True)
                    into.append(time.perf_counter() - start)
        finally:
            if shared is not None:
                shared.close()
    result = {"bare_ms": median(runs[0][1]) * 1000, "sandboxed_ms": median(runs[1][1]) * 1000}
    if shared is not None:
        result["shared_ms"] = median(runs[2][1]) * 1000
    return result


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
    through = jobs(args.jobs) if args.jobs else {"bwrap": float("nan"), "none": float("nan")}
    result = {"machine": machine(), "launch": raw, "jobs": through}
    lines = [machine_line(result["machine"]),
             f"launch of `true` (median of {args.launches}): bare {raw['bare_ms']:.2f} ms, sandboxed "
             f"{raw['sandboxed_ms']:.2f} ms: +{raw['sandboxed_ms'] - raw['bare_ms']:.2f} ms "
             f"({raw['sandboxed_ms'] / raw['bare_ms']:.1f}x)"]
    if "shared_ms" in raw:
        lines.append(f"launch of `true` into a job's shared sandbox (array elements): {raw['shared_ms']:.2f} ms: "
                     f"+{raw['shared_ms'] - raw['bare_ms']:.2f} ms ({raw['shared_ms'] / raw['bare_ms']:.1f}x)")
    boxed, bare = through["bwrap"], through["none"]
    lines.append(f"`true` job, submit to succeeded (median of {args.jobs}): --sandbox none {bare:.1f} ms, "
                 f"bwrap {boxed:.1f} ms: +{boxed - bare:.1f} ms ({boxed / bare:.2f}x)")
    emit(result, args.json, "\n".join(lines))


if __name__ == "__main__":
    main()
