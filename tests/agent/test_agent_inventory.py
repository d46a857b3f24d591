"""Inventory: GPU precedence, Slurm CPUs and memory, a fake NVML probe, real NVML when present."""

import pytest

from agent.gpu.inventory import detect, nvml_probe


def two_gpus():
    return ["NVIDIA H100", "NVIDIA H100"]


def no_driver():
    return []


def test_nvml_probe_counts_and_names():
    inv = detect(env={}, probe=two_gpus)
    assert (inv.gpus, inv.gpu_models, inv.device_ids) == (2, ["NVIDIA H100"] * 2, ["0", "1"])


def test_no_driver_means_no_gpus():
    assert detect(env={}, probe=no_driver).gpus == 0


@pytest.mark.parametrize(
    "env, explicit, expected",
    [
        ({"GPULAYER_WORKER_GPUS": "1", "SLURM_GPUS_ON_NODE": "3", "SLURM_JOB_GPUS": "0,1,2,3"}, None, 1),
        ({"SLURM_GPUS_ON_NODE": "3", "SLURM_JOB_GPUS": "0,1,2,3"}, None, 3),
        ({"SLURM_JOB_GPUS": "0,1,2,3"}, None, 4),
        ({"GPULAYER_WORKER_GPUS": "1", "SLURM_GPUS_ON_NODE": "3"}, 0, 0),
        ({"GPULAYER_WORKER_GPUS": "1"}, 5, 5),
        ({}, None, 2),
    ],
)
def test_gpu_override_order(env, explicit, expected):
    assert detect(env=env, probe=two_gpus, gpus=explicit).gpus == expected


def test_workers_own_visible_devices_limit_and_map_gpus():
    inv = detect(env={"CUDA_VISIBLE_DEVICES": "1"}, probe=two_gpus)
    assert (inv.gpus, inv.device_ids) == (1, ["1"])


def test_slurm_cpus_and_memory():
    inv = detect(env={"SLURM_CPUS_ON_NODE": "8", "SLURM_MEM_PER_NODE": "64000"}, probe=no_driver)
    assert (inv.cpus, inv.memory_mb) == (8.0, 64000)
    inv = detect(env={"SLURM_CPUS_ON_NODE": "4", "SLURM_MEM_PER_CPU": "2000"}, probe=no_driver)
    assert inv.memory_mb == 8000


def test_host_figures_and_explicit_overrides():
    inv = detect(env={}, probe=no_driver)
    assert inv.cpus >= 1 and inv.memory_mb > 0
    inv = detect(env={"SLURM_CPUS_ON_NODE": "8"}, probe=no_driver, cpus=2.5, ram_mb=1234)
    assert (inv.cpus, inv.memory_mb) == (2.5, 1234)
    assert inv.resources() == {"cpus": 2.5, "gpus": 0, "memory_mb": 1234, "gpu_models": []}


def _nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _nvml_works(), reason="no NVIDIA driver here (pynvml.nvmlInit failed)")
def test_real_nvml_sees_the_gpus():
    import pynvml

    pynvml.nvmlInit()
    count = pynvml.nvmlDeviceGetCount()
    pynvml.nvmlShutdown()
    devices = nvml_probe()  # a MIG-enabled GPU counts as its instances: at least one device per GPU
    assert len(devices) >= count > 0
    assert all(d.name and d.uuid.startswith(("GPU-", "MIG-")) for d in devices)
    assert detect(env={}, probe=nvml_probe).gpus == len(devices)


def test_nvml_probe_without_driver_does_not_crash():
    if _nvml_works():
        pytest.skip("a driver is present")
    assert nvml_probe() == []
