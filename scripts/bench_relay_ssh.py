"""SSH through the relay: connection set-up and bulk throughput, against `gpulayer exec` in the same run.

    python scripts/bench_relay_ssh.py [--mib 64] [--runs 3]

A control plane on granian with TLS and one worker (the default sandbox) on loopback, a `sleep` job; then,
interleaved, `runs` times each: `ssh gpulayer-JOB true` with the block `gpulayer ssh-config` prints (the
whole connection: ssh-proxy's start, the relay stream, the task's SSH server's start, the handshake),
`gpulayer exec JOB -- true` (the CLI's), and MIB MiB piped into `ssh gpulayer-JOB 'cat > /dev/null'`
against the same into `gpulayer exec JOB -- sh -c 'cat > /dev/null'`. Prints medians and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpulayer.testing import CLI, ControlPlaneProcess, clean_env, wait_for  # noqa: E402


def timed(argv: list[str], env: dict, data: bytes | None = None) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, input=data, capture_output=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed ({done.returncode}): {done.stderr.decode()[-500:]}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()[0]:.1f}")
    blob = os.urandom(args.mib * 1024 * 1024)
    with ControlPlaneProcess(Path(tempfile.mkdtemp()), tls=True, heartbeat_interval=0.5, lease_ttl=10) as plane:
        plane.start_worker("w1", parallel=2)
        job = plane.submit({"command": ["sleep", "3600"]})
        wait_for(lambda: plane.job(job)["state"] == "running", 60, "the job to run")
        rc, out, err = plane.cli("ssh-config")
        assert rc == 0, err
        config = plane.root / "ssh_config"
        config.write_text(out + "    BatchMode yes\n")
        env = clean_env(**plane.cli_env())
        ssh = ["ssh", "-F", str(config), f"gpulayer-{job}"]
        execute = [*CLI, "exec", str(job), "--"]
        timed([*ssh, "true"], env)  # the link up, caches warm
        results: dict[str, list[float]] = {"ssh true": [], "exec true": [], "ssh cat": [], "exec cat": []}
        for _ in range(args.runs):
            results["ssh true"].append(timed([*ssh, "true"], env))
            results["exec true"].append(timed([*execute, "true"], env))
            results["ssh cat"].append(timed([*ssh, "cat > /dev/null"], env, blob))
            results["exec cat"].append(timed([*execute, "sh", "-c", "cat > /dev/null"], env, blob))
    for name, values in results.items():
        median = statistics.median(values)
        rate = f", {args.mib / median:.1f} MiB/s" if "cat" in name else ""
        print(f"{name}: median {median:.2f} s of {[round(v, 2) for v in values]}{rate}")
    print(f"load {os.getloadavg()[0]:.1f} after")


if __name__ == "__main__":
    main()
