"""What a task runner holds: the context every runner of a worker shares, and one runner's own state.

`runner.TaskRunner` is built in layers, each a class on the one below: TaskState (here) < reports.TaskReports
< launch.TaskLaunch < runner.TaskRunner.
"""
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from gpulayer.protocol.assignment import Assignment
from gpulayer.protocol.finish import FinishItem

from ..artifacts.cache import ArtifactCache
from ..artifacts.caps import UnpackBudget
from ..artifacts.checkpoint import DIR_NAME as CHECKPOINT_DIR, Checkpointer, DigestMemo
from ..errors import AgentError
from ..link.logship import LogShipper
from ..link.transport import Transport
from ..sandbox.bwrap import Sandbox
from ..sandbox.images import ImageCache, Prepared
from ..sandbox.leftovers import RunningTasks
from ..sandbox.process import KILL_GRACE_S
from ..sandbox.shared import Holder, SharedSandboxes
from ..sandbox.spares import Spares
from .place import Place
from .rendezvous import RENDEZVOUS_TIMEOUT_S
from .supervision import TaskHandle


@dataclass
class TaskContext:
    """What every task runner of one worker shares."""

    transport: Transport
    cache: ArtifactCache
    tasks_dir: Path
    advertise_address: str
    base_env: dict[str, str]
    device_ids: list[str]
    python: str | None = None
    kill_grace_s: float = KILL_GRACE_S
    rendezvous_timeout_s: float = RENDEZVOUS_TIMEOUT_S
    keep_task_dirs: bool = False
    fatal: list[AgentError] = field(default_factory=list)
    #: Where running process groups are recorded, for the next agent to kill if this one is killed.
    running: RunningTasks | None = None
    #: Whether a finish should ask for the freed slot's next task (``next``), and who launches it.
    want_next: Callable[[], bool] = lambda: False
    #: Called with each assignment and when the request that brought it was sent (monotonic).
    hand_over: Callable[[Assignment, float], None] | None = None
    #: How many assignments a finish with ``next`` may bring back (``max_tasks``): the worker's free slots.
    next_max: Callable[[], int] = lambda: 1
    #: The caps on what one task's bundle and inputs write (each task gets a fresh copy).
    unpack_caps: UnpackBudget = field(default_factory=UnpackBudget)
    #: How tasks are isolated (agent/sandbox/bwrap.py; mode none: as the agent, unconfined).
    sandbox: Sandbox = field(default_factory=Sandbox)
    #: Each GPU index's /dev/nvidia<N> number, for the sandbox's device nodes.
    gpu_minors: list[int] = field(default_factory=list)
    #: What the worker's GPU sharing adds to a fractional task's environment (agent/gpu/sharing.py's
    #: GpuSharing.environment; the session makes it).
    gpu_share_env: Callable[[Assignment], dict[str, str]] = lambda _assignment: {}
    #: --pin-cpus: the CPUs a task's processes run on (task id, its GPUs, its `cpus`; agent/gpu/pinning.py's
    #: CpuPins.take), None: unpinned; and the release when the task ends.
    pin_cpus: Callable[[int, list[int], float], frozenset[int] | None] = lambda _task, _gpus, _cpus: None
    unpin_cpus: Callable[[int], None] = lambda _task: None
    #: The unpacked OCI images of image jobs (agent/sandbox/images.py); None: made from the cache on first use.
    images: ImageCache | None = None
    #: One sandbox per job for its array elements (agent/sandbox/shared.py); None: each task its own bwrap.
    shared: SharedSandboxes | None = None
    #: Sandboxes made ahead for plain tasks (agent/sandbox/spares.py); None: each makes its own bwrap when it starts.
    spares: Spares | None = None
    #: Where finishes go to be sent in batches (agent/run/chunks.py: finish-many); None: each sent alone, here.
    finish_later: Callable[[FinishItem, dict], None] | None = None
    #: Digests of checkpoint files already read (agent/artifacts/checkpoint.py), shared by the worker's tasks.
    checkpoint_digests: DigestMemo = field(default_factory=DigestMemo)
    #: Removes an ended task's working dir off its slot's path (reports.DirSweeper.remove); None: at once, here.
    remove_later: Callable[[Path], None] | None = None


class TaskState:
    """One assignment's runner state, from assignment to finish."""

    def __init__(self, assignment: Assignment, ctx: TaskContext, handle: TaskHandle):
        self.assignment = assignment
        self.ctx = ctx
        self.handle = handle
        self.task_id = assignment.task_id
        #: What the running process got on top of the task's environment (PORT, MASTER_*): exec gets it too.
        self.extra_env: dict[str, str] = {}
        #: Where the task starts (agent/run/place.py), chosen once when its directory is made (TaskLaunch._prepare_dir).
        self.place: Place | None = None
        self.weights: str | None = None
        #: --pin-cpus: the CPUs its processes run on, once chosen (None: unpinned)
        self.cpus: frozenset[int] | None = None
        #: The image an image job runs in, once fetched and unpacked (held until the task ends).
        self.image: Prepared | None = None
        #: An image job's GPU driver files: bwrap mounts and the environment that finds them (agent/sandbox/cdi.py).
        self.driver: tuple[list[str], dict[str, str]] | None = None
        self.started = False
        self.pid_reported = False
        #: The pid of a process that ended before its start was sent: the finish carries the start.
        self.start_pid: int | None = None
        self.assigned = True
        self.shipper = LogShipper(self._send_logs, first_n=assignment.log_base)
        self.run_s: float | None = None
        #: The task's GPULAYER_CHECKPOINT_DIR (agent/artifacts/checkpoint.py), and the attempt it was restored from.
        self.checkpoint = self._checkpointer()
        self.restored_from: int | None = None

    @property
    def workdir(self) -> Path:
        """The task's working directory: its place's (before it is placed, where a task of its own would have it)."""
        if self.place is not None:
            return self.place.workdir
        return self.ctx.tasks_dir / f"{self.task_id}-{self.assignment.attempt}"

    @property
    def holder(self) -> Holder | None:
        """The job's shared sandbox this task runs in (agent/sandbox/shared.py), if its place is one."""
        return self.place.holder if self.place is not None else None

    def _checkpointer(self) -> Checkpointer:
        ctx = self.ctx
        return Checkpointer(self.workdir / CHECKPOINT_DIR, ctx.transport, ctx.cache, ctx.checkpoint_digests,
                            self.shipper.system)

    def _send_logs(self, lines: list[dict]) -> None:
        self.ctx.transport.request("POST", f"/worker/tasks/{self.task_id}/logs", {"lines": lines})

