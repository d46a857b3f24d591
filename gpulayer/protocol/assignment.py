"""The Assignment, declared once: what a worker is told to run (acquire, and finish with `next`).

The server fills one per task (gpulayer/server/scheduler/placement.py), the
OpenAPI document and the Assignment table of docs/protocol.md are generated
from this declaration, and the agent reads an answer into `Assignment` objects
(`assignments()`): a field a newer server adds is left out, one an older server
does not send takes its default.
"""
from __future__ import annotations

from dataclasses import dataclass

from gpulayer.protocol.fields import declare, from_wire
from gpulayer.protocol.jobspec import MAX_PATHS, ImageSpec, ServiceSpec


@dataclass(frozen=True, kw_only=True)
class CheckpointRef:
    """`checkpoint`: the checkpoint a task's attempt starts from (docs/training.md)."""

    id: int = declare(minimum=1, help="the checkpoint's id (`gpulayer job checkpoints`)")
    attempt: int = declare(minimum=1, help="the attempt that left it: `GPULAYER_RESTORED_FROM_ATTEMPT`")
    files: list[dict[str, str | int]] = declare(
        [], help="its manifest: `{path, digest, size, mode}` per file, to fetch as artifacts into the task's "
                 "`GPULAYER_CHECKPOINT_DIR`")


@dataclass(frozen=True, kw_only=True)
class Assignment:
    """One task for a worker (docs/protocol.md, `Assignment`)."""

    task_id: int = declare(minimum=1, help="which task")
    job_id: int = declare(minimum=1, help="its job")
    attempt: int = declare(1, always=True, minimum=1, help="its try, from 1 (an array element's counts that element's tries alone)")
    index: int = declare(0, minimum=0, help="the replica or rank number, or an array element's index")
    command: list[str] = declare(min_items=1, help="argv list")
    env: dict[str, str] = declare({}, always=True, help="{str: str} from the job, plus the job's secrets, plus `GPULAYER_PREEMPTED=1` "
                                       "when the task was preempted before (docs/teams.md)")
    source: str | None = declare(None, help="digest of a tar.gz bundle to unpack into the working directory, or null")
    inputs: dict[str, str] = declare({}, help="{relative path: digest}")
    outputs: list[str] = declare([], max_items=MAX_PATHS, help="relative paths to collect after the run")
    gpus: list[int] = declare([], always=True, help="device indices reserved for this task, e.g. `[0, 1]`")
    cpus: float = declare(0, minimum=0, help="what the task asked for")
    memory_mb: int = declare(0, minimum=0, help="what the task asked for, in MB")
    service: ServiceSpec | None = declare(None, help="null, or the job's service settings")
    rank: int = declare(0, minimum=0, help="multi-node: this task's rank (0 otherwise)")
    world_size: int = declare(1, minimum=1, help="multi-node: the number of nodes (1 otherwise)")
    timeout_seconds: float | None = declare(None, help="null or seconds")
    silence_timeout_seconds: float | None = declare(None, help="null or seconds")
    array_index: int | None = declare(
        None, minimum=0, help="an array's element: its index (the same as `index`); null otherwise. The agent sets "
                              "`GPULAYER_ARRAY_INDEX` from it (added with arrays: an older server sends none)")
    array_size: int | None = declare(
        None, help="an array's element count; null otherwise. The agent sets `GPULAYER_ARRAY_SIZE` from it (added "
                   "with arrays: an older server sends none)")
    log_base: int = declare(
        0, minimum=0, help="the `n` of the task's first log line: 0, or after the lines stored by an earlier run of "
                           "the same task (after a preemption, or a gang sent back to the queue), which a line "
                           "numbered again from 0 would not be stored over (added with preemption: an older server "
                           "sends none, and the agent starts at 0)")

    network: str = declare("shared", help='the job\'s `network`: `"shared"` or `"none"` (added with sandboxes: an '
                                           'older server sends none)')
    run_as_root: bool = declare(False, help="the job's `run_as_root` (added with sandboxes)")
    image: ImageSpec | None = declare(None, help="the job's `image`, or null (added with images)")
    checkpoint: CheckpointRef | None = declare(
        None, help="the newest complete checkpoint of this element or rank, restored into "
                   "`GPULAYER_CHECKPOINT_DIR` before the task starts, or null (added with checkpoints: an older "
                   "agent ignores it and starts empty)")
    checkpoint_every_seconds: float | None = declare(
        None, help="the job's `checkpoint_every_seconds` (added with checkpoints)")
    signal: str | None = declare(
        None, help="the job's `signal` (`[B:]SIG@SECONDS`), or null (added with signals: an older agent ignores it "
                   "and sends no warning)")
    grace_seconds: float | None = declare(
        None, minimum=0, help="seconds from a planned stop's signal to SIGKILL (the job's `grace_seconds` within the "
                              "server's `--max-grace`); null: the agent's own rule (the heartbeat's "
                              "`preempt_grace_s` for a preemption, its kill grace otherwise). Added with signals: "
                              "an older agent keeps its fixed rule")
    gpu_fraction: float | None = declare(None, help="the job's `gpu_fraction` (added with fractions of a GPU)")
    gpu_memory_mb: int | None = declare(None, help="the job's `gpu_memory_mb` (added with fractions of a GPU)")
    gpu_share: float = declare(
        0, minimum=0, maximum=1, help="a fractional task's share of its one GPU (`gpus`) on this worker: its "
                                      "`gpu_fraction`, or its `gpu_memory_mb` over the GPU's memory if more; 0 for "
                                      "whole GPUs. The agent gives an MPS task `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` and "
                                      "`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` from it (added with fractions of a GPU)")

    @classmethod
    def from_wire(cls, obj: object) -> Assignment:
        """An Assignment from its JSON object; TypeError when it is none or lacks a required field."""
        return from_wire(cls, obj)


def assignments(answer: dict) -> list[Assignment]:
    """The assignments an acquire (or a finish with `next`) answer carries: `task`, then `more` (an older
    server sends no `more`). TypeError for one that is no Assignment."""
    if not answer.get("task"):
        return []
    return [Assignment.from_wire(task) for task in [answer["task"], *(answer.get("more") or [])]]
