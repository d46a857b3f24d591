"""GPU telemetry end to end (issue 28 part 4): a real server, a real worker process whose GPUs are the fake
pynvml of tests/agent/fake_nvml (first on its PYTHONPATH, driven by a JSON file), real task processes and the
CLI: what the fake reports reaches `gpulayer job status` (Slurm's sstat) and the gpu_samples table."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import gpulayer
from gpulayer.testing import wait_for

from integration_cluster import Cluster

FAKE_DIR = Path(__file__).resolve().parents[1] / "agent" / "fake_nvml"
SOURCE_ROOT = Path(gpulayer.__file__).resolve().parents[1]
HOLD = ["sh", "-c", "sleep 60"]


def gpu(n: int, utilization: int, used: int) -> dict:
    return {
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": f"GPU-{n}",
        "mig_supported": True,
        "mig": None,
        "ecc_uncorrected": 0,
        "remap_failed": False,
        "utilization": utilization,
        "memory_used_mb": used,
        "memory_total_mb": 81559,
    }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-telemetry")
    c = Cluster(root).start_server()
    path = root / "nvml.json"
    path.write_text(json.dumps({"gpus": [gpu(0, 87, 30512), gpu(1, 3, 10)], "xids": []}))
    try:
        c.start_worker("g", gpus=None, parallel=2, env={"PYTHONPATH": f"{FAKE_DIR}:{SOURCE_ROOT}", "FAKE_NVML_STATE": str(path)})
        yield c
    finally:
        c.close()


def test_job_status_shows_a_running_tasks_gpu_use(cluster):
    job_id = cluster.submit({"command": HOLD, "gpus": 1})
    task = wait_for(lambda: next((t for t in cluster.current_tasks(job_id) if t["state"] == "running"), None), 60, "the task running")
    index = json.loads(cluster.sql("SELECT gpu_indices FROM tasks WHERE id = ?", (task["task_id"],))[0][0])[0]
    busy, used = (87, 30512) if index == 0 else (3, 10)

    def shown():
        rc, out, err = cluster.cli("job", "status", str(job_id))
        assert rc == 0, err
        return out if re.search(rf"gpu {index} GPU-{index}: {busy}% busy, {used}/81559 MiB \(\d+ s ago\)", out) else None

    out = wait_for(shown, 60, "job status with the GPU's use", details=lambda: cluster.logs())
    assert f"task {task['task_id']} " in out
    rc, out, err = cluster.cli("job", "status", str(job_id), "--json")
    assert rc == 0, err
    (usage,) = json.loads(out)["gpu_usage"]
    assert usage["task_id"] == task["task_id"] and usage["worker_name"] == "g"
    (seen,) = usage["gpus"]
    assert (seen["index"], seen["uuid"], seen["utilization_pct"], seen["memory_used_mb"]) == (index, f"GPU-{index}", float(busy), used)
    # The table the explorer charts: a row per GPU per heartbeat interval, both GPUs.
    rows = cluster.sql("SELECT DISTINCT gpu_index, utilization_pct, memory_used_mb, memory_total_mb FROM gpu_samples ORDER BY gpu_index")
    assert [tuple(r) for r in rows] == [(0, 87.0, 30512, 81559), (1, 3.0, 10, 81559)]
    cluster.cli("job", "cancel", str(job_id))
    ended = cluster.wait_job(job_id)
    # The job reads cancelled at once; its task stays running until its worker has stopped it.
    wait_for(lambda: not any(t["state"] == "running" for t in cluster.current_tasks(job_id)), 60, "the task stopped")
    rc, out, _ = cluster.cli("job", "status", str(job_id))
    assert ended["state"] == "cancelled" and " busy," not in out  # only running tasks show their GPUs
