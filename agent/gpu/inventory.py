"""What this worker offers: CPUs, memory and GPUs, detected and overridden.

GPUs, highest precedence first: the explicit ``--gpus`` (0 means none),
``GPULAYER_WORKER_GPUS``, ``SLURM_GPUS_ON_NODE``, ``SLURM_JOB_GPUS`` (a list
of ids), then NVML. CPUs and memory come from a Slurm allocation's variables
when present, else from the host; explicit ``--cpus`` / ``--ram-mb`` win.
"""

import os
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from ..events import log_event
from .nvml import Device, Nvml

#: A GPU probe returns every device it sees: NVML's (nvml.Device, with UUIDs and MIG instances),
#: or only their model names (a probe of tests or another source).
GpuProbe = Callable[[], Sequence["Device | str"]]


@dataclass
class Inventory:
    """Resources advertised at register; ``device_ids`` maps index → CUDA id."""

    cpus: float
    gpus: int
    memory_mb: int
    gpu_models: list[str] = field(default_factory=list)
    device_ids: list[str] = field(default_factory=list)
    #: index → the NVML device it is, where known (the health watcher reads these)
    nvml_devices: dict[int, Device] = field(default_factory=dict)
    #: how fractional tasks share a GPU (agent/gpu/sharing.py), and the smallest GPU's memory (0: unknown)
    gpu_sharing: str = "off"
    gpu_memory_mb: int = 0
    #: how its GPUs are wired (agent/gpu/topology.py): reported at register where NVML could tell
    gpu_topology: list[dict] = field(default_factory=list)
    #: index -> the CPUs local to that GPU (agent/gpu/topology.py's local_cpus), read for --pin-cpus only
    gpu_cpus: dict[int, frozenset[int]] = field(default_factory=dict)

    def resources(self) -> dict:
        """The ``resources`` object of the register call (sharing only when on, GPU memory only when known)."""
        return {
            "cpus": self.cpus,
            "gpus": self.gpus,
            "memory_mb": self.memory_mb,
            "gpu_models": list(self.gpu_models),
            **({"gpu_sharing": self.gpu_sharing} if self.gpu_sharing != "off" else {}),
            **({"gpu_memory_mb": self.gpu_memory_mb} if self.gpu_memory_mb else {}),
        }


def nvml_probe() -> list[Device]:
    """The devices NVML sees (a MIG-enabled GPU as its MIG instances); [] (and one info line) without a driver."""
    nvml = Nvml.open()
    if nvml is None:
        return []
    try:
        return nvml.devices()
    finally:
        nvml.close()


def _int_or_none(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name, "").strip()
    # Slurm may write "2(x3)" style repeats in per-node lists; take the leading number.
    digits = raw.split("(")[0]
    if not digits:
        return None
    try:
        return int(digits)
    except ValueError:
        log_event("inventory_ignored_variable", name=name, value=raw)
        return None


def _id_list(raw: str | None) -> list[str]:
    return [part.strip() for part in (raw or "").split(",") if part.strip()]


def _gpu_count(env: Mapping[str, str], explicit: int | None, probed: list[str]) -> tuple[int, str]:
    """The GPU count and where it came from."""
    if explicit is not None:
        return max(0, explicit), "flag"
    for name in ("GPULAYER_WORKER_GPUS", "SLURM_GPUS_ON_NODE"):
        value = _int_or_none(env, name)
        if value is not None:
            return max(0, value), name
    if env.get("SLURM_JOB_GPUS", "").strip():
        return len(_id_list(env["SLURM_JOB_GPUS"])), "SLURM_JOB_GPUS"
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and probed:
        return min(len(probed), len(_id_list(visible))), "nvml+CUDA_VISIBLE_DEVICES"
    return len(probed), "nvml"


def _device_ids(env: Mapping[str, str], count: int, devices: list[Device]) -> list[str]:
    """CUDA ids for indices 0..count-1: the worker's own CUDA_VISIBLE_DEVICES when set; with MIG, the UUIDs.

    CUDA reaches a MIG instance by its UUID only; a whole GPU beside MIG ones, or beside one NVML
    could not read (left out, so indices and CUDA's numbers differ), by its UUID too.
    """
    visible = _id_list(env.get("CUDA_VISIBLE_DEVICES"))
    if not visible and (any(d.mig for d in devices) or [d.gpu for d in devices] != list(range(len(devices)))):
        return [devices[i].uuid if i < len(devices) else str(i) for i in range(count)]
    return [visible[i] if i < len(visible) else str(i) for i in range(count)]


def nvml_devices(device_ids: list[str], devices: list[Device]) -> dict[int, Device]:
    """Which NVML device each index is: by UUID, or a whole GPU by its NVML index."""
    by_id = {d.uuid: d for d in devices}
    by_id.update({str(d.gpu): d for d in devices if not d.mig})
    return {index: by_id[cuda_id] for index, cuda_id in enumerate(device_ids) if cuda_id in by_id}


def _host_cpus() -> float:
    try:
        return float(len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return float(os.cpu_count() or 1)


def _host_memory_mb(meminfo: str = "/proc/meminfo") -> int:
    try:
        with open(meminfo) as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    except (ValueError, OSError, AttributeError):
        return 0


def _cpus(env: Mapping[str, str], explicit: float | None) -> float:
    if explicit is not None:
        return float(explicit)
    slurm = _int_or_none(env, "SLURM_CPUS_ON_NODE")
    return float(slurm) if slurm is not None else _host_cpus()


def _memory_mb(env: Mapping[str, str], explicit: int | None, cpus: float) -> int:
    if explicit is not None:
        return int(explicit)
    per_node = _int_or_none(env, "SLURM_MEM_PER_NODE")
    if per_node:
        return per_node
    per_cpu = _int_or_none(env, "SLURM_MEM_PER_CPU")
    if per_cpu:
        return int(per_cpu * cpus)
    return _host_memory_mb()


def detect(
    env: Mapping[str, str] | None = None,
    probe: GpuProbe = nvml_probe,
    cpus: float | None = None,
    gpus: int | None = None,
    ram_mb: int | None = None,
) -> Inventory:
    """Detect this worker's inventory; explicit values override detection."""
    env = os.environ if env is None else env
    probed = list(probe()) if gpus is None else []
    devices = [d for d in probed if isinstance(d, Device)]
    names = [d.name if isinstance(d, Device) else d for d in probed]
    count, source = _gpu_count(env, gpus, names)
    models = [names[i] if i < len(names) else "unknown" for i in range(count)]
    cpu_count = _cpus(env, cpus)
    device_ids = _device_ids(env, count, devices)
    inventory = Inventory(
        cpus=cpu_count,
        gpus=count,
        memory_mb=_memory_mb(env, ram_mb, cpu_count),
        gpu_models=models,
        device_ids=device_ids,
        nvml_devices=nvml_devices(device_ids, devices),
    )
    log_event(
        "inventory", cpus=inventory.cpus, gpus=inventory.gpus, gpu_source=source, memory_mb=inventory.memory_mb,
        mig=sum(d.mig for d in devices)
    )
    return inventory
