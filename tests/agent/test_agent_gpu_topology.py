"""The GPUs' wiring read from NVML (agent/gpu/topology.py), on the fake pynvml's topologies of two real
machines (tests/agent/fake_nvml: `nvlink_box`, `pcie_box`); and a GPU NVML reads no topology of."""
from __future__ import annotations

import pytest

from agent.gpu import topology
from agent.gpu.nvml import Nvml


def _read(fake_nvml, box: dict) -> list[dict]:
    fake_nvml(**box)
    nvml = Nvml.open()
    try:
        return topology.read(nvml, dict(enumerate(nvml.devices())))
    finally:
        nvml.close()


def test_an_nvlink_box_of_two_sets_of_four(fake_nvml):
    found = _read(fake_nvml, _box("nvlink_box"))
    assert [r["nvlink_peers"] for r in found] == [[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2],
                                                 [5, 6, 7], [4, 6, 7], [4, 5, 7], [4, 5, 6]]
    assert [r["pcie_switch"] for r in found] == [0, 0, 2, 2, 4, 4, 6, 6]
    assert [r["numa_node"] for r in found] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_a_pcie_box_has_no_nvlink(fake_nvml):
    found = _read(fake_nvml, _box("pcie_box"))
    assert all(r["nvlink_peers"] == [] for r in found) and found[7] == {
        "index": 7, "nvlink_peers": [], "pcie_switch": 6, "numa_node": 1}


def test_a_gpu_without_topology_reads_as_none(fake_nvml):
    found = _read(fake_nvml, {"gpus": [{"name": "T4", "uuid": "GPU-0"}, {"name": "T4", "uuid": "GPU-1"}]})
    assert found == [{"index": i, "nvlink_peers": [], "pcie_switch": None, "numa_node": None} for i in range(2)]


def _box(name: str) -> dict:
    import sys
    return getattr(sys.modules["pynvml"], name)()


def test_the_cpus_local_to_each_gpu_and_a_mig_instance_gets_its_gpus(fake_nvml):
    fake_nvml(gpus=[{"name": "H100", "uuid": "GPU-0", "cpus": [0, 1, 2, 3, 64, 65]},
                    {"name": "A100", "uuid": "GPU-1", "cpus": [4, 5], "mig_supported": True,
                     "mig": [{"profile": "1g.10gb", "uuid": "MIG-1-1", "gi": 1},
                             {"profile": "3g.40gb", "uuid": "MIG-1-2", "gi": 2}]},
                    {"name": "T4", "uuid": "GPU-2"}])
    nvml = Nvml.open()
    try:
        devices = dict(enumerate(nvml.devices()))
        found = topology.local_cpus(nvml, devices)
    finally:
        nvml.close()
    assert [devices[i].gpu for i in sorted(devices)] == [0, 1, 1, 2]
    assert found[1] == found[2] == {4, 5} and 3 not in found  # the T4's CPUs NVML cannot tell (nor the kernel)
    assert found[0] >= {0, 1, 2, 3}  # 64 and 65 only where the machine has that many CPUs (the set's size)


@pytest.mark.gpu
def test_a_real_gpus_local_cpus_are_the_kernels_and_a_task_is_born_on_them():
    """On a machine with an NVIDIA GPU and its driver: NVML's CPU affinity of each GPU is the kernel's
    local_cpulist of its PCI device (where the kernel tells), and a 1-GPU task's process runs on exactly them."""
    import subprocess

    from agent.cpusets import parse_cpu_list, pinned, readable_affinity
    from agent.gpu.pinning import CpuPins

    nvml = Nvml.open()
    if nvml is None:
        pytest.skip("no NVML here (no driver or no GPU)")
    try:
        devices = {i: d for i, d in enumerate(nvml.devices()) if not d.mig}
        if not devices:
            pytest.skip("only MIG instances here")
        local = topology.local_cpus(nvml, devices)
        with nvml.lock:
            buses = {i: topology._bus(nvml.lib.nvmlDeviceGetPciInfo(nvml.lib.nvmlDeviceGetHandleByIndex(d.gpu)))
                     for i, d in devices.items()}
    finally:
        nvml.close()
    assert local, "NVML told no GPU's CPUs"
    for index, cpus in local.items():
        kernel = topology.SYS_PCI / buses[index] / "local_cpulist"
        if kernel.exists():
            assert cpus == parse_cpu_list(kernel.read_text()), index
    mine, _ = readable_affinity()
    assert mine
    index = min(local)
    given = CpuPins(mine, local).take(1, [index], 0)
    assert given == (local[index] & mine or mine)
    with pinned(given):
        status = subprocess.run(["grep", "Cpus_allowed_list", "/proc/self/status"], capture_output=True, text=True)
    assert parse_cpu_list(status.stdout.split(":")[1]) == given
