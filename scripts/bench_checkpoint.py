"""A checkpoint's upload and restore against a disk-bound copy of the same files (issue 27 part 2).

A real control plane (granian, TLS) on this machine and the agent's own checkpoint code
(agent/artifacts/checkpoint.py: hash, HEAD, PUT, record; restore through the artifact cache) as a worker
holding a task. Figures, each a median of --runs:

- copy: `cp -r` of the folder to another folder of the same disk, every file fsynced (the bound a
  local disk sets; the server fsyncs each artifact too);
- upload: a first checkpoint of fresh random files (every byte hashed and sent), then recorded;
- second: the same folder with 1% of its files rewritten: bytes sent over the folder's bytes;
- restore: the checkpoint fetched into a new folder through an empty artifact cache.

Also the CPU seconds each side spent (`cpu_s`), and the control plane's by thread name during the
uploads (`upload_server_threads`: granian's Rust runtime, its asyncio loop, the request threads).
With `--profile DIR`: py-spy (raw stacks) of the control plane and of this process (the agent's
side) during the first upload, into DIR/server.txt and DIR/agent.txt (scripts/profile_buckets.py
sums them).

    python scripts/bench_checkpoint.py --gib 1 --files 100 --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import requests  # noqa: E402

from agent.artifacts.cache import ArtifactCache  # noqa: E402
from agent.artifacts.checkpoint import Checkpointer, DigestMemo  # noqa: E402
from agent.link.transport import Transport  # noqa: E402
from gpulayer.protocol import PROTOCOL, PROTOCOL_HEADER  # noqa: E402
from gpulayer.protocol.assignment import CheckpointRef  # noqa: E402
from gpulayer.testing import ControlPlaneProcess  # noqa: E402

from bench_forward import profile, thread_cpu, where_cpu  # noqa: E402

CHUNK = 4 << 20


def write_random(folder: Path, files: int, each: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        rewrite(folder / f"shard-{i:04d}.bin", each)


def rewrite(path: Path, size: int) -> None:
    with open(path, "wb") as out:
        left = size
        while left:
            out.write(os.urandom(min(CHUNK, left)))
            left -= min(CHUNK, left)


def copy_fsynced(src: Path, dst: Path) -> float:
    began = time.perf_counter()
    shutil.copytree(src, dst)
    for path in dst.iterdir():
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    fd = os.open(dst, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    return time.perf_counter() - began


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process `pid` so far (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def worker_session(plane: ControlPlaneProcess) -> tuple[str, int]:
    """A worker's session token and the task it holds (uploads and reads need one)."""
    verify = str(plane.ca_file) if plane.ca_file else True
    r = requests.post(f"{plane.url}/v1/workers/register", verify=verify, timeout=30,
                      headers={"Authorization": f"Bearer {plane.join_token}", PROTOCOL_HEADER: str(PROTOCOL)},
                      json={"name": "bench", "labels": {}, "version": "bench", "slots": 1,
                            "resources": {"cpus": 8, "gpus": 0, "memory_mb": 1000, "gpu_models": []}})
    r.raise_for_status()
    token = r.json()["session_token"]
    plane.submit({"command": ["sleep", "infinity"]})
    r = requests.post(f"{plane.url}/v1/worker/acquire", verify=verify, timeout=30, json={},
                      headers={"Authorization": f"Bearer {token}", PROTOCOL_HEADER: str(PROTOCOL)})
    r.raise_for_status()
    task_id = r.json()["task"]["task_id"]
    headers = {"Authorization": f"Bearer {token}", PROTOCOL_HEADER: str(PROTOCOL)}
    requests.post(f"{plane.url}/v1/worker/tasks/{task_id}/start", verify=verify, timeout=30, json={"pid": 1},
                  headers=headers).raise_for_status()

    def beat() -> None:  # the lease of the task it "runs", as the agent's heartbeats keep it
        while True:
            try:
                requests.post(f"{plane.url}/v1/worker/heartbeat", verify=verify, timeout=30, headers=headers,
                              json={"tasks": [{"task_id": task_id, "state": "running"}]})
            except requests.RequestException:
                return
            time.sleep(1)

    threading.Thread(target=beat, daemon=True).start()
    return token, task_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the folders go (default: a temporary folder)")
    parser.add_argument("--profile", type=Path, help="py-spy the control plane and the agent during the first upload into DIR")
    parser.add_argument("--profile-s", type=float, default=5.0)
    args = parser.parse_args()
    try:  # this process plays the agent, which sets it at its start (python -m agent)
        from gpulayer.proc.malloc import keep_freed_memory
    except ImportError:  # a tree from before it
        pass
    else:
        keep_freed_memory()
    each = int(args.gib * (1 << 30)) // args.files
    total = each * args.files
    load_before = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    root = Path(tempfile.mkdtemp(prefix="bench-ckpt-", dir=args.dir))
    copies, uploads, seconds, restores, second_sent = [], [], [], [], []
    cpu: dict[str, list[float]] = {"upload_server": [], "upload_agent": [], "restore_server": [], "restore_agent": []}
    server_threads: Counter = Counter()
    try:
        with ControlPlaneProcess(root / "plane", tls=True) as plane:
            token, task_id = worker_session(plane)
            transport = Transport(plane.url, verify=str(plane.ca_file))
            transport.set_token(token)
            memo = DigestMemo()
            for run in range(args.runs):
                src = root / f"src-{run}"
                write_random(src, args.files, each)
                os.sync()
                copies.append(copy_fsynced(src, root / f"copy-{run}"))
                shutil.rmtree(root / f"copy-{run}")
                keeper = Checkpointer(src, transport, None, memo, lambda _text: None)  # type: ignore[arg-type]
                server_cpu, agent_cpu = cpu_seconds(plane.proc.pid), own_cpu_seconds()
                threads_at = thread_cpu(plane.proc.pid)
                spies = []
                if args.profile and run == 0:
                    spies = profile(args.profile, {"server": plane.proc.pid, "agent": os.getpid()}, args.profile_s)
                began = time.perf_counter()
                taken = keeper.snapshot()
                assert taken is not None
                manifest, sent = taken
                answer = transport.call("POST", "/worker/checkpoint", {"task_id": task_id, "files": manifest})
                uploads.append(time.perf_counter() - began)
                cpu["upload_server"].append(cpu_seconds(plane.proc.pid) - server_cpu)
                server_threads.update(where_cpu(threads_at, thread_cpu(plane.proc.pid)))
                for spy in spies:
                    spy.wait()
                cpu["upload_agent"].append(own_cpu_seconds() - agent_cpu)
                assert sent == total, (sent, total)
                keeper.last = manifest
                changed = max(1, args.files // 100)
                for i in range(changed):
                    rewrite(src / f"shard-{i:04d}.bin", each)
                began = time.perf_counter()
                taken = keeper.snapshot()
                assert taken is not None
                transport.call("POST", "/worker/checkpoint", {"task_id": task_id, "files": taken[0]})
                seconds.append(time.perf_counter() - began)
                second_sent.append(taken[1] / total)
                cache = ArtifactCache(root / f"cache-{run}", 4 * total, transport.download_artifact)
                restored = Checkpointer(root / f"restored-{run}", transport, cache, DigestMemo(), lambda _t: None)
                server_cpu, agent_cpu = cpu_seconds(plane.proc.pid), own_cpu_seconds()
                began = time.perf_counter()
                restored.prepare(CheckpointRef(id=answer["checkpoint_id"], attempt=1, files=manifest))
                restores.append(time.perf_counter() - began)
                cpu["restore_server"].append(cpu_seconds(plane.proc.pid) - server_cpu)
                cpu["restore_agent"].append(own_cpu_seconds() - agent_cpu)
                for folder in (src, root / f"restored-{run}", root / f"cache-{run}"):
                    shutil.rmtree(folder)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    copy_s, upload_s, restore_s = (statistics.median(v) for v in (copies, uploads, restores))
    result = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]), "started": started,
        "load_before": load_before, "load_after": os.getloadavg(), "bytes": total, "files": args.files,
        "runs": args.runs,
        "copy_fsync_s": round(copy_s, 3), "copy_mb_s": round(total / copy_s / 1e6, 1),
        "upload_s": round(upload_s, 3), "upload_mb_s": round(total / upload_s / 1e6, 1),
        "upload_vs_copy": round(copy_s / upload_s, 2),
        "second_s": round(statistics.median(seconds), 3),
        "second_sent_fraction": round(statistics.median(second_sent), 4),
        "restore_s": round(restore_s, 3), "restore_mb_s": round(total / restore_s / 1e6, 1),
        "restore_vs_copy": round(copy_s / restore_s, 2),
        "cpu_s": {key: round(statistics.median(values), 2) for key, values in cpu.items()},
        "upload_server_threads": {name: round(seconds / args.runs, 2) for name, seconds in server_threads.most_common()},
        "each_run": {"copy": [round(v, 3) for v in copies], "upload": [round(v, 3) for v in uploads],
                     "restore": [round(v, 3) for v in restores],
                     **{f"cpu_{key}": [round(v, 2) for v in values] for key, values in cpu.items()}},
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
