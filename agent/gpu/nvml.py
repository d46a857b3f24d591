"""Every NVML call the agent makes, in one place (nvidia-ml-py's ``pynvml``).

Inventory (GPUs, or the MIG instances of a MIG-enabled GPU, with UUIDs and
model or profile names), the health checks (uncorrectable ECC errors,
retired-page and remapped-row failures, whether the device still answers),
the Xid event wait and the use (utilization and memory, stats.py) all go through here, so that tests without a GPU replace
``pynvml`` alone and run the rest of the agent for real
(tests/agent/fake_nvml/pynvml.py).
"""

import threading
from dataclasses import dataclass
from typing import Any

from ..events import log_event

#: Xids that are the application's own fault: the GPU stays healthy. The NVIDIA device
#: plugin's list (13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped
#: processing, 45 preemptive cleanup, 68 video processor exception, 109 context switch timeout).
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


@dataclass(frozen=True)
class Device:
    """One schedulable device: a whole GPU, or one MIG instance of a MIG-enabled GPU."""

    gpu: int                          # the physical GPU's NVML index
    uuid: str                         # GPU-... or MIG-...
    name: str                         # the model, or for MIG the profile ("1g.10gb")
    mig: bool = False
    parent_uuid: str = ""             # MIG: the physical GPU's UUID (else its own)
    gpu_instance: int | None = None   # MIG: its GPU instance id (Xid events name it)


@dataclass(frozen=True)
class Xid:
    """One critical Xid event: the GPU it names (None: NVML could not tell) and its MIG instance, if any."""

    xid: int
    uuid: str | None
    gpu_instance: int | None = None


MIB = 1024 * 1024


