"""What a worker holds through its session: its events, its tasks' handles and threads, the control plane's terms.

`session.Worker` is built in layers, each a class on the one below: WorkerState (here) < registration.Registration
< heartbeat.Heartbeat < session.Worker (the acquire loop, the task runners, stopping).
"""

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .config import WorkerConfig
from .errors import AgentError
from .events import log_event
from .gpu.health import GpuHealth
from .gpu.inventory import Inventory
from .gpu.nvml import Nvml
from .gpu.sharing import GpuSharing
from .gpu.stats import GpuStats
from .link.transport import Transport
from .relay.link import Relay
from .run.chunks import Chunks
from .run.state import TaskContext
from .run.supervision import TaskHandle
from .sandbox.bwrap import Sandbox


@dataclass(frozen=True)
class Session:
    """What a worker has once the control plane registered it: the heartbeat, the acquire loop and the
    task runners work with it."""

    transport: Transport          # carries the session token (registering again sets the new one)
    inventory: Inventory          # what it offered when it registered, offered again by a rejoin
    ctx: TaskContext              # what every task runner shares
    new_transport: Callable[[], Transport]  # another connection to the same control plane (a rejoin's)


class WorkerState:
    """One worker session's state, and the few questions every part of it asks."""

    def __init__(self, config: WorkerConfig, stop_event: threading.Event):
        self.config = config
        self.stop_event = stop_event
        self.stopping = threading.Event()
        self.hurry = threading.Event()  # a second stop signal: no drain
        self.slot_freed = threading.Event()
        self.heartbeat_stop = threading.Event()
        self.beat_now = threading.Event()  # an endpoint changed: heartbeat at once
        self.handles: dict[int, TaskHandle] = {}
        self.threads: dict[int, threading.Thread] = {}
        #: When each recent task's runner ended (monotonic): an answer to a request sent before that
        #: carries a stale assignment of it (made before its finish), not one to run again.
        self.ended: dict[int, float] = {}
        #: Tasks whose runner ended and whose finish waits in `chunks` unanswered: the control plane still
        #: sees them assigned, so an acquire answered meanwhile may carry them again (stale, whenever asked).
        self.unanswered: set[int] = set()
        self.lock = threading.Lock()
        self.idle_since = time.monotonic()
        self.fatal: list[AgentError] = []
        self.interval_s = 2.0
        # The control plane renews the leases on any worker request (`requests_renew_lease`): an idle worker
        # whose acquire is parked, or that was answered within the interval, skips its heartbeat.
        self.requests_renew = False
        self.acquiring = False  # an acquire is in flight (parked on the server)
        self.rejoin_lock = threading.Lock()
        self.rejoined_at = 0.0
        self.gpu_health: GpuHealth | None = None  # where NVML answers and the worker has GPUs
        self.gpu_stats: GpuStats | None = None    # the same: their utilization and memory (heartbeat `gpu_samples`)
        self.gpu_sharing: GpuSharing | None = None  # fractional tasks' variables; time-slicing's memory watch
        self.nvml: Nvml | None = None             # NVML while the session holds it open
        self.sandbox = Sandbox()  # resolved at run(), before register
        self._session: Session | None = None
        #: Elements leased ahead and finishes sent in batches (agent/run/chunks.py), once registered.
        self.chunks: Chunks | None = None
        self.start_lock = threading.Lock()  # one thread at a time starts queued elements
        self.relay: Relay | None = None  # the relay link, once run() made it (agent/relay/link.py)
        self._opened = contextlib.ExitStack()  # what close() releases: the HTTP session, the GPU watch, NVML

    @property
    def session(self) -> Session:
        """The registered worker's session; raises RuntimeError before it registered."""
        if self._session is None:
            raise RuntimeError("the worker has not registered yet")
        return self._session

    def _handle_of(self, task_id: int) -> TaskHandle | None:
        with self.lock:
            return self.handles.get(task_id)

    def _free_slots(self) -> int:
        """How many more tasks this worker may run now (``--parallel`` less those it holds)."""
        with self.lock:
            return max(0, max(1, int(self.config.parallel)) - len(self.handles))

    def _running_ids(self) -> list[int]:
        with self.lock:
            return list(self.handles)

    def _fail(self, error: AgentError) -> None:
        if not self.fatal:
            log_event("worker_fatal", reason=str(error))
        self.fatal.append(error)
