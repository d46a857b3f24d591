#!/usr/bin/env python3
"""GPUlayer against HyperQueue and `xargs -P2` on many short identical tasks (issue 25, item 3).

In one sitting, interleaved (the order turns each round), --rounds times:

1. xargs:      `xargs -P2 -n1 true` on --tasks lines;
2. HyperQueue: a local cluster (`hyperqueue.LocalCluster`, one worker of 2 cores) started once;
               each round one job of --tasks `true` programs (no stdout/stderr files), submitted
               and waited for through its Python API;
3. GPUlayer:   a real `gpulayer server start` (TLS, the default front end and settings) and one
               `gpulayer worker start --parallel 2` (the default sandbox), started once; each round
               `gpulayer submit --array 0-(N-1) --wait -- true`, the CLI's start-up included.

    pip install hyperqueue    # its wheel holds the server and worker in a library (no `hq` command)
    python scripts/bench_vs_hyperqueue.py [--tasks 2000] [--rounds 3] [--skip hyperqueue] [--unsandboxed] [--json]
                                          [--baseline-tree DIR]

`--baseline-tree DIR` adds a fourth runner, `gpulayer-baseline`: a control plane, worker and CLI of
another source tree (say `git archive main | tar -x -C DIR`), the same set-up, in the same rounds:
before and after in one sitting.

Medians of the rounds, and GPUlayer's ratio to each. Without the hyperqueue package (or with
`--skip hyperqueue`) the HyperQueue column is left out and said why.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import benchlib  # noqa: E402


def xargs_round(tasks: int) -> float:
    t0 = time.perf_counter()
    subprocess.run(["xargs", "-P2", "-n1", "true"], input="\n".join(["x"] * tasks), text=True, check=True)
    return time.perf_counter() - t0


class HyperQueue:
    """A HyperQueue local cluster with one 2-core worker, for the rounds."""

    def __init__(self, cores: int):
        from hyperqueue import LocalCluster
        from hyperqueue.cluster import WorkerConfig
        self._dir = tempfile.TemporaryDirectory(prefix="bench-hq-")
        saved = os.dup(1)  # the cluster prints its table on fd 1: to stderr, so that --json stays JSON
        os.dup2(2, 1)
        try:
            self.cluster = LocalCluster(self._dir.name, WorkerConfig(cores=cores))  # takes a str, not a Path
            self.client = self.cluster.client()
        finally:
            os.dup2(saved, 1)
            os.close(saved)

    def round(self, tasks: int) -> float:
        from hyperqueue import Job
        t0 = time.perf_counter()
        job = Job()
        for _ in range(tasks):
            job.program(["true"], stdout=None, stderr=None)
        submitted = self.client.submit(job)
        # wait_for_jobs without its tqdm progress bar: the client's own wait, with a callback that draws nothing
        failed = self.client.connection.wait_for_jobs((submitted.id,), lambda _jobs: None)
        elapsed = time.perf_counter() - t0
        if failed:
            raise RuntimeError(f"HyperQueue job {submitted.id} failed")
        return elapsed

    def close(self) -> None:
        self.cluster.stop()
        self._dir.cleanup()


class GpuLayer:
    """A real control plane (TLS, defaults) and one worker --parallel 2 with the default sandbox."""

    def __init__(self, parallel: int, worker_args: list[str] | None = None, tree: str | None = None):
        #: Another source tree's server, worker and CLI (PYTHONPATH), for a same-run baseline.
        self.env = {"PYTHONPATH": str(Path(tree).resolve())} if tree else {}
        self.srv = benchlib.ControlPlaneProcess(tls=True, env=self.env).start()
        self.worker = self.srv.start_worker("bench", parallel=parallel, args=worker_args or [], env=self.env)
        listed = self.srv.online_worker("bench") or {}
        self.isolation = (listed.get("inventory") or {}).get("isolation") or listed.get("isolation")

    def round(self, tasks: int) -> float:
        t0 = time.perf_counter()
        done = self.srv.cli("submit", "--array", f"0-{tasks - 1}", "--wait", "--", "true", timeout=600, **self.env)
        elapsed = time.perf_counter() - t0
        if done.returncode != 0:
            raise RuntimeError(f"gpulayer submit --wait exited {done.returncode}: {done.stderr[-2000:]}")
        return elapsed

    def close(self) -> None:
        self.srv.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=2, help="slots of GPUlayer's worker, cores of HyperQueue's")
    parser.add_argument("--skip", default="", help="comma-separated: xargs, hyperqueue, gpulayer")
    parser.add_argument("--unsandboxed", action="store_true",
                        help="also GPUlayer with a worker --sandbox none (a control plane of its own): the sandbox's share")
    parser.add_argument("--baseline-tree", metavar="DIR",
                        help="also GPUlayer from this source tree (its own control plane): before and after, same run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    info = benchlib.machine()
    runners: dict = {}
    notes: list[str] = []
    if "xargs" not in skip:
        runners["xargs"] = xargs_round
    hq = gl = bare = base = None
    if "hyperqueue" not in skip:
        try:
            hq = HyperQueue(args.parallel)
            runners["hyperqueue"] = hq.round
        except Exception as exc:  # not installed, or its cluster did not start here
            notes.append(f"HyperQueue left out: {type(exc).__name__}: {exc}")
    if "gpulayer" not in skip:
        gl = GpuLayer(args.parallel)
        runners["gpulayer"] = gl.round
        if args.unsandboxed:
            bare = GpuLayer(args.parallel, ["--sandbox", "none"])
            runners["gpulayer-sandbox-none"] = bare.round
        if args.baseline_tree:
            base = GpuLayer(args.parallel, tree=args.baseline_tree)
            runners["gpulayer-baseline"] = base.round
    times: dict[str, list[float]] = {name: [] for name in runners}
    try:
        names = list(runners)
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                times[name].append(runners[name](args.tasks))
                print(f"round {r + 1}: {name} {times[name][-1]:.2f} s", file=sys.stderr)
    finally:
        if hq is not None:
            hq.close()
        for plane in (gl, bare, base):
            if plane is not None:
                plane.close()
    medians = {name: benchlib.median(values) for name, values in times.items()}
    result: dict = {"tasks": args.tasks, "rounds": args.rounds, "parallel": args.parallel, "machine": info,
                    "seconds": {name: [round(v, 3) for v in values] for name, values in times.items()},
                    "median_s": {name: round(v, 3) for name, v in medians.items()}, "notes": notes}
    if gl is not None:
        result["gpulayer_isolation"] = gl.isolation
    if "gpulayer" in medians:
        result["ratios"] = {f"gpulayer/{name}": round(medians["gpulayer"] / v, 2)
                            for name, v in medians.items() if name != "gpulayer" and v > 0}
    rows = [{"runner": name, "median_s": round(medians[name], 2),
             "rounds_s": ", ".join(f"{v:.2f}" for v in times[name])} for name in medians]
    text = "\n".join([benchlib.machine_line(info), f"{args.tasks} x true, {args.rounds} rounds, interleaved",
                      benchlib.table(rows), *(f"{k}: {v}x" for k, v in result.get("ratios", {}).items()), *notes])
    benchlib.emit(result, args.json, text)


if __name__ == "__main__":
    main()