@dataclass(frozen=True)
class Usage:
    """One reading of a GPU's use: utilization (%), memory used and total (MiB); None where not supported."""

    utilization_pct: float | None
    memory_used_mb: int | None
    memory_total_mb: int | None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Nvml:
    """An open NVML session; ``Nvml.open()`` is None without the library, a driver or a device."""

    def __init__(self, lib):
        self.lib = lib
        self.lock = threading.Lock()  # NVML is thread-safe; the handle cache here is not

    @classmethod
    def open(cls) -> "Nvml | None":
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as exc:  # no library, no driver, no device: all mean "no GPU"
            log_event("gpu_probe_unavailable", reason=f"{type(exc).__name__}: {exc}")
            return None
        return cls(pynvml)

    def close(self) -> None:
        try:
            self.lib.nvmlShutdown()
        except Exception as exc:  # noqa: BLE001 - shutting down: nothing left to do about it
            log_event("nvml_shutdown_failed", error=repr(exc))

    def _error(self, exc: Exception, *names: str) -> bool:
        """Is `exc` an NVMLError whose value is one of the NVML_ERROR_* `names`?"""
        value = getattr(exc, "value", None)
        return isinstance(exc, self.lib.NVMLError) and any(value == getattr(self.lib, n, object()) for n in names)

    # -- inventory -------------------------------------------------------------

    def devices(self) -> list[Device]:
        """Every schedulable device: each GPU, or the MIG instances of a GPU whose MIG mode is on.

        A GPU NVML cannot read (fallen off the bus before the agent started) is left out, with a log line.
        """
        lib, found = self.lib, []
        try:
            count = lib.nvmlDeviceGetCount()
        except lib.NVMLError as exc:
            log_event("gpu_probe_unavailable", reason=_text(exc))
            return []
        for gpu in range(count):
            try:
                handle = lib.nvmlDeviceGetHandleByIndex(gpu)
                uuid, name = _text(lib.nvmlDeviceGetUUID(handle)), _text(lib.nvmlDeviceGetName(handle))
                if self.mig_mode(handle) == "enabled":
                    found += self._mig_devices(gpu, handle, uuid)
                else:
                    found.append(Device(gpu=gpu, uuid=uuid, name=name, parent_uuid=uuid))
            except lib.NVMLError as exc:
                log_event("gpu_probe_failed", gpu=gpu, reason=_text(exc))
        return found

    def mig_mode(self, handle) -> str:
        """``enabled``, ``disabled``, or ``unsupported`` (a GPU without MIG, or an older driver)."""
        try:
            current, _pending = self.lib.nvmlDeviceGetMigMode(handle)
        except self.lib.NVMLError as exc:
            if self._error(exc, "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND"):
                return "unsupported"
            raise
        return "enabled" if current == getattr(self.lib, "NVML_DEVICE_MIG_ENABLE", 1) else "disabled"

    def _mig_devices(self, gpu: int, handle, parent_uuid: str) -> list[Device]:
        lib, found = self.lib, []
        for slot in range(lib.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except lib.NVMLError as exc:
                if self._error(exc, "NVML_ERROR_NOT_FOUND", "NVML_ERROR_INVALID_ARGUMENT"):
                    continue  # an empty slot
                raise
            name = _text(lib.nvmlDeviceGetName(mig))  # "NVIDIA A100-SXM4-40GB MIG 1g.5gb"
            found.append(Device(gpu=gpu, uuid=_text(lib.nvmlDeviceGetUUID(mig)), name=name.rpartition(" MIG ")[2],
                                mig=True, parent_uuid=parent_uuid,
                                gpu_instance=int(lib.nvmlDeviceGetGpuInstanceId(mig))))
        return found

    # -- health ----------------------------------------------------------------

    def ecc_uncorrected(self, gpu: int) -> int | None:
        """Volatile uncorrectable ECC errors of GPU `gpu` since the driver loaded; None where ECC is off."""
        lib = self.lib
        try:
            return int(lib.nvmlDeviceGetTotalEccErrors(lib.nvmlDeviceGetHandleByIndex(gpu),
                                                       lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, lib.NVML_VOLATILE_ECC))
        except lib.NVMLError:
            return None

    def problem(self, gpu: int) -> str | None:
        """Why GPU `gpu` is unhealthy now (no answer, a remapped-row failure, a row remap or pages
        pending until a GPU reset), or None. What the GPU does not support is no fault."""
        lib = self.lib
        try:
            handle = lib.nvmlDeviceGetHandleByIndex(gpu)
        except lib.NVMLError as exc:
            return f"does not answer NVML ({_text(exc)})"
        try:
            lib.nvmlDeviceGetTemperature(handle, lib.NVML_TEMPERATURE_GPU)  # does it still answer at all?
        except lib.NVMLError as exc:
            if not self._error(exc, "NVML_ERROR_NOT_SUPPORTED"):
                return f"does not answer NVML ({_text(exc)})"
        try:
            _corrected, _uncorrected, pending, failed = lib.nvmlDeviceGetRemappedRows(handle)
            if failed:
                return "row remapping failed (remapped-row failure)"
            if pending:  # an uncorrectable error, on Ampere and later: stays until the GPU is reset
                return "row remap pending (needs a GPU reset)"
        except lib.NVMLError:
            pass  # before Ampere: no row remapping, pages are retired instead
        try:
            if lib.nvmlDeviceGetRetiredPagesPendingStatus(handle) == getattr(lib, "NVML_FEATURE_ENABLED", 1):
                return "memory pages pending retirement (needs a GPU reset)"
        except lib.NVMLError:
            pass
        return None

    # -- use -------------------------------------------------------------------

    def usage(self, gpu: int) -> Usage | None:
        """GPU `gpu`'s utilization now (percent of the last sample period the GPU was busy, as nvidia-smi
        shows it) and its memory in MiB; None where NVML cannot tell either. A part NVML does not
        support is None alone."""
        lib = self.lib
        try:
            handle = lib.nvmlDeviceGetHandleByIndex(gpu)
        except lib.NVMLError:
            return None
        try:
            utilization: float | None = float(lib.nvmlDeviceGetUtilizationRates(handle).gpu)
        except lib.NVMLError:
            utilization = None
        used: int | None = None
        total: int | None = None
        try:
            memory = lib.nvmlDeviceGetMemoryInfo(handle)
            used, total = int(memory.used) // MIB, int(memory.total) // MIB
        except lib.NVMLError:
            pass
        if utilization is None and used is None:
            return None
        return Usage(utilization_pct=utilization, memory_used_mb=used, memory_total_mb=total)

    def process_memory(self, gpu: int) -> dict[int, int] | None:
        """The GPU memory each compute process uses on GPU `gpu`, MiB by host PID; None where NVML cannot tell
        (time-slicing's memory shares: agent/gpu/sharing.py)."""
        lib = self.lib
        try:
            found = lib.nvmlDeviceGetComputeRunningProcesses(lib.nvmlDeviceGetHandleByIndex(gpu))
        except (lib.NVMLError, AttributeError):
            return None
        return {int(p.pid): int(p.usedGpuMemory or 0) // MIB for p in found}

    def xid_events(self, gpus: list[int]) -> "XidEvents | None":
        """An event set for the critical Xids of these GPUs; None where NVML cannot give one."""
        lib = self.lib
        try:
            events = lib.nvmlEventSetCreate()
        except lib.NVMLError as exc:
            log_event("gpu_xid_watch_unavailable", error=_text(exc))
            return None
        for gpu in gpus:
            try:
                lib.nvmlDeviceRegisterEvents(lib.nvmlDeviceGetHandleByIndex(gpu), lib.nvmlEventTypeXidCriticalError,
                                             events)
            except lib.NVMLError as exc:
                log_event("gpu_xid_watch_unavailable", gpu=gpu, error=_text(exc))
        return XidEvents(self, events)


class XidEvents:
    """A registered NVML event set: ``wait()`` returns the next critical Xid, or None after the timeout."""

    def __init__(self, nvml: Nvml, events):
        self.nvml, self.events = nvml, events

    def wait(self, timeout_s: float) -> Xid | None:
        lib = self.nvml.lib
        try:
            data = lib.nvmlEventSetWait_v2(self.events, int(timeout_s * 1000))
        except lib.NVMLError as exc:
            if self.nvml._error(exc, "NVML_ERROR_TIMEOUT"):
                return None
            raise
        if data.eventType != lib.nvmlEventTypeXidCriticalError:
            return None
        try:
            uuid: str | None = _text(lib.nvmlDeviceGetUUID(data.device))
        except lib.NVMLError:
            uuid = None  # the event names no device NVML can tell: it counts for every GPU
        instance = getattr(data, "gpuInstanceId", None)
        return Xid(xid=int(data.eventData), uuid=uuid,
                   gpu_instance=None if instance in (None, 0xFFFFFFFF) else int(instance))

    def close(self) -> None:
        try:
            self.nvml.lib.nvmlEventSetFree(self.events)
        except Exception as exc:  # noqa: BLE001 - closing: nothing left to do about it
            log_event("nvml_event_set_free_failed", error=repr(exc))
