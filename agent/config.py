"""A worker agent's settings (`WorkerConfig`: the flags of `gpulayer worker start`, `gpulayer join`, `python -m agent`),
and what they resolve to: the tasks' interpreter and sandbox."""

import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .artifacts.cache import default_cache_dir
from .errors import AgentError
from .gpu.inventory import GpuProbe
from .run.rendezvous import RENDEZVOUS_TIMEOUT_S
from .sandbox.bwrap import DEFAULT_MODE as DEFAULT_SANDBOX, Sandbox
from .sandbox.bwrap import resolve as resolve_sandbox
from .sandbox.process import KILL_GRACE_S

ACQUIRE_WAIT_S = 20.0


@dataclass
class WorkerConfig:
    """Settings of one worker agent (the CLI flags of ``gpulayer worker start``)."""

    url: str
    join_token: str
    name: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    python: str | None = None
    advertise_address: str | None = None
    parallel: int = 1
    cpus: float | None = None
    gpus: int | None = None
    ram_mb: int | None = None
    #: --gpu-sharing off|mps|time-slice: fractional tasks on one GPU (agent/gpu/sharing.py)
    gpu_sharing: str = "off"
    #: --pin-cpus: each task's processes run on the CPUs local to its GPUs (agent/gpu/pinning.py)
    pin_cpus: bool = False
    max_idle_s: float = 0
    #: On a stop, take no new task and let running ones finish for up to this long before stopping them.
    drain_timeout_s: float = 0
    state_dir: str = "~/.gpulayer/worker"
    ca_file: str | None = None
    ca_fingerprint: str | None = None
    insecure: bool = False
    artifact_cache: str | None = None
    artifact_cache_bytes: int | None = None
    # Below: tuning knobs with safe defaults (tests shorten them).
    kill_grace_s: float = KILL_GRACE_S
    acquire_wait_s: float = ACQUIRE_WAIT_S
    rendezvous_timeout_s: float = RENDEZVOUS_TIMEOUT_S
    keep_task_dirs: bool = False
    gpu_probe: GpuProbe | None = None  # tests: devices without NVML (no health watch)
    #: --sandbox auto|bwrap|none, --run-as USER, --allow-root-tasks (agent/sandbox/bwrap.py).
    sandbox: str = DEFAULT_SANDBOX
    run_as: str | None = None
    allow_root_tasks: bool = False
    #: --sandbox-bind HOST[:TASK][:ro], repeatable: host paths bound into every sandboxed task.
    sandbox_binds: list[str] = field(default_factory=list)
    #: More paths tasks must not see (the CLI's home, the token file), beside the state dir and $GPULAYER_HOME.
    hidden_paths: list[str] = field(default_factory=list)
    #: --no-exec: the relay runs no command in a task (exec, shell, ssh); port-forward and ingress still work.
    no_exec: bool = False


def interpreter(python: str | None) -> str | None:
    """``--python`` as an absolute path (a bare name is looked up on PATH)."""
    if not python:
        return None
    if os.sep not in python:
        found = shutil.which(python)
        if found is None:
            raise AgentError(f"--python {python}: no such interpreter on PATH")
        python = found
    return os.path.abspath(os.path.expanduser(python))


def task_sandbox(config: WorkerConfig, state_dir: Path) -> Sandbox:
    """The sandbox tasks run in (SandboxError when --sandbox bwrap cannot work here)."""
    home = os.environ.get("GPULAYER_HOME")
    hidden = [str(state_dir), os.path.expanduser("~/.gpulayer"), *([home] if home else []),
              config.artifact_cache or default_cache_dir(), *config.hidden_paths]
    interpreters = [sys.base_prefix, sys.prefix]
    if config.python:
        interpreters.append(os.path.dirname(os.path.dirname(interpreter(config.python) or "")))
    return resolve_sandbox(config.sandbox, run_as=config.run_as, allow_root_tasks=config.allow_root_tasks,
                           hidden=[os.path.abspath(os.path.expanduser(str(p))) for p in hidden],
                           shown=[os.path.abspath(p) for p in interpreters if p], binds=config.sandbox_binds)
