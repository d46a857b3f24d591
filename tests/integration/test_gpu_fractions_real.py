"""Fractions of a GPU on a real GPU with MPS (issue 40; marked `gpu`: skipped where no NVIDIA driver answers or
nvidia-cuda-mps-control is not installed). A real control plane and a real worker started with
`--gpu-sharing mps`: two jobs of `--gpu-fraction 0.5 --gpu-memory 2G` run at once on one GPU, each in its own CUDA
context through the worker's MPS daemon, each given its thread percentage and memory limit: 256 MiB allocates,
its limit and 1 GiB more does not. docs/workers.md ("Sharing a GPU") records where this last ran."""
from __future__ import annotations

import json
import shutil
import sys

import pytest

from integration_cluster import Cluster


def _ready() -> bool:
    from agent.gpu.nvml import Nvml
    nvml = Nvml.open()
    if nvml is None:
        return False
    nvml.close()
    return shutil.which("nvidia-cuda-mps-control") is not None


pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not _ready(), reason="no NVIDIA driver or no nvidia-cuda-mps-control here")]

# Through the CUDA driver API with ctypes (no Python package): a context, its memory as CUDA reports it, a
# small and a too-large allocation, then wait for the other task (both contexts alive at once).
PROBE = r"""
import ctypes, os, pathlib, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
print("INIT", cuda.cuInit(0))
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
cuda.cuDeviceGet(ctypes.byref(dev), 0)
print("CTX", cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev))
free, total = ctypes.c_size_t(), ctypes.c_size_t()
cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
print("MEMINFO free_mib", free.value >> 20, "total_mib", total.value >> 20)
limit = int(os.environ["GPULAYER_GPU_MEMORY_LIMIT_MB"])
small, big = ctypes.c_void_p(), ctypes.c_void_p()
print("SMALL", cuda.cuMemAlloc_v2(ctypes.byref(small), 256 << 20))
print("BIG", cuda.cuMemAlloc_v2(ctypes.byref(big), (limit + 1024) << 20))
meeting = pathlib.Path(sys.argv[1])
(meeting / os.environ["GPULAYER_JOB_ID"]).touch()
deadline = time.time() + 90
while len(list(meeting.iterdir())) < 2 and time.time() < deadline:
    time.sleep(0.1)
print("TOGETHER", len(list(meeting.iterdir())))
print("PCT", os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "LIMIT", os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"))
time.sleep(1)  # the other sees this one's file while this context lives
"""


def test_two_fractional_tasks_share_one_gpu_with_mps(tmp_path):
    meeting = tmp_path / "meeting"
    meeting.mkdir()
    with Cluster(tmp_path).start_server() as cluster:
        cluster.start_worker("mps", gpus=None, parallel=2, args=["--gpu-sharing", "mps", "--sandbox", "none"])
        listed = cluster.online_worker("mps")
        assert listed["resources"]["gpu_sharing"] == "mps", listed
        jobs = [cluster.submit({"command": [sys.executable, "-c", PROBE, str(meeting)], "gpu_fraction": 0.5,
                                "gpu_memory_mb": 2048}) for _ in range(2)]
        texts = []
        for job_id in jobs:
            done = cluster.wait_job(job_id, timeout=180)
            texts.append(cluster.log_text(job_id))
            assert done["state"] == "succeeded", texts[-1]
        gpus = {json.loads(r[0])[0] for r in cluster.sql("SELECT gpu_indices FROM tasks WHERE gpu_share > 0")}
        assert len(gpus) == 1  # one GPU, shared
        for text in texts:
            print(text)  # recorded in docs/workers.md when run on hardware
            assert "CTX 0" in text and "SMALL 0" in text and "TOGETHER 2" in text, text
            assert "BIG 0" not in text, text  # over its memory limit: CUDA_ERROR_OUT_OF_MEMORY
            assert "PCT 50 LIMIT 0=2048M" in text, text
