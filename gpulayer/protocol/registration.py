"""The worker's register request, declared once: what a worker says of itself when it joins.

The agent builds a `Register` and sends its wire form (`to_wire`); the server reads the body through this
declaration (gpulayer/server/http/wire.py); the OpenAPI request body and the Register tables of
docs/protocol.md are generated from it (scripts/gen_docs.py; a test fails when they drift). A field a
writer sends only now and then is `omit`: left off the wire at its default, as the agent always did.
Records that other parts of the agent make as plain JSON objects (its inventory's `resources`, its
sandbox's `isolation`, its relay's offer, its GPUs' health) are declared as records (`of`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from gpulayer.protocol.fields import declare

MAX_GPU_INDEX = 1023        # a worker's device indices: 0 .. 1023
MAX_WORKER_GPUS = 1024      # GPUs one worker reports at most


@dataclass(frozen=True, kw_only=True)
class Resources:
    """`resources`: what the worker offers."""

    cpus: float = declare(0, minimum=0, maximum=1_000_000, help="CPUs")
    gpus: int = declare(0, minimum=0, maximum=1024, help="GPUs")
    memory_mb: int = declare(0, minimum=0, maximum=1 << 40, help="memory, in MB")
    gpu_models: list[str] = declare([], max_items=MAX_WORKER_GPUS, help="the GPUs' model names (at most 256 "
                                                                         "characters each)")
    gpu_sharing: Literal["off", "mps", "time-slice"] = declare(
        "off", help="how it shares a GPU between fractional tasks (`worker start --gpu-sharing`; `off`: whole GPUs "
                    "only; docs/workers.md, \"Sharing a GPU\"). Sent only when not `off` (added with fractions of a "
                    "GPU: an older control plane ignores it)")
    gpu_memory_mb: int = declare(0, minimum=0, maximum=1 << 30, help="the memory of its smallest GPU, in MB (0: "
                                                                    "unknown); sent only when known")


@dataclass(frozen=True, kw_only=True)
class GpuReport:
    """One GPU's health (register's and the heartbeat's `gpus`): the agent's reading of NVML."""

    index: int = declare(minimum=0, maximum=MAX_GPU_INDEX, help="the worker's device index")
    uuid: str | None = declare(None, max_bytes=128, help="the GPU's UUID")
    healthy: bool = declare(True, help="false once NVML reported a fault")
    reason: str | None = declare(None, max_bytes=1024, help="the fault")
    reset_applied: bool = declare(False, help="heartbeat: the agent applied an operator's reset of this GPU "
                                              "(`reset_gpus`) since its last answer; sent until answered")


@dataclass(frozen=True, kw_only=True)
class GpuTopology:
    """One GPU's wiring (register's `gpu_topology`): the agent's reading of NVML (agent/gpu/topology.py)."""

    index: int = declare(minimum=0, maximum=MAX_GPU_INDEX, help="the worker's device index")
    nvlink_peers: list[int] = declare([], max_items=MAX_WORKER_GPUS, help="the device indices its NVLinks reach")
    pcie_switch: int | None = declare(None, minimum=0, maximum=MAX_GPU_INDEX,
                                      help="the PCIe switch it sits under, named by the lowest device index "
                                           "under it (null: it shares none)")
    numa_node: int | None = declare(None, minimum=0, maximum=1023, help="its NUMA node (null: unknown)")


@dataclass(frozen=True, kw_only=True)
class Isolation:
    """`isolation`: how the worker isolates its tasks (agent/sandbox/bwrap.py), listed as the worker's `isolation`."""

    CLOSED = True  # a key the server does not know is refused

    sandbox: str | None = declare(None, max_bytes=512, help='`"bwrap"` or `"none"`')
    user: str | None = declare(None, max_bytes=512, help="the user tasks run as")
    root_tasks: bool | None = declare(None, help="tasks may run as root (`--allow-root-tasks`)")
    limits: str | None = declare(None, max_bytes=512, help="why tasks' memory and CPUs are not capped (null: capped)")
    warning: str | None = declare(None, max_bytes=512, help="what is weaker than it should be")


@dataclass(frozen=True, kw_only=True)
class RelayOffer:
    """`relay`: what the worker's relay link serves (docs/protocol.md, "The relay")."""

    version: int = declare(1, minimum=1, maximum=1 << 31, help="the relay protocol's version")
    kinds: list[str] = declare([], help='the stream kinds it serves (`"exec"`, `"shell"`, `"tcp"`, `"ssh"`)')
    no_exec: bool = declare(False, help="`--no-exec`: it refuses the kinds that run a command")


@dataclass(frozen=True, kw_only=True)
class Register:
    """POST /v1/workers/register (join token): the worker, as the agent describes itself."""

    name: str = declare(max_bytes=256, help="the worker's name (the agent's `--name`, else its host name)")
    labels: dict[str, str] = declare({}, help="{str: str}: what a job's `labels` must all find here")
    resources: dict[str, Any] = declare({}, of=Resources, help="what it offers")
    version: str = declare("unknown", max_bytes=64, help="the agent's version")
    slots: int = declare(1, minimum=1, maximum=1024, help="tasks at once (the agent's `--parallel`)")
    isolation: dict[str, Any] | None = declare(None, of=Isolation, help="how it isolates tasks")
    relay: dict[str, Any] | None = declare(
        None, omit=True, of=RelayOffer,
        help="the stream kinds its relay link serves; absent from agents before the relay, which the relay then "
             "refuses at once (additive: an older control plane ignores it)")
    gpus: list[dict[str, Any]] | None = declare(
        None, omit=True, of=GpuReport, max_items=MAX_WORKER_GPUS,
        help="per-GPU health, as in the heartbeat, so that no task is placed on a GPU already broken (null: no NVML)")
    gpu_topology: list[dict[str, Any]] | None = declare(
        None, omit=True, of=GpuTopology, max_items=MAX_WORKER_GPUS,
        help="how its GPUs are wired (NVLink, PCIe switch, NUMA node), so that a multi-GPU task gets GPUs of one "
             "NVLink set (docs/workers.md, \"Topology\"; null: NVML could not tell; additive: an older control "
             "plane ignores it)")
    advertise_address: str | None = declare(
        None, omit=True, max_bytes=256,
        help="the address other workers reach it at (a gang's rendezvous); absent or empty: the one the control "
             "plane sees")
