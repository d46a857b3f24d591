"""A fake of nvidia-ml-py's `pynvml`, the one library agent/gpu/nvml.py calls: GPUs without a GPU.

Put this folder first on PYTHONPATH (a worker process) or in sys.modules (this
process) and point FAKE_NVML_STATE at a JSON file; every call reads the file
again, so a test changes the hardware under a running agent by rewriting it
(`write_state`, atomically)::

    {"gpus": [{"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-0",
               "mig": null | [{"profile": "1g.10gb", "uuid": "MIG-0-1", "gi": 1}],
               "mig_supported": true, "ecc_uncorrected": 0, "remap_failed": false,
               "remap_pending": false, "retire_pending": false, "lost": false, "events": true}],
     "xids": [{"uuid": "GPU-0" | null, "xid": 79, "gi": null, "type": 8} | {"error": 999}],
     "init_error": false, "count_error": false, "event_set_error": false}

and per GPU, optionally: "temperature": false (not supported), "retire_pending": null (not supported),
"utilization": 0..100 (default 0; null: not supported), "memory_used_mb" (default 0; null: memory info
not supported) and "memory_total_mb" (default 81559); the topology (agent/gpu/topology.py): "nvlink" (the
indices of the GPUs its NVLinks reach, one link each; default none), "pcie_switch" (GPUs with the same value
share a PCIe switch; default: none shared), "numa_node" (default: NVML cannot tell) and "cpus" (the CPU
numbers local to it, `nvmlDeviceGetCpuAffinity`; default: NVML cannot tell). `nvlink_box()` and
`pcie_box()` are the topologies of two real machines.

Only what agent/gpu/nvml.py uses is here, with pynvml's names, constants and
error values; `xids` are delivered once each to every event set, in order.
"""
from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_UNKNOWN = 999
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_TEMPERATURE_GPU = 0
NVML_FEATURE_ENABLED = 1
NVML_FEATURE_DISABLED = 0
nvmlEventTypeXidCriticalError = 0x8
NVML_NVLINK_MAX_LINKS = 18
NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_SYSTEM = 50

STATE_VARIABLE = "FAKE_NVML_STATE"
_initialised = 0


class NVMLError(Exception):
    def __init__(self, value: int):
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {NVML_ERROR_GPU_IS_LOST: "GPU is lost", NVML_ERROR_TIMEOUT: "Timeout",
                NVML_ERROR_NOT_SUPPORTED: "Not Supported", NVML_ERROR_NOT_FOUND: "Not Found"}.get(
                    self.value, f"NVML error {self.value}")


