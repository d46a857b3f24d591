"""Sharing a GPU between fractional tasks (issue 40; docs/workers.md, "Sharing a GPU").

``worker start --gpu-sharing mps|time-slice|off`` (default off). With ``mps`` the agent runs NVIDIA's MPS
control daemon for each GPU a fractional task is given (``nvidia-cuda-mps-control -d``, its pipe and log
folders its own, under /var/tmp so that sandboxed tasks reach them) and gives the task
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (its compute share) and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (its memory
share); without the daemon installed the worker says so at start and offers whole GPUs. With ``time-slice``
the task gets the device alone and ``GPULAYER_GPU_MEMORY_LIMIT_MB``.
"""

import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Callable

from gpulayer.protocol.assignment import Assignment

from ..events import log_event

MODES = ("off", "mps", "time-slice")
MPS_CONTROL = "nvidia-cuda-mps-control"


def resolve(mode: str, which: Callable[[str], str | None] = shutil.which) -> tuple[str, str | None]:
    """The sharing mode the worker offers for the one asked, and why it differs (None: as asked)."""
    if mode not in MODES:
        raise ValueError(f"--gpu-sharing: {mode!r} is no sharing mode (one of {', '.join(MODES)})")
    if mode == "mps" and which(MPS_CONTROL) is None:
        return "off", (f"--gpu-sharing mps: {MPS_CONTROL} (NVIDIA MPS) is not installed on this machine: "
                       "offering whole GPUs only")
    return mode, None


def memory_limit_mb(assignment: Assignment, gpu_memory_mb: int) -> int | None:
    """A fractional task's memory share in MB: its `gpu_memory_mb`, else its share of the GPU's memory."""
    if assignment.gpu_memory_mb:
        return int(assignment.gpu_memory_mb)
    return int(assignment.gpu_share * gpu_memory_mb) if gpu_memory_mb else None


def thread_percentage(assignment: Assignment) -> int:
    """CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: the compute share (its `gpu_fraction`, else its share), 1 to 100."""
    share = assignment.gpu_fraction or assignment.gpu_share
    return max(1, min(100, round(share * 100)))


class MpsDaemons:
    """One MPS control daemon per GPU that a fractional task is given, started on first use, quit at close."""

    def __init__(self, device_ids: list[str], root: Path | None = None,
                 run: Callable[..., subprocess.CompletedProcess] = subprocess.run):
        self.device_ids = device_ids
        self.root = root or Path(f"/var/tmp/gpulayer-mps-{os.geteuid()}")
        self.run = run
        self.started: set[int] = set()
        self.lock = threading.Lock()

    def folders(self, index: int) -> dict[str, str]:
        """The MPS variables a client (and the daemon) of GPU `index` uses."""
        base = self.root / str(index)
        return {"CUDA_MPS_PIPE_DIRECTORY": str(base / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(base / "log")}

    def _env(self, index: int) -> dict[str, str]:
        device = self.device_ids[index] if index < len(self.device_ids) else str(index)
        return {**os.environ, **self.folders(index), "CUDA_VISIBLE_DEVICES": device}

    def ensure(self, index: int) -> dict[str, str]:
        """Start GPU `index`'s daemon unless it runs; its folders for the task's environment."""
        with self.lock:
            if index not in self.started:
                for folder in self.folders(index).values():
                    Path(folder).mkdir(parents=True, exist_ok=True, mode=0o755)
                done = self.run([MPS_CONTROL, "-d"], env=self._env(index), capture_output=True, timeout=30)
                log_event("mps_daemon_started", gpu=index, exit_code=done.returncode)
                self.started.add(index)
        return self.folders(index)

    def close(self) -> None:
        """Quit every daemon this agent started."""
        with self.lock:
            for index in sorted(self.started):
                try:
                    self.run([MPS_CONTROL], input=b"quit\n", env=self._env(index), capture_output=True, timeout=30)
                except (OSError, subprocess.SubprocessError) as exc:
                    log_event("mps_daemon_quit_failed", gpu=index, error=str(exc))
            self.started.clear()


def descends_from(pid: int, root: int, proc: str = "/proc") -> bool:
    """Whether process `pid` is `root` or one of its descendants (its parents read from /proc)."""
    for _ in range(64):
        if pid == root:
            return True
        try:
            with open(f"{proc}/{pid}/stat") as handle:
                pid = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid <= 1:
            return False
    return False


class GpuSharing:
    """What the worker's sharing mode adds to a fractional task's environment, and time-slicing's memory watch."""

    def __init__(self, mode: str = "off", gpu_memory_mb: int = 0, mps: MpsDaemons | None = None,
                 nvml_gpus: dict[int, int] | None = None,
                 descends: Callable[[int, int], bool] = descends_from):
        self.mode, self.gpu_memory_mb, self.mps = mode, gpu_memory_mb, mps
        self.nvml_gpus = nvml_gpus or {}  # the worker's device index -> its NVML GPU index
        self.descends = descends

    def enforced_limit_mb(self, assignment: Assignment) -> int | None:
        """The memory share the agent holds a task to: a fractional task's, on a time-slicing worker."""
        if self.mode != "time-slice" or not assignment.gpu_share or not assignment.gpus:
            return None
        return memory_limit_mb(assignment, self.gpu_memory_mb)

    def watch_memory(self, nvml, handles: list) -> None:
        """Mark each watched task (TaskHandle with `gpu_memory_limit_mb`) whose processes use more GPU memory
        than its share, as NVML reports per process: its runner stops it, failed, with the reason."""
        read: dict[int, dict[int, int] | None] = {}
        for handle in handles:
            limit, process = handle.gpu_memory_limit_mb, handle.process
            gpus = handle.assignment.get("gpus") or []
            if not limit or process is None or handle.over_share or not gpus:
                continue
            gpu = self.nvml_gpus.get(gpus[0], gpus[0])
            if gpu not in read:
                read[gpu] = nvml.process_memory(gpu)
            used = sum(mb for pid, mb in (read[gpu] or {}).items() if self.descends(pid, process.pid))
            if used > limit:
                handle.over_share = (f"GPU memory share exceeded: its processes use {used} MiB of GPU {gpus[0]}, "
                                     f"its share is {limit} MiB (time-slicing; gpu_memory_mb / gpu_fraction)")
                log_event("gpu_memory_share_exceeded", task_id=handle.task_id, used_mb=used, limit_mb=limit)

    def environment(self, assignment: Assignment) -> dict[str, str]:
        """The variables of a fractional task ({} for whole GPUs, or a worker that does not share)."""
        if self.mode == "off" or not assignment.gpu_share or not assignment.gpus:
            return {}
        limit = memory_limit_mb(assignment, self.gpu_memory_mb)
        env = {"GPULAYER_GPU_SHARE": f"{assignment.gpu_share:g}"}
        if limit:
            env["GPULAYER_GPU_MEMORY_LIMIT_MB"] = str(limit)
        if self.mode == "mps" and self.mps is not None:
            env.update(self.mps.ensure(assignment.gpus[0]))
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(thread_percentage(assignment))
            if limit:  # the task sees its one GPU as device 0
                env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={limit}M"
        return env
