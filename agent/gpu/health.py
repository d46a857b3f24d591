"""The agent's GPU health watcher: Xid events in a thread, ECC, remapped rows and answers per heartbeat.

A fault is sticky: once a device is unhealthy it stays so in every report
until the agent restarts (and NVML then reports it clean) or the control
plane says an operator reset it (`reset_gpus` in a heartbeat answer; the
agent echoes each reset it applied, `reset_applied` in that device's report,
until a heartbeat carrying the echo is answered, and the control plane tells
the reset again until it hears the echo, so a lost answer loses no reset). Xids
that are the application's fault (nvml.APPLICATION_XIDS) change nothing. A
fault on a MIG-enabled GPU marks each of its MIG instances, or only the one
an Xid names. Every NVML call is in agent/gpu/nvml.py.
"""

import threading
from typing import Callable

from gpulayer.protocol import plural

from ..events import log_event
from .nvml import APPLICATION_XIDS, Device, Nvml, Xid

XID_WAIT_S = 1.0  # one event wait; the thread checks for a stop in between


class GpuHealth:
    """Per-device health of this worker's devices (its inventory's indices → NVML devices)."""

    def __init__(self, nvml: Nvml | None, devices: dict[int, Device], on_change: Callable[[], None] = lambda: None):
        self.nvml = nvml
        self.devices = devices
        self.on_change = on_change  # a device turned unhealthy: heartbeat now
        self.faults: dict[int, str] = {}
        self.applied: set[int] = set()  # resets applied, to echo until a heartbeat carrying them is answered
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None
        self.ecc_baseline: dict[int, int | None] = {}

    def start(self) -> None:
        """Check once, and start the Xid thread (when NVML gives an event set).

        The ECC baseline is 0: the volatile count clears only when the GPU is
        reset or the driver reloads, so errors from before this start (an
        agent restarted after a fault) count, and such a GPU reads unhealthy.
        """
        if self.nvml is None or not self.devices:
            return
        for gpu in self._gpus():
            self.ecc_baseline[gpu] = 0
        self.check()
        watch = self.nvml.xid_events(sorted(self._gpus()))
        if watch is not None:
            self.thread = threading.Thread(target=self._watch, args=(watch,), name="gpu-xids", daemon=True)
            self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        if self.thread is not None:
            self.thread.join(XID_WAIT_S + 2)

    def _gpus(self) -> set[int]:
        return {d.gpu for d in self.devices.values()}

    def _watch(self, watch) -> None:
        try:
            while not self.stopped.is_set():
                try:
                    event = watch.wait(XID_WAIT_S)
                except Exception as exc:  # noqa: BLE001 - the watch ends; the per-heartbeat checks go on
                    log_event("gpu_xid_watch_failed", error=repr(exc))
                    return
                if event is not None:
                    self.on_xid(event)
        finally:
            watch.close()

    def on_xid(self, event: Xid) -> None:
        """A critical Xid: the devices it names turn unhealthy, unless the application caused it."""
        if event.xid in APPLICATION_XIDS:
            log_event("gpu_xid_ignored", xid=event.xid, uuid=event.uuid, why="application error")
            return
        hit = [i for i, d in self.devices.items()
               if event.uuid is None
               or (event.uuid in (d.uuid, d.parent_uuid)
                   and (event.gpu_instance is None or not d.mig or d.gpu_instance == event.gpu_instance))]
        self._fail(hit, f"Xid {event.xid}")

    def check(self) -> None:
        """Per heartbeat: each GPU answers, no remapped-row failure or pending retirement, no new uncorrectable ECC error."""
        if self.nvml is None:
            return
        for gpu in sorted(self._gpus()):
            reason = self.nvml.problem(gpu)
            if reason is None:
                count, base = self.nvml.ecc_uncorrected(gpu), self.ecc_baseline.get(gpu)
                if count is not None and base is not None and count > base:
                    reason = plural(count - base, "uncorrectable ECC error")
            if reason is not None:
                self._fail([i for i, d in self.devices.items() if d.gpu == gpu], reason)

    def _fail(self, indices: list[int], reason: str) -> None:
        with self.lock:
            new = [i for i in indices if i not in self.faults]
            for index in new:
                self.faults[index] = reason
        for index in new:
            log_event("gpu_unhealthy", index=index, uuid=self.devices[index].uuid, reason=reason)
        if new:
            self.on_change()

    def reset(self, indices: list[int]) -> None:
        """An operator reset these devices: forget their faults, and count ECC errors from now (their
        volatile count is not cleared by an operator's word, only by a GPU reset or a driver reload)."""
        with self.lock:
            for index in indices:
                if int(index) not in self.devices:
                    continue
                self.applied.add(int(index))
                if self.faults.pop(int(index), None) is not None:
                    log_event("gpu_reset", index=index)
        if self.nvml is not None:
            for gpu in {self.devices[int(i)].gpu for i in indices if int(i) in self.devices}:
                self.ecc_baseline[gpu] = self.nvml.ecc_uncorrected(gpu)

    def report(self) -> list[dict]:
        """The heartbeat's `gpus`: `[{index, uuid, healthy, reason}]`, and `reset_applied: true` on a device
        whose reset was applied and not yet echoed in an answered heartbeat."""
        with self.lock:
            faults, applied = dict(self.faults), set(self.applied)
        return [{"index": i, "uuid": d.uuid, "healthy": i not in faults, "reason": faults.get(i),
                 **({"reset_applied": True} if i in applied else {})}
                for i, d in sorted(self.devices.items())]

    def echoed(self, sent: list[dict]) -> None:
        """A heartbeat carrying `sent` (a report()) was answered: the resets it echoed were heard."""
        with self.lock:
            self.applied -= {g["index"] for g in sent if g.get("reset_applied")}
