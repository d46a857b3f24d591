"""GPU telemetry: each GPU's utilization and memory read every few seconds, sent downsampled with heartbeats.

A thread reads NVML every `sample_s` (SAMPLE_S, or the heartbeat interval when
shorter) and accumulates per device index: the mean utilization and the most
memory used. Each heartbeat closes the accumulations into one summary per GPU
(`take`: `{index, at, utilization_pct, memory_used_mb, memory_total_mb}`, the
heartbeat's `gpu_samples`, docs/protocol.md) and sends every summary not yet
answered; an answered heartbeat forgets those it carried (`sent`). While the
control plane is unreachable they wait, at most MAX_PENDING intervals of them
(the oldest go first). An idle agent that skips its heartbeats (heartbeat.py,
`_beat_needless`) still sends them once they are SEND_EVERY intervals old, so
an idle GPU's use is charted too, at one request in SEND_EVERY. MIG instances
report nothing: NVML gives no utilization per instance. Every NVML call is in
agent/gpu/nvml.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..events import log_event
from .nvml import Device, Nvml

SAMPLE_S = 2.0  # NVML is read this often (or each heartbeat interval, when shorter)
MAX_PENDING = 16  # intervals of summaries kept per GPU while heartbeats go unanswered
SEND_EVERY = 10  # an agent skipping its beats sends its summaries once the oldest is this many intervals old
MAX_SAMPLES = 1024  # a heartbeat's `gpu_samples` at most (the control plane's limit)


@dataclass
class _Interval:
    """What one GPU's readings since the last summary add up to."""

    started: float
    readings: int = 0
    busy_sum: float = 0.0
    busy_readings: int = 0
    used_max: int | None = None
    total: int | None = None


class GpuStats:
    """Per-GPU utilization and memory of this worker's devices (its inventory's indices → NVML devices)."""

    def __init__(self, nvml: Nvml, devices: dict[int, Device], interval_s: Callable[[], float], clock: Callable[[], float] = time.time):
        self.nvml = nvml
        self.devices = {i: d for i, d in devices.items() if not d.mig}
        self.interval_s = interval_s  # the heartbeat interval now (the control plane may change it)
        self.clock = clock
        self.lock = threading.Lock()
        self.current: dict[int, _Interval] = {}
        self.pending: list[dict] = []  # summaries not yet in an answered heartbeat, oldest first
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        """Read once, and start the sampling thread (nothing to do without a whole GPU)."""
        if not self.devices:
            return
        self.sample()
        self.thread = threading.Thread(target=self._run, name="gpu-stats", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        if self.thread is not None:
            self.thread.join(5)

    def sample_s(self) -> float:
        return max(0.05, min(SAMPLE_S, self.interval_s()))

    def _run(self) -> None:
        while not self.stopped.wait(self.sample_s()):
            try:
                self.sample()
            except Exception as exc:  # noqa: BLE001 - telemetry must never stop the agent; try again next time
                log_event("gpu_stats_failed", error=repr(exc))

    def sample(self) -> None:
        """Read each GPU's use once and add it to its interval."""
        now = self.clock()
        for index, device in sorted(self.devices.items()):
            usage = self.nvml.usage(device.gpu)
            if usage is None:
                continue
            with self.lock:
                acc = self.current.setdefault(index, _Interval(started=now))
                acc.readings += 1
                if usage.utilization_pct is not None:
                    acc.busy_sum += usage.utilization_pct
                    acc.busy_readings += 1
                if usage.memory_used_mb is not None:
                    acc.used_max = max(acc.used_max or 0, usage.memory_used_mb)
                    acc.total = usage.memory_total_mb

    def take(self) -> list[dict]:
        """The heartbeat's `gpu_samples`: the intervals read so far closed into one summary per GPU, with the
        summaries no answered heartbeat carried yet (oldest first, at most MAX_SAMPLES)."""
        now = self.clock()
        with self.lock:
            for index, acc in sorted(self.current.items()):
                self.pending.append(
                    {
                        "index": index,
                        "at": round(now, 3),
                        "utilization_pct": round(acc.busy_sum / acc.busy_readings, 2) if acc.busy_readings else None,
                        "memory_used_mb": acc.used_max,
                        "memory_total_mb": acc.total,
                    }
                )
            self.current.clear()
            keep = min(MAX_SAMPLES, MAX_PENDING * max(1, len(self.devices)))
            if len(self.pending) > keep:
                log_event("gpu_samples_dropped", n=len(self.pending) - keep)
                del self.pending[: len(self.pending) - keep]
            return list(self.pending)

    def sent(self, samples: list[dict]) -> None:
        """A heartbeat carrying `samples` (a take()) was answered: the control plane has them."""
        carried = {id(s) for s in samples}
        with self.lock:
            self.pending = [s for s in self.pending if id(s) not in carried]

    def due(self) -> bool:
        """True when the oldest summary waiting is SEND_EVERY intervals old: a skipped beat should go after all."""
        with self.lock:
            oldest = self.pending[0]["at"] if self.pending else None
        return oldest is not None and self.clock() - oldest >= SEND_EVERY * self.interval_s()
