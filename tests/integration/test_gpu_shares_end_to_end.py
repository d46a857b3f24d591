"""Fractions of a GPU end to end (issue 40, point 1): a real control plane, a real worker process with four
fake GPUs (tests/agent/fake_nvml, 81559 MiB each) sharing them with MPS (a stand-in nvidia-cuda-mps-control,
tests/agent/fake_mps, first on its PATH), real task processes and the CLI. 16 jobs of `--gpu-fraction 0.25`
all run at once on exactly 4 GPUs, each with its MPS variables; the daemon is started once per GPU; `worker
list` and `job status` show the shares."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import gpulayer
from gpulayer.testing import wait_for

from integration_cluster import Cluster

pytestmark = pytest.mark.slow

FAKE_NVML = Path(__file__).resolve().parents[1] / "agent" / "fake_nvml"
FAKE_MPS = Path(__file__).resolve().parents[1] / "agent" / "fake_mps"
SOURCE_ROOT = Path(gpulayer.__file__).resolve().parents[1]


def gpu(n: int) -> dict:
    return {"name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{n}", "mig_supported": True, "mig": None,
            "ecc_uncorrected": 0, "remap_failed": False, "utilization": 10, "memory_used_mb": 10,
            "memory_total_mb": 81559}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-fractions")
    c = Cluster(root).start_server()
    state = root / "nvml.json"
    state.write_text(json.dumps({"gpus": [gpu(i) for i in range(4)], "xids": []}))
    try:
        c.start_worker("shared", gpus=None, parallel=17, args=["--gpu-sharing", "mps", "--sandbox", "none"],
                       env={"PYTHONPATH": f"{FAKE_NVML}:{SOURCE_ROOT}", "FAKE_NVML_STATE": str(state),
                            "PATH": f"{FAKE_MPS}:{os.environ['PATH']}", "FAKE_MPS_LOG": str(root / "mps.log")})
        c.mps_log = root / "mps.log"
        yield c
    finally:
        c.close()


def test_sixteen_quarters_run_at_once_on_four_gpus_with_their_mps_variables(cluster, tmp_path):
    release = tmp_path / "release"
    script = ("echo PCT=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE LIMIT=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT "
              "PIPE=$CUDA_MPS_PIPE_DIRECTORY CVD=$CUDA_VISIBLE_DEVICES; "
              f"while [ ! -e {release} ]; do sleep 0.1; done")
    rc, out, err = cluster.cli("submit", "--gpu-fraction", "0.25", "--", "sh", "-c", script)
    assert rc == 0, err
    jobs = [int(out.split()[0])] + [cluster.submit({"command": ["sh", "-c", script], "gpu_fraction": 0.25})
                                    for _ in range(15)]

    def running():
        found = cluster.sql("SELECT gpu_indices FROM tasks WHERE state = 'running' AND gpu_share = 0.25")
        return found if len(found) == 16 else None

    held = wait_for(running, 60, "16 shares running at once")
    assert sorted(json.loads(r[0])[0] for r in held) == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    rc, out, err = cluster.cli("worker", "list")
    assert rc == 0 and "0/4 mps (4 on 4)" in out, out + err
    rc, out, err = cluster.cli("job", "status", str(jobs[0]))
    assert rc == 0 and "share=0.25" in out, out + err
    release.write_text("")
    for job_id in jobs:
        assert cluster.wait_job(job_id, timeout=60)["state"] == "succeeded"
    text = cluster.log_text(jobs[0])
    assert "PCT=25 LIMIT=0=20389M PIPE=/var/tmp/gpulayer-mps-" in text, text
    started = [line for line in cluster.mps_log.read_text().splitlines() if line.startswith("-d")]
    assert sorted(line.split()[1] for line in started) == ["gpu=0", "gpu=1", "gpu=2", "gpu=3"]


def test_a_memory_share_over_every_gpu_waits_saying_so(cluster):
    rc, out, err = cluster.cli("submit", "--gpu-memory", "100G", "--", "true")
    assert rc == 0, err
    job_id = int(out.split()[0])
    rc, out, err = cluster.cli("job", "status", str(job_id))
    assert "a share of one GPU (102400 MB" in out, out + err
    assert cluster.cli("job", "cancel", str(job_id))[0] == 0


# A task that says, through the fake NVML's state, that it uses 30000 MiB of its GPU, then waits.
OVER_SHARE = """
import json, os, sys, time
path = os.environ["FAKE_NVML_STATE"]
state = json.load(open(path))
gpu = int(os.environ["CUDA_VISIBLE_DEVICES"])
state["gpus"][gpu]["processes"] = [{"pid": os.getpid(), "used_mb": 30000}]
with open(path + ".new", "w") as out:
    json.dump(state, out)
os.replace(path + ".new", path)
print("LIMIT", os.environ.get("GPULAYER_GPU_MEMORY_LIMIT_MB"), flush=True)
time.sleep(60)
"""


def test_time_slicing_stops_a_task_over_its_memory_share(cluster, tmp_path):
    state = tmp_path / "nvml.json"
    state.write_text(json.dumps({"gpus": [gpu(0)], "xids": []}))
    cluster.start_worker("sliced", gpus=None, args=["--gpu-sharing", "time-slice", "--sandbox", "none",
                                                    "--label", "slice=yes"],
                         env={"PYTHONPATH": f"{FAKE_NVML}:{SOURCE_ROOT}", "FAKE_NVML_STATE": str(state)})
    job_id = cluster.submit({"command": ["python3", "-c", OVER_SHARE], "gpu_fraction": 0.25,
                             "labels": {"slice": "yes"}})
    done = cluster.wait_job(job_id, timeout=60)
    assert done["state"] == "failed", (done, cluster.workers["sliced"].log()[-3000:])
    assert "GPU memory share exceeded: its processes use 30000 MiB of GPU 0, its share is 20389 MiB" in \
        (done["tasks"][0].get("reason") or ""), done
    assert "LIMIT 20389" in cluster.log_text(job_id)
