"""Where a task's process starts, chosen once: its `Place` (the way it starts, its directory, what it holds).

A task starts in one of these ways:

- ``unsandboxed``: the worker runs tasks without a sandbox (``--sandbox none``): the command as it is;
- ``bwrap``: a bubblewrap sandbox of its own, started with the command (agent/sandbox/bwrap.py);
- ``spare``: a sandbox made ahead (agent/sandbox/spares.py), where only the command starts;
- ``launcher``: its job's shared sandbox (agent/sandbox/shared.py), the command forked there by the job's
  launcher (agent/sandbox/launcher.py), or entered by nsenter when the launcher cannot take it;
- ``nsenter``: its job's shared sandbox, entered by nsenter (the worker's shared sandboxes have no launcher);
- ``image``: a bubblewrap sandbox with the job's OCI image as its root (agent/sandbox/imagerun.py).

`place()` chooses when the task's directory is made, holding its job's shared sandbox or taking a spare;
`unplace()` gives them back when the task ends. The launch (agent/run/launch.py) reads the choice, nothing else.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gpulayer.protocol.assignment import Assignment

from ..sandbox.bwrap import Sandbox
from ..sandbox.shared import Holder, SharedSandboxes
from ..sandbox.spares import Spare, Spares

Way = Literal["unsandboxed", "bwrap", "spare", "launcher", "nsenter", "image"]


@dataclass(frozen=True)
class Place:
    """How one task's process starts and what that needs; made by `place()`, once."""

    way: Way
    #: The task's working directory on the host: in its job's directory, a spare's box, or the worker's tasks dir.
    workdir: Path
    #: Whether the task has the worker's network (`network` is not none).
    network: bool
    #: ``launcher`` and ``nsenter``: the job's shared sandbox, held until the task ends.
    holder: Holder | None = None
    #: ``spare``: the sandbox made ahead the task runs in, given back when it ends.
    spare: Spare | None = None

    @property
    def own_sandbox(self) -> bool:
        """Whether the task's process is a sandbox of its own (bwrap's, a spare's, an image's), which ends with it."""
        return self.way in ("bwrap", "spare", "image")


def place(task: Assignment, sandbox: Sandbox, tasks_dir: Path, shared: SharedSandboxes | None,
          spares: Spares | None) -> Place:
    """Where ``task`` starts: an image's root, no sandbox, its job's shared sandbox (held here), a spare (taken
    here, when one is ready) or a bwrap of its own."""
    name = f"{task.task_id}-{task.attempt}"
    network = task.network != "none"
    if task.image is not None:  # a worker without a sandbox refuses it (TaskLaunch._prepare_image)
        return Place("image", tasks_dir / name, network)
    if shared is not None and _shareable(task, sandbox):  # the job's directory stays while this element holds it
        holder = shared.hold(task.job_id, network)
        return Place("launcher" if shared.python else "nsenter", holder.job_dir / name, network, holder=holder)
    if spares is not None and _fits_a_spare(task, sandbox):
        spare = spares.take(network)
        if spare is not None:  # its working dir is made in the sandbox's box, which is bound there
            return Place("spare", spare.box / name, network, spare=spare)
    return Place("unsandboxed" if sandbox.mode == "none" else "bwrap", tasks_dir / name, network)


def unplace(where: Place, shared: SharedSandboxes | None, spares: Spares | None) -> None:
    """Give back what the place holds: the job's shared sandbox, or the spare."""
    if where.holder is not None and shared is not None:
        shared.release(where.holder)
    if where.spare is not None and spares is not None:
        spares.done(where.spare)


def _shareable(task: Assignment, sandbox: Sandbox) -> bool:
    """Whether an assignment runs in its job's shared sandbox: an array element of a plain command (no image,
    GPUs, service or gang) on a worker whose sandbox shares (Sandbox.shares: a root agent, nsenter)."""
    return (task.array_index is not None and task.image is None and not task.gpus and task.service is None
            and task.world_size == 1 and sandbox.shares(task.run_as_root))


def _fits_a_spare(task: Assignment, sandbox: Sandbox) -> bool:
    """Whether a task may run in a sandbox made ahead (agent/sandbox/spares.py): a plain command of its own, started
    once (no image, GPUs, gang or service, whose restarts start it again; no user but the task user) on a root agent's
    sandbox."""
    return (task.image is None and not task.gpus and task.service is None and task.world_size == 1
            and sandbox.shares(task.run_as_root))
