"""Where the sandbox's launch cost goes (issue 24): each part of a sandboxed task's argv on its own, interleaved.

`true` bare, under `env` and under `setpriv`; `bwrap` with a mount namespace only, then with the PID and IPC
namespaces; bwrap with the task's whole mount list (agent/sandbox/bwrap.py, Sandbox.wrap); the whole wrapped argv.
Median, 10th percentile and minimum of N rounds (the minimum is the nearest to an idle machine's figure).

    python scripts/bench_sandbox_parts.py [N]
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agent.sandbox.bwrap import resolve  # noqa: E402


def parts(workdir: str) -> dict[str, list[str]]:
    """Each measured argv, by name."""
    sandbox = resolve("bwrap", hidden=[], shown=[sys.base_prefix, sys.prefix])
    full = sandbox.wrap(["true"], workdir, gpu_nodes=[])
    split = full.index("--")
    bwrap = sandbox.bwrap or "bwrap"
    return {
        "true": ["true"],
        "env true": ["env", "true"],
        "setpriv true": [sandbox.setpriv or "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "true"],
        "bwrap, mount namespace only": [bwrap, "--bind", "/", "/", "true"],
        "bwrap + PID namespace": [bwrap, "--bind", "/", "/", "--unshare-pid", "true"],
        "bwrap + PID and IPC namespaces": [bwrap, "--bind", "/", "/", "--unshare-pid", "--unshare-ipc", "true"],
        "bwrap, the task's mounts and namespaces": [*full[2:split + 1], "true"],
        "the whole wrap (env, bwrap, setpriv, env)": full,
    }


def main(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as workdir:
        argvs = parts(workdir)
        times: dict[str, list[float]] = {name: [] for name in argvs}
        for _ in range(rounds):
            for name, argv in argvs.items():
                start = time.perf_counter()
                subprocess.run(argv, check=True, start_new_session=True)
                times[name].append(time.perf_counter() - start)
    for name, seconds in times.items():
        seconds.sort()
        print(f"{name:45s} median {statistics.median(seconds) * 1000:6.2f} ms  "
              f"p10 {seconds[len(seconds) // 10] * 1000:6.2f}  min {seconds[0] * 1000:6.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100)
