"""The worker's heartbeat, declared once: the tasks it runs now, its GPUs' health and their use.

The agent builds a `Heartbeat` and sends its wire form; the server reads it through this declaration
(gpulayer/server/http/wire.py); OpenAPI and the Heartbeat tables of docs/protocol.md are generated from
it (registration.py says how).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpulayer.protocol.fields import declare
from gpulayer.protocol.registration import MAX_GPU_INDEX, MAX_WORKER_GPUS, GpuReport

MAX_REPORTED_TASKS = 10_000
MAX_GPU_SAMPLES = 1024       # a heartbeat's `gpu_samples` at most (the agent sends one per GPU per interval)
MAX_GPU_MEMORY_MB = 1 << 30


@dataclass(frozen=True, kw_only=True)
class TaskReport:
    """One task the worker runs now (a heartbeat's `tasks`)."""

    task_id: int = declare(minimum=1, maximum=1 << 62, help="which task")
    state: str = declare("running", max_bytes=32, help="`running`, or `restarting` for a service replica between "
                                                      "two runs")
    endpoint: str | None = declare(None, max_bytes=300, help="a service replica's `host:port` (null: none)")
    restarts: int = declare(0, minimum=0, maximum=1 << 31, help="the service restarts so far")
    job_id: int | None = declare(None, minimum=1, maximum=1 << 62, help="the Assignment's, echoed for "
                                                                       "reconciliation")
    attempt: int | None = declare(None, minimum=1, maximum=1 << 31, help="the Assignment's, echoed")
    gpus: list[int] | None = declare(None, max_items=MAX_WORKER_GPUS, help="the Assignment's, echoed (each index "
                                                                           "once)")
    timeout_seconds: float | None = declare(
        None, omit=True, minimum=0, maximum=1e12,
        help="the time limit the agent enforces now, null for none; absent: not echoed (added with time limits "
             "updated while running)")


@dataclass(frozen=True, kw_only=True)
class GpuSample:
    """One GPU's use over one heartbeat interval (a heartbeat's `gpu_samples`; agent/gpu/stats.py)."""

    index: int = declare(minimum=0, maximum=MAX_GPU_INDEX, help="the worker's device index")
    at: float = declare(minimum=0, maximum=1e11, help="Unix seconds, the interval's end")
    utilization_pct: float | None = declare(None, minimum=0, maximum=100, help="mean over the interval")
    memory_used_mb: int | None = declare(None, minimum=0, maximum=MAX_GPU_MEMORY_MB,
                                         help="the most used during the interval (MiB)")
    memory_total_mb: int | None = declare(None, minimum=0, maximum=MAX_GPU_MEMORY_MB, help="MiB")


@dataclass(frozen=True, kw_only=True)
class Heartbeat:
    """POST /v1/worker/heartbeat: what the worker runs now, and how its GPUs are."""

    tasks: list[dict[str, Any]] = declare([], of=TaskReport, max_items=MAX_REPORTED_TASKS,
                                          help="the tasks it runs now")
    gpus: list[dict[str, Any]] | None = declare(
        None, omit=True, of=GpuReport, max_items=MAX_WORKER_GPUS,
        help="per-GPU health from NVML; `reset_applied: true` echoes a reset it applied (from `reset_gpus`), in "
             "every heartbeat until one carrying it is answered")
    gpu_samples: list[dict[str, Any]] = declare(
        [], omit=True, of=GpuSample, max_items=MAX_GPU_SAMPLES,
        help="each GPU's use over one heartbeat interval (added with GPU telemetry: an older server ignores it); "
             "a bad one is `400 invalid_field` naming it, and nothing of the heartbeat is kept")