def write_state(path, state: dict) -> None:
    """Replace the fake hardware's state at once (readers never see half a file)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as handle:
        json.dump(state, handle)
    os.replace(tmp, path)


def _state() -> dict:
    path = os.environ.get(STATE_VARIABLE)
    if not path:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    with open(path) as handle:
        return json.load(handle)


def _gpu(handle) -> dict:
    gpus = _state()["gpus"]
    if handle[1] >= len(gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    gpu = gpus[handle[1]]
    if gpu.get("lost"):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return gpu


def _check() -> None:
    if not _initialised:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)


def nvmlInit() -> None:
    global _initialised
    if _state().get("init_error"):
        raise NVMLError(NVML_ERROR_UNKNOWN)
    _initialised += 1


def nvmlShutdown() -> None:
    global _initialised
    _check()
    _initialised -= 1


def nvmlDeviceGetCount() -> int:
    _check()
    state = _state()
    if state.get("count_error"):
        raise NVMLError(NVML_ERROR_UNKNOWN)
    return len(state["gpus"])


def nvmlDeviceGetHandleByIndex(index: int):
    _check()
    if index >= len(_state()["gpus"]):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return ("gpu", index)


def nvmlDeviceGetName(handle) -> str:
    gpu = _gpu(handle)
    if handle[0] == "mig":
        return f"{gpu['name']} MIG {gpu['mig'][handle[2]]['profile']}"
    return gpu["name"]


def nvmlDeviceGetUUID(handle) -> str:
    gpu = _gpu(handle)
    return gpu["mig"][handle[2]]["uuid"] if handle[0] == "mig" else gpu["uuid"]


def nvmlDeviceGetMigMode(handle):
    gpu = _gpu(handle)
    if not gpu.get("mig_supported", gpu.get("mig") is not None):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    mode = NVML_DEVICE_MIG_ENABLE if gpu.get("mig") is not None else NVML_DEVICE_MIG_DISABLE
    return [mode, mode]


def nvmlDeviceGetMaxMigDeviceCount(handle) -> int:
    _gpu(handle)
    return 7


def nvmlDeviceGetMigDeviceHandleByIndex(handle, index: int):
    gpu = _gpu(handle)
    if index >= len(gpu.get("mig") or []):
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return ("mig", handle[1], index)


def nvmlDeviceGetGpuInstanceId(handle) -> int:
    return _gpu(handle)["mig"][handle[2]]["gi"]


def nvmlDeviceGetTotalEccErrors(handle, error_type, counter_type) -> int:
    gpu = _gpu(handle)
    if gpu.get("ecc_uncorrected") is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return int(gpu["ecc_uncorrected"])


def nvmlDeviceGetTemperature(handle, sensor) -> int:
    if not _gpu(handle).get("temperature", True):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return 40


def nvmlDeviceGetRemappedRows(handle):
    gpu = _gpu(handle)
    if gpu.get("remap_failed") is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    pending = bool(gpu.get("remap_pending"))
    return (0, 1 if gpu["remap_failed"] or pending else 0, pending, bool(gpu["remap_failed"]))


def nvmlDeviceGetRetiredPagesPendingStatus(handle) -> int:
    gpu = _gpu(handle)
    if "retire_pending" in gpu and gpu["retire_pending"] is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return NVML_FEATURE_ENABLED if gpu.get("retire_pending") else NVML_FEATURE_DISABLED


def nvmlDeviceGetUtilizationRates(handle):
    gpu = _gpu(handle)
    if gpu.get("utilization", 0) is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return SimpleNamespace(gpu=int(gpu.get("utilization", 0)), memory=0)


def nvmlDeviceGetMemoryInfo(handle):
    gpu = _gpu(handle)
    if gpu.get("memory_used_mb", 0) is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    total, used = int(gpu.get("memory_total_mb", 81559)) << 20, int(gpu.get("memory_used_mb", 0)) << 20
    return SimpleNamespace(total=total, used=used, free=total - used)


def nvmlDeviceGetComputeRunningProcesses(handle):
    """The state's `processes` of the GPU: [{"pid", "used_mb"}] (time-slicing's memory shares)."""
    return [SimpleNamespace(pid=p["pid"], usedGpuMemory=p["used_mb"] * 1024 * 1024)
            for p in _gpu(handle).get("processes", [])]


def nvmlEventSetCreate():
    _check()
    if _state().get("event_set_error"):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return SimpleNamespace(gpus=set(), seen=0)


def nvmlDeviceRegisterEvents(handle, types: int, events) -> None:
    gpu = _gpu(handle)
    if not gpu.get("events", True):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    events.gpus.add(gpu["uuid"])


def nvmlEventSetWait_v2(events, timeout_ms: int):
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        state = _state()
        xids = state.get("xids") or []
        if events.seen < len(xids):
            event = xids[events.seen]
            events.seen += 1
            if "error" in event:  # the wait itself fails (a driver in trouble)
                raise NVMLError(event["error"])
            index = next((i for i, g in enumerate(state["gpus"]) if g["uuid"] == event.get("uuid")), None)
            return SimpleNamespace(eventType=event.get("type", nvmlEventTypeXidCriticalError), eventData=event["xid"],
                                   device=("gpu", index if index is not None else 1 << 20),
                                   gpuInstanceId=event.get("gi") if event.get("gi") is not None else 0xFFFFFFFF,
                                   computeInstanceId=0xFFFFFFFF)
        if time.monotonic() >= deadline:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        time.sleep(0.05)


def nvmlEventSetFree(events) -> None:
    events.gpus.clear()


# -- topology (agent/gpu/topology.py) -------------------------------------------


def _bus_id(index: int) -> str:
    return f"00000000:{0x18 + 0x10 * index:02X}:00.0"


def nvmlDeviceGetPciInfo(handle):
    _gpu(handle)
    return SimpleNamespace(busId=_bus_id(handle[1]).encode())


def nvmlDeviceGetNvLinkState(handle, link: int) -> int:
    peers = _gpu(handle).get("nvlink") or []
    if link >= NVML_NVLINK_MAX_LINKS:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if not peers:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return NVML_FEATURE_ENABLED if link < len(peers) else NVML_FEATURE_DISABLED


def nvmlDeviceGetNvLinkRemotePciInfo(handle, link: int):
    peers = _gpu(handle).get("nvlink") or []
    if link >= len(peers):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return SimpleNamespace(busId=_bus_id(peers[link]).encode())


def nvmlDeviceGetTopologyCommonAncestor(handle1, handle2) -> int:
    one, two = _gpu(handle1), _gpu(handle2)
    if handle1[1] == handle2[1]:
        return NVML_TOPOLOGY_INTERNAL
    if one.get("pcie_switch") is not None and one.get("pcie_switch") == two.get("pcie_switch"):
        return NVML_TOPOLOGY_MULTIPLE
    if one.get("numa_node") is not None and one.get("numa_node") == two.get("numa_node"):
        return NVML_TOPOLOGY_NODE
    return NVML_TOPOLOGY_SYSTEM


def nvmlDeviceGetNumaNodeId(handle) -> int:
    gpu = _gpu(handle)
    if gpu.get("numa_node") is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return int(gpu["numa_node"])


def nvmlDeviceGetCpuAffinity(handle, cpu_set_size: int) -> list[int]:
    """The CPUs local to the GPU as `cpu_set_size` 64-bit words (pynvml: an array of C unsigned longs)."""
    gpu = _gpu(handle)
    if gpu.get("cpus") is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    words = [0] * cpu_set_size
    for cpu in gpu["cpus"]:
        if cpu // 64 < cpu_set_size:
            words[cpu // 64] |= 1 << cpu % 64
    return words


def _h100(index: int, **topology) -> dict:
    return {"name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{index}", "mig_supported": True, "mig": None,
            "ecc_uncorrected": 0, "remap_failed": False, **topology}


def nvlink_box() -> dict:
    """8 GPUs whose NVLink bridges join 0-3 and 4-7 (each GPU linked to the 3 others of its set, as on 4-way
    NVLink-bridged PCIe servers); two PCIe switches per CPU socket, one socket per set."""
    return {"gpus": [_h100(i, nvlink=[j for j in range(i - i % 4, i - i % 4 + 4) if j != i for _ in range(2)],
                           pcie_switch=i // 2, numa_node=i // 4) for i in range(8)], "xids": []}


def pcie_box() -> dict:
    """8 GPUs without NVLink: pairs under four PCIe switches, two switches per CPU socket (NUMA node)."""
    return {"gpus": [_h100(i, pcie_switch=i // 2, numa_node=i // 4) for i in range(8)], "xids": []}
