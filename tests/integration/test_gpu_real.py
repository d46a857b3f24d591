"""Real NVML on real GPUs (marked `gpu`; skipped where no NVIDIA driver answers).

A real control plane and a real worker whose inventory comes from NVML: its
devices and UUIDs are what `nvidia-smi -L` lists, a task sees exactly the
device CUDA_VISIBLE_DEVICES names, every GPU reads healthy, and MIG is
reported as the hardware says. docs/workers.md ("Broken GPUs") records where
these last ran.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest


def _driver_answers() -> bool:
    from agent.gpu.nvml import Nvml
    nvml = Nvml.open()
    if nvml is None:
        return False
    nvml.close()
    return shutil.which("nvidia-smi") is not None


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _driver_answers(),
                                 reason="no NVIDIA driver here (nvmlInit failed or no nvidia-smi): not run on hardware")]


def smi_devices() -> list[tuple[str, str]]:
    """(name or MIG profile, UUID) per schedulable device, as `nvidia-smi -L` lists them."""
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
    gpus: list[list] = []
    for line in out.splitlines():
        gpu = re.match(r"GPU \d+: (.+) \(UUID: (GPU-[^)]+)\)", line.strip())
        mig = re.match(r"MIG (\S+)\s+Device\s+\d+: \(UUID: (MIG-[^)]+)\)", line.strip())
        if gpu:
            gpus.append([(gpu.group(1), gpu.group(2))])
        elif mig and gpus:
            if not gpus[-1][0][1].startswith("MIG-"):
                gpus[-1] = []  # a MIG-enabled GPU is scheduled as its instances
            gpus[-1].append((mig.group(1), mig.group(2)))
    return [device for devices in gpus for device in devices]


def test_inventory_matches_nvidia_smi():
    from agent.gpu.inventory import nvml_probe
    assert [(d.name, d.uuid) for d in nvml_probe()] == smi_devices()


def test_mig_mode_is_what_the_hardware_says():
    from agent.gpu.nvml import Nvml
    out = subprocess.run(["nvidia-smi", "--query-gpu=mig.mode.current", "--format=csv,noheader"],
                         capture_output=True, text=True, check=True).stdout.split("\n")
    said = [{"Enabled": "enabled", "Disabled": "disabled"}.get(line.strip(), "unsupported") for line in out if line]
    nvml = Nvml.open()
    try:
        modes = [nvml.mig_mode(nvml.lib.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.lib.nvmlDeviceGetCount())]
    finally:
        nvml.close()
    assert modes == said


def test_health_reads_clean_and_a_task_sees_its_device(tmp_path):
    from integration_cluster import Cluster
    devices = smi_devices()
    with Cluster(tmp_path).start_server() as cluster:
        cluster.start_worker("gpu", gpus=None)
        listed = cluster.online_worker("gpu")
        assert listed["resources"]["gpus"] == len(devices)
        assert [(g["index"], g["uuid"], g["healthy"]) for g in listed["gpus"]] == \
            [(i, uuid, True) for i, (_, uuid) in enumerate(devices)]
        job_id = cluster.submit({"command": [sys.executable, "-c", CUDA_PROBE], "gpus": 1})
        done = cluster.wait_job(job_id, timeout=120)
        text = cluster.log_text(job_id)
        assert done["state"] == "succeeded", text
        index = cluster.sql("SELECT gpu_indices FROM tasks WHERE job_id = ?", (job_id,))[0][0]
        expected = devices[int(index.strip("[]"))][1]
        assert "COUNT 1" in text  # exactly one device visible through CUDA
        assert f"UUID {expected.split('-', 1)[1].replace('-', '')}" in text
        print(text)  # recorded in docs/workers.md when run on hardware


# A CUDA program without any Python package: the driver API through ctypes. What the task sees.
CUDA_PROBE = """
import ctypes, os
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
count, dev = ctypes.c_int(), ctypes.c_int()
cuda.cuDeviceGetCount(ctypes.byref(count))
cuda.cuDeviceGet(ctypes.byref(dev), 0)
uuid = (ctypes.c_ubyte * 16)()
get = getattr(cuda, "cuDeviceGetUuid_v2", None) or cuda.cuDeviceGetUuid
get(uuid, dev)
print("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
print("COUNT", count.value)
print("UUID", bytes(uuid).hex())
"""
