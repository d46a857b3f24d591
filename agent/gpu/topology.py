"""How this worker's GPUs are wired, read from NVML once at start and reported at register (`gpu_topology`).

Per GPU (by the worker's device index): the GPUs its NVLinks reach (`nvmlDeviceGetNvLinkState` and
`nvmlDeviceGetNvLinkRemotePciInfo` on every link), the PCIe switch it sits under (GPUs whose closest common
ancestor, `nvmlDeviceGetTopologyCommonAncestor`, is a PCIe switch share one: it is named by the lowest index
among them) and its NUMA node (`nvmlDeviceGetNumaNodeId`, else the kernel's
/sys/bus/pci/devices/<bus>/numa_node). Placement gives a multi-GPU task GPUs of one NVLink set where it can
(gpulayer/server/scheduler/placement.py; docs/workers.md, "Topology"). A MIG instance has no topology of its
own: only whole GPUs are read. Whatever NVML does not support is left out, never a fault.

`local_cpus` reads the CPUs local to each GPU (`nvmlDeviceGetCpuAffinity`, else the kernel's
/sys/bus/pci/devices/<bus>/local_cpulist), for `worker start --pin-cpus` (agent/gpu/pinning.py); a MIG
instance gets its GPU's.
"""

import ctypes
import math
import os
from pathlib import Path
from typing import Any

from ..cpusets import parse_cpu_list
from ..events import log_event
from .nvml import Device, Nvml

SYS_PCI = Path("/sys/bus/pci/devices")


def _bus(info: Any) -> str:
    raw = info.busId
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return text.lower()[-12:]  # NVML pads the domain to 8 digits, the kernel to 4: the last 12 agree


def read(nvml: Nvml, devices: dict[int, Device]) -> list[dict]:
    """[{index, nvlink_peers, pcie_switch, numa_node}] for the whole GPUs of `devices` (index -> device);
    [] where NVML cannot read them."""
    lib = nvml.lib
    whole = {i: d.gpu for i, d in devices.items() if not d.mig}
    handles: dict[int, Any] = {}
    buses: dict[str, int] = {}
    try:
        with nvml.lock:
            for index, gpu in whole.items():
                handles[index] = lib.nvmlDeviceGetHandleByIndex(gpu)
                buses[_bus(lib.nvmlDeviceGetPciInfo(handles[index]))] = index
    except (lib.NVMLError, AttributeError) as exc:
        log_event("gpu_topology_unavailable", reason=str(exc))
        return []
    switches = _switches(lib, handles)
    return [{"index": index, "nvlink_peers": _peers(lib, handle, buses, index), "pcie_switch": switches.get(index),
             "numa_node": _numa(lib, handle, next(b for b, i in buses.items() if i == index))}
            for index, handle in sorted(handles.items())]


def _peers(lib: Any, handle: Any, buses: dict[str, int], index: int) -> list[int]:
    """The worker's indices of the GPUs this one's active NVLinks reach (NVSwitch links reach no GPU: none)."""
    found: set[int] = set()
    for link in range(int(getattr(lib, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            if lib.nvmlDeviceGetNvLinkState(handle, link) != getattr(lib, "NVML_FEATURE_ENABLED", 1):
                continue
            peer = buses.get(_bus(lib.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)))
        except (lib.NVMLError, AttributeError):
            continue
        if peer is not None and peer != index:
            found.add(peer)
    return sorted(found)


def _switches(lib: Any, handles: dict[int, Any]) -> dict[int, int]:
    """index -> the lowest index of the GPUs under its PCIe switch (only GPUs that share one)."""
    level = getattr(lib, "NVML_TOPOLOGY_MULTIPLE", 20)  # SINGLE or MULTIPLE: through PCIe switches only
    found: dict[int, int] = {}
    indices = sorted(handles)
    for n, one in enumerate(indices):
        for two in indices[n + 1:]:
            try:
                ancestor = lib.nvmlDeviceGetTopologyCommonAncestor(handles[one], handles[two])
            except (lib.NVMLError, AttributeError):
                continue
            if ancestor <= level:
                root = found.get(one, one)
                found[one] = root
                found.setdefault(two, root)
    return found


def _numa(lib: Any, handle: Any, bus: str) -> int | None:
    try:
        return int(lib.nvmlDeviceGetNumaNodeId(handle))
    except (lib.NVMLError, AttributeError):
        pass
    try:
        node = int((SYS_PCI / bus / "numa_node").read_text())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def local_cpus(nvml: Nvml, devices: dict[int, Device]) -> dict[int, frozenset[int]]:
    """index -> the CPUs local to that device's GPU, for the devices whose CPUs NVML or the kernel tell."""
    lib = nvml.lib
    found: dict[int, frozenset[int]] = {}
    by_gpu: dict[int, frozenset[int] | None] = {}
    for index, device in sorted(devices.items()):
        if device.gpu not in by_gpu:
            with nvml.lock:
                by_gpu[device.gpu] = _gpu_cpus(lib, device.gpu)
        cpus = by_gpu[device.gpu]
        if cpus:
            found[index] = cpus
    return found


def _gpu_cpus(lib: Any, gpu: int) -> frozenset[int] | None:
    try:
        handle = lib.nvmlDeviceGetHandleByIndex(gpu)
    except (lib.NVMLError, AttributeError):
        return None
    bits = ctypes.sizeof(ctypes.c_ulong) * 8
    try:
        words = lib.nvmlDeviceGetCpuAffinity(handle, math.ceil((os.cpu_count() or 1) / bits))
        cpus = frozenset(n * bits + b for n, word in enumerate(words) for b in range(bits) if int(word) >> b & 1)
        if cpus:
            return cpus
    except (lib.NVMLError, AttributeError):
        pass
    try:
        return parse_cpu_list((SYS_PCI / _bus(lib.nvmlDeviceGetPciInfo(handle)) / "local_cpulist").read_text()) or None
    except (lib.NVMLError, AttributeError, OSError, ValueError):
        return None
