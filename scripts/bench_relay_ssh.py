"""SSH through the relay: connection set-up and bulk throughput, against `gpulayer exec` in the same run.

    python scripts/bench_relay_ssh.py [--mib 64] [--runs 3] [--image]

A control plane on granian with TLS and one worker (the default sandbox) on loopback, a `sleep` job; then,
interleaved, `runs` times each: `ssh gpulayer-JOB true` with the block `gpulayer ssh-config` prints (the
whole connection: ssh-proxy's start, the relay stream, the task's SSH server's start, the handshake),
`gpulayer exec JOB -- true` (the CLI's), and MIB MiB piped into `ssh gpulayer-JOB 'cat > /dev/null'`
against the same into `gpulayer exec JOB -- sh -c 'cat > /dev/null'`. Prints medians and the load average.
With `--image`, a second `sleep` job from a static busybox image (tests/ociimages.py, umoci) and the same ssh
pair against it, in the same rounds: what joining an image task from outside costs (agent/relay/ssh_server.py).
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
    parser.add_argument("--image", action="store_true", help="also ssh into an image job's task")
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
        image_ssh = _image_job(plane, config) if args.image else None
        timed([*ssh, "true"], env)  # the link up, caches warm
        results: dict[str, list[float]] = {"ssh true": [], "exec true": [], "ssh cat": [], "exec cat": []}
        for _ in range(args.runs):
            results["ssh true"].append(timed([*ssh, "true"], env))
            results["exec true"].append(timed([*execute, "true"], env))
            results["ssh cat"].append(timed([*ssh, "cat > /dev/null"], env, blob))
            results["exec cat"].append(timed([*execute, "sh", "-c", "cat > /dev/null"], env, blob))
            if image_ssh is not None:
                results.setdefault("image ssh true", []).append(timed([*image_ssh, "true"], env))
                results.setdefault("image ssh cat", []).append(timed([*image_ssh, "cat > /dev/null"], env, blob))
    for name, values in results.items():
        median = statistics.median(values)
        rate = f", {args.mib / median:.1f} MiB/s" if "cat" in name else ""
        print(f"{name}: median {median:.2f} s of {[round(v, 2) for v in values]}{rate}")
    print(f"load {os.getloadavg()[0]:.1f} after")


def _image_job(plane: ControlPlaneProcess, config: Path) -> list[str]:
    """A `sleep` job from a busybox image; the ssh argv into its task (after one connection, to warm up)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from ociimages import archive, build_layout

    root = Path(tempfile.mkdtemp())
    image = archive(build_layout(root), root / "busybox.tar")
    done = plane.cli("submit", "--image", str(image), "--", "sleep", "3600", timeout=120)
    assert done.returncode == 0, done.stderr
    job = int(done.stdout.split()[0])
    wait_for(lambda: plane.job(job)["state"] == "running", 60, "the image job to run")
    argv = ["ssh", "-F", str(config), f"gpulayer-{job}"]
    timed([*argv, "true"], clean_env(**plane.cli_env()))
    return argv


if __name__ == "__main__":
    main()
