"""A worker's session with the control plane: register, heartbeat, acquire and run tasks, drain, deregister.

`Worker.run()` registers, then runs two threads, the heartbeat and the acquire
loop, plus one thread per running task, until the caller's thread (worker.py's
`run_worker`) sees a stop, a fatal error or the idle limit; then it stops.
"""

import contextlib
import logging
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpulayer.protocol.assignment import Assignment

from . import __version__
from .addresses import local_address_towards
from .backoff import retry_delay
from .cache import ArtifactCache, default_cache_bytes, default_cache_dir
from .images import ImageCache
from .caps import UnpackBudget
from .chunks import Chunks, leased_ahead
from .config import WorkerConfig, interpreter, task_sandbox
from .environment import filtered_environ
from .errors import AgentError, Forbidden, Rejected, Revoked, Unauthorized, Unreachable
from .events import log_event
from .gpu_health import GpuHealth
from .gpu_stats import GpuStats
from .inventory import Inventory, detect, nvml_devices
from .leftovers import RunningTasks
from .nvml import Nvml
from .sandbox import Sandbox, gpu_minors
from .shared import SharedSandboxes
from .spares import Spares
from . import relay_exec, relay_shell, relay_ssh, relay_tcp
from .relay import Handler, Relay
from .supervision import TaskHandle
from .tasks import SHUTDOWN_REPORT_S, TaskContext, TaskRunner, acquired
from .tls import resolve_verify
from .transport import Transport, check_url

#: How long a task that ended is remembered, against stale assignments of it (longer than any request waits).
ENDED_KEPT_S = 600.0
REJOIN_MIN_S = 5.0  # a session refused again this soon after registering again is not retried


@dataclass(frozen=True)
class Session:
    """What a worker has once the control plane registered it: the heartbeat, the acquire loop and the
    task runners work with it."""

    transport: Transport          # carries the session token (registering again sets the new one)
    inventory: Inventory          # what it offered when it registered, offered again by a rejoin
    ctx: TaskContext              # what every task runner shares
    new_transport: Callable[[], Transport]  # another connection to the same control plane (a rejoin's)


class Worker:
    """One registered worker session and its tasks."""

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
        self.sandbox = Sandbox()  # resolved at run(), before register
        self._session: Session | None = None
        #: Elements leased ahead and finishes sent in batches (agent/chunks.py), once registered.
        self.chunks: Chunks | None = None
        self.start_lock = threading.Lock()  # one thread at a time starts queued elements
        self.relay: Relay | None = None  # the relay link, once run() made it (agent/relay.py)
        self._opened = contextlib.ExitStack()  # what close() releases: the HTTP session, the GPU watch, NVML

    @property
    def session(self) -> Session:
        """The registered worker's session; raises RuntimeError before it registered."""
        if self._session is None:
            raise RuntimeError("the worker has not registered yet")
        return self._session

    # -- setup -------------------------------------------------------------
    def run(self) -> int:
        """Register, serve until stopped, shut down; returns the exit code."""
        config = self.config
        base_url = check_url(config.url, config.insecure)
        unpack_caps = UnpackBudget.from_environment()  # a malformed cap stops the worker before it registers
        state_dir = Path(os.path.expanduser(config.state_dir))
        state_dir.mkdir(parents=True, exist_ok=True)
        verify = resolve_verify(base_url, config.ca_file, config.ca_fingerprint, str(state_dir))
        self._kill_leftovers(state_dir)
        self.sandbox = task_sandbox(self.config, state_dir)
        transport = Transport(base_url, verify)
        self._opened.callback(transport.close)
        cache = ArtifactCache(  # a folder someone else made first (or may write) stops the worker here
            config.artifact_cache or default_cache_dir(),
            config.artifact_cache_bytes if config.artifact_cache_bytes is not None else default_cache_bytes(),
            transport.download_artifact,
        )
        self.relay = self._relay(base_url, verify, transport)
        inventory = self._inventory()
        answer = self._register(transport, inventory)
        if answer is None:
            return 0
        ctx = self._task_context(transport, cache, answer, inventory, state_dir, unpack_caps)
        self._session = Session(transport, inventory, ctx, new_transport=lambda: Transport(base_url, verify))
        self.chunks = Chunks(transport, slots=int(config.parallel), free_slots=self._free_slots,
                             want_next=lambda: not self.stopping.is_set(), running_ids=self._running_ids,
                             hand_over=self._handed_over, queued_more=self._start_queued, fatal=self._fail,
                             answered_ids=self._finishes_answered)
        ctx.finish_later = self._finish_later
        threads = [
            threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True),
            threading.Thread(target=self._acquire_loop, name="acquire", daemon=True),
        ]
        for thread in threads:
            thread.start()
        code = self._serve()
        self._shutdown(threads[0])
        if self.fatal:
            raise self.fatal[0]
        return code

    def _relay(self, base_url: str, verify: bool | str, transport: Transport) -> Relay | None:
        """The relay link (agent/relay.py), opened when the control plane asks; None under GPULAYER_AGENT_RELAY=off
        (an agent as before the relay: tests of older agents)."""
        if os.environ.get("GPULAYER_AGENT_RELAY") == "off":
            return None
        token = lambda: (transport.headers.get("Authorization") or "").removeprefix("Bearer ")  # noqa: E731
        handlers: dict[str, Handler] = {"exec": self._exec, "shell": self._shell, "tcp": self._tcp}
        if relay_ssh.available():  # asyncssh (a base dependency) is importable: ssh streams
            handlers["ssh"] = self._ssh
        return Relay(base_url, verify, token, handlers, self.stop_event, no_exec=self.config.no_exec)

    def _exec(self, stream, fields: dict) -> None:
        relay_exec.serve(stream, fields, self._handle_of)

    def _shell(self, stream, fields: dict) -> None:
        relay_shell.serve(stream, fields, self._handle_of)

    def _tcp(self, stream, fields: dict) -> None:
        relay_tcp.serve(stream, fields, self._handle_of)

    def _ssh(self, stream, fields: dict) -> None:
        relay_ssh.serve(stream, fields, self._handle_of)

    def _handle_of(self, task_id: int) -> TaskHandle | None:
        with self.lock:
            return self.handles.get(task_id)

    def _inventory(self) -> Inventory:
        """Detect what this worker offers, and where NVML answers, start watching its GPUs' health
        (with --gpus N too: the count is the operator's, the devices' health NVML's)."""
        config = self.config
        if config.gpu_probe is not None:
            return detect(probe=config.gpu_probe, cpus=config.cpus, gpus=config.gpus, ram_mb=config.ram_mb)
        nvml = Nvml.open() if config.gpus != 0 else None
        if nvml is not None:
            self._opened.callback(nvml.close)
        inventory = detect(probe=nvml.devices if nvml else lambda: [], cpus=config.cpus, gpus=config.gpus,
                           ram_mb=config.ram_mb)
        if nvml is not None and config.gpus is not None:  # detect left NVML's devices out: map them here
            inventory.nvml_devices = nvml_devices(inventory.device_ids, nvml.devices())
        if nvml is not None and inventory.nvml_devices:
            self.gpu_health = GpuHealth(nvml, inventory.nvml_devices, on_change=self.beat_now.set)
            self.gpu_health.start()
            self._opened.callback(self.gpu_health.stop)  # before NVML closes
            self.gpu_stats = GpuStats(nvml, inventory.nvml_devices, lambda: self.interval_s)
            self.gpu_stats.start()
            self._opened.callback(self.gpu_stats.stop)
        return inventory

    def _kill_leftovers(self, state_dir: Path) -> None:
        """Kill the tasks a killed agent on this state dir left running (the control plane lost them)."""
        for name, pgid in RunningTasks(state_dir).reap():
            log_event("leftover_task_killed", task=name, pgid=pgid)
            if not self.config.keep_task_dirs:
                shutil.rmtree(state_dir / "tasks" / name, ignore_errors=True)

    def _register(self, transport: Transport, inventory: Inventory, joiner: Transport | None = None) -> dict | None:
        """POST register (through `joiner` where given), retried while unreachable; `transport` then carries the
        session token. None if stopped before it answered."""
        config = self.config
        body = {
            "name": config.name or socket.gethostname(),
            "labels": dict(config.labels),
            "resources": inventory.resources(),
            "version": __version__,
            "slots": max(1, int(config.parallel)),
            "isolation": self.sandbox.isolation(),
        }
        if self.relay is not None:  # additive: an older control plane ignores it
            body["relay"] = self.relay.register_field()
        if self.gpu_health is not None:  # so that no task is placed on a GPU already broken
            body["gpus"] = self.gpu_health.report()
        advertise = config.advertise_address or local_address_towards(config.url)
        if advertise:  # else the control plane takes the address it sees
            body["advertise_address"] = advertise
        via = joiner or transport
        via.set_token(config.join_token)
        failures = 0
        while not self.stop_event.is_set():
            try:
                answer = via.request("POST", "/workers/register", body)
                break
            except Unreachable as exc:
                failures += 1
                log_event("register_retry", failures=failures, error=str(exc))
                self.stop_event.wait(retry_delay(failures))
            except Unauthorized:
                raise AgentError("the control plane refused the join token (401 unauthorized): check $GPULAYER_JOIN_TOKEN") from None
            except Forbidden as exc:
                if exc.code == "forbidden":  # a valid token of the wrong kind
                    raise AgentError("the control plane refused this token for registering (403 forbidden): use a join token (glj_...)") from None
                raise AgentError(f"the control plane refused to register this worker: {exc.code}: {exc.message}") from None
            except Rejected as exc:
                raise AgentError(f"the control plane refused to register this worker: {exc.code}: {exc.message}") from None
        else:
            return None
        transport.set_token(answer["session_token"])
        self.interval_s = float(answer.get("heartbeat_interval_s") or 2.0)
        self.requests_renew = answer.get("requests_renew_lease") is True
        log_event("worker_registered", worker_id=answer.get("worker_id"), name=answer.get("name") or body["name"],
                  labels=answer.get("labels", body["labels"]), slots=body["slots"],
                  advertise_address=answer.get("advertise_address"), heartbeat_interval_s=self.interval_s)
        for warning in answer.get("warnings") or []:
            log_event("register_warning", level=logging.WARNING, message=warning)
        return answer

    def _task_context(self, transport: Transport, cache: ArtifactCache, answer: dict, inventory: Inventory,
                      state_dir: Path, unpack_caps: UnpackBudget) -> TaskContext:
        config = self.config
        advertise = answer.get("advertise_address") or config.advertise_address or socket.gethostname()
        shared = spares = None
        if self.sandbox.shares(False):  # an array's elements share their job's sandbox (agent/shared.py)
            shared = SharedSandboxes(self.sandbox, state_dir / "tasks", RunningTasks(state_dir),
                                     keep_dirs=config.keep_task_dirs)
            self._opened.callback(shared.close)
            spares = Spares(self.sandbox, state_dir / "tasks", RunningTasks(state_dir), most=int(config.parallel),
                            keep_dirs=config.keep_task_dirs)
            self._opened.callback(spares.close)
        return TaskContext(
            transport=transport,
            cache=cache,
            tasks_dir=state_dir / "tasks",
            advertise_address=advertise,
            base_env=filtered_environ(),
            device_ids=inventory.device_ids,
            python=interpreter(config.python),
            kill_grace_s=config.kill_grace_s,
            rendezvous_timeout_s=config.rendezvous_timeout_s,
            keep_task_dirs=config.keep_task_dirs,
            fatal=self.fatal,
            running=RunningTasks(state_dir),
            want_next=lambda: not self.stopping.is_set(),
            hand_over=self._handed_over,
            next_max=lambda: self._free_slots() + 1,  # the finishing task still holds its slot here
            unpack_caps=unpack_caps,
            sandbox=self.sandbox,
            gpu_minors=gpu_minors(inventory.device_ids, inventory.nvml_devices),
            images=ImageCache(cache),
            shared=shared,
            spares=spares,
        )

    # -- the three loops ---------------------------------------------------
    def _serve(self) -> int:
        """Wait for a stop, a fatal error or the idle limit; returns the exit code."""
        while not self.stop_event.wait(0.2):
            if self.fatal:
                return self.fatal[0].exit_code
            if self._idle_too_long():
                log_event("worker_idle_exit", idle_s=self.config.max_idle_s)
                return 0
        log_event("worker_stopping", reason="stop requested")
        return 0

    def _idle_too_long(self) -> bool:
        with self.lock:
            busy = bool(self.handles)
        limit = self.config.max_idle_s
        return bool(limit) and limit > 0 and not busy and time.monotonic() - self.idle_since >= limit

    def _heartbeat_loop(self) -> None:
        transport = self.session.transport
        failures = 0
        urgent = True  # the first beat, and one a changed endpoint or a refused request asked for
        while not self.heartbeat_stop.is_set():
            with self.lock:
                entries = [handle.heartbeat_entry() for handle in self.handles.values()]
            if self.chunks is not None:  # ended, finish not answered yet: still held here
                known = {e["task_id"] for e in entries}
                entries += [e for e in self.chunks.heartbeat_entries() if e["task_id"] not in known]
            sent_with = transport.headers.get("Authorization")
            body: dict = {"tasks": entries}
            if self.gpu_health is not None:
                self.gpu_health.check()
                body["gpus"] = self.gpu_health.report()
            samples = self.gpu_stats.take() if self.gpu_stats is not None else []
            if samples:  # additive: an older control plane ignores it
                body["gpu_samples"] = samples
            if not urgent and not failures and self._beat_needless(body):
                urgent = self._heartbeat_pause(self.interval_s)
                continue
            try:
                answer = transport.request("POST", "/worker/heartbeat", body)
                failures = 0
                if self.gpu_health is not None:  # the resets it echoed were heard (before this answer's own)
                    self.gpu_health.echoed(body["gpus"])
                if self.gpu_stats is not None:
                    self.gpu_stats.sent(samples)
                self._on_heartbeat(answer)
            except Unreachable as exc:
                failures += 1
                if failures == 1 or failures % 10 == 0:
                    log_event("heartbeat_failed", failures=failures, error=str(exc))
                urgent = self._heartbeat_pause(min(self.interval_s, retry_delay(failures)))
                continue
            except Unauthorized:
                if self._rejoin(sent_with):
                    continue
                self._fail(Revoked("the control plane no longer accepts this worker's session (401): it was revoked or expired"))
            except AgentError as exc:
                self._fail(exc)
            except Rejected as exc:
                log_event("heartbeat_rejected", error=str(exc))
                if self.gpu_stats is not None:  # never the reason twice: the next beat goes without these
                    self.gpu_stats.sent(samples)
            urgent = self._heartbeat_pause(self.interval_s)

    def _heartbeat_pause(self, seconds: float) -> bool:
        """Wait until the next heartbeat is due, or until a task's endpoint changed (or stop); True for the latter."""
        if self.beat_now.wait(seconds):
            self.beat_now.clear()
            return True
        return False

    def _beat_needless(self, body: dict) -> bool:
        """True when this heartbeat would tell nothing and renew nothing another request did not.

        Only when the control plane said any request renews the leases; only while
        the worker runs no task (a heartbeat answer is how cancels and preemptions reach
        it within an interval) and its GPUs report healthy with no reset to echo (a
        reset is told in heartbeat answers); and only while its acquire is parked
        there (asked to park at most one interval: `_acquire_wait_s`, renewed when it
        arrives and when it answers) or another request was answered within the interval.
        """
        if not self.requests_renew or body["tasks"]:
            return False
        if any(not g.get("healthy", True) or g.get("reset_applied") for g in body.get("gpus") or []):
            return False
        if self.gpu_stats is not None and self.gpu_stats.due():  # GPU samples go at least every SEND_EVERY intervals
            return False
        return self.acquiring or time.monotonic() - self.session.transport.answered_at < self.interval_s

    def _rejoin(self, refused: str | None) -> bool:
        """Register again after a heartbeat's 401 (which a revoked worker never gets: it hears `revoked`).

        A control plane restored from a replica may have lost this worker's
        registration (made in the window the replica had not caught). The join
        token registers it again; running tasks carry on and the next heartbeat
        reports them (the control plane adopts those it has queued). False when
        the join token is refused too, or when this session was just made.
        """
        session = self.session
        with self.rejoin_lock:
            if session.transport.headers.get("Authorization") != refused:
                return True  # registered again meanwhile
            if not self.config.join_token or time.monotonic() - self.rejoined_at < REJOIN_MIN_S:
                return False
            self.rejoined_at = time.monotonic()
            log_event("worker_rejoining", reason="the control plane does not know this session (401)")
            joiner = session.new_transport()  # tasks keep sending with the session token meanwhile
            try:
                return self._register(session.transport, session.inventory, joiner) is not None
            except AgentError as exc:
                log_event("worker_rejoin_refused", error=str(exc))
                return False
            finally:
                joiner.close()

    def _on_heartbeat(self, answer: dict) -> None:
        interval = answer.get("heartbeat_interval_s")
        if isinstance(interval, (int, float)) and not isinstance(interval, bool) and 0 < interval != self.interval_s:
            log_event("heartbeat_interval_changed", before=self.interval_s, after=float(interval))
            self.interval_s = float(interval)
        if "requests_renew_lease" in answer:
            self.requests_renew = answer["requests_renew_lease"] is True
        preempted = {int(t) for t in answer.get("preempted_task_ids") or []}
        requeued = {int(t) for t in answer.get("requeued_task_ids") or []}
        grace_s = answer.get("preempt_grace_s")
        for task_id in answer.get("cancel_task_ids") or []:
            with self.lock:
                handle = self.handles.get(int(task_id))
            if handle is not None and not handle.cancelled:
                if self.chunks is not None and handle.assignment:  # its job's elements queued here go back
                    self.chunks.give_back(handle.assignment["job_id"])
                if int(task_id) in preempted:  # stopped to make room: its grace is the control plane's
                    log_event("task_preempted", task_id=task_id, grace_s=grace_s)
                    handle.cancel("preempted to make room for higher-priority work",
                                  grace_s=float(grace_s) if isinstance(grace_s, (int, float)) else None,
                                  why="preempted")
                    continue
                if int(task_id) in requeued:  # stopped to run again (`job requeue`): its log says so
                    log_event("task_requeue_requested", task_id=task_id)
                    handle.cancel("requeued: this attempt stops and the job is queued again", why="requeued")
                    continue
                log_event("task_cancel_requested", task_id=task_id)
                handle.cancel("the control plane cancelled this task")
        for change in answer.get("time_limits") or []:  # `job update --time` of a running task's job
            with self.lock:
                handle = self.handles.get(int(change.get("task_id", 0)))
            limit = change.get("timeout_seconds")
            if handle is not None and (limit is None or isinstance(limit, (int, float))) and not isinstance(limit, bool) \
                    and handle.change_time_limit(None if limit is None else float(limit)):
                log_event("task_time_limit_changed", task_id=handle.task_id, timeout_seconds=limit)
        if answer.get("reset_gpus") and self.gpu_health is not None:
            self.gpu_health.reset([int(i) for i in answer["reset_gpus"]])
        if answer.get("revoked"):
            self._fail(Revoked("the control plane revoked this worker"))
        if answer.get("relay") is True and self.relay is not None:
            self.relay.want()

    def _acquire_loop(self) -> None:
        transport = self.session.transport
        failures = 0
        chunks = self.chunks
        while not self.stopping.is_set():
            self._start_queued()
            free = self._free_slots()
            if not free or (chunks is not None and chunks.queued()):
                self.slot_freed.wait(0.5)
                self.slot_freed.clear()
                continue
            asked = time.monotonic()
            self.acquiring = True
            try:
                # max_tasks: every free slot's assignment in one round trip (an older server sends one)
                try:
                    wait_s = self._acquire_wait_s()
                    body: dict = {"wait_s": wait_s, "max_tasks": free}
                    if chunks is not None:  # elements leased ahead welcome (an older server ignores it)
                        body.update(prefetch=True, held=chunks.held())
                    answer = transport.request("POST", "/worker/acquire", body, timeout=wait_s + 15)
                finally:
                    self.acquiring = False
                failures = 0
            except Unreachable:
                failures += 1
                self.stopping.wait(retry_delay(failures))
                continue
            except Unauthorized:
                # The heartbeat tells an unknown session (registers again) from a revoked one (stops).
                self.beat_now.set()
                self.stopping.wait(self.interval_s)
                continue
            except AgentError as exc:
                self._fail(exc)
                return
            except Rejected as exc:
                log_event("acquire_rejected", error=str(exc))
                self.stopping.wait(self.interval_s)
                continue
            if answer.get("relay") is True and self.relay is not None:  # answered early: a client waits for the link
                self.relay.want()
            tasks = acquired(answer)
            ahead = leased_ahead(answer)
            if chunks is not None and ahead:
                chunks.add(ahead, stopping=self.stopping.is_set())
                if not tasks:
                    continue
            self._take(tasks, time.monotonic() - asked, asked, wait_s)

    def _acquire_wait_s(self) -> float:
        """How long to ask the server to park an acquire: `acquire_wait_s`, or one heartbeat interval where
        the server renews leases on any request (this worker then skips its beats while parked, and a
        parked acquire renews only when it arrives and answers: a worker killed while parked is lost one
        TTL after its last acquire, not after the park's deadline)."""
        if self.requests_renew:
            return min(self.config.acquire_wait_s, self.interval_s)
        return self.config.acquire_wait_s

    def _finish_later(self, body: dict, entry: dict | None = None) -> None:
        """A runner's finish, sent in a batch by `chunks`; its task counts as ended only once it is answered."""
        assert self.chunks is not None
        with self.lock:
            self.unanswered.add(body["task_id"])
        self.chunks.finish(body, entry)

    def _finishes_answered(self, task_ids: set[int]) -> None:
        """`chunks` sent these finishes (answered, or given up): a request sent from now on sees them applied."""
        now = time.monotonic()
        with self.lock:
            for task_id in task_ids:
                self.unanswered.discard(task_id)
                self.ended.pop(task_id, None)
                self.ended[task_id] = now

    def _free_slots(self) -> int:
        """How many more tasks this worker may run now (``--parallel`` less those it holds)."""
        with self.lock:
            return max(0, max(1, int(self.config.parallel)) - len(self.handles))

    def _running_ids(self) -> list[int]:
        with self.lock:
            return list(self.handles)

    def _start_queued(self) -> None:
        """Start elements leased ahead while slots are free: no round trip between one's end and the next."""
        if self.chunks is None:
            return
        with self.start_lock:
            while not self.stopping.is_set() and self._free_slots() > 0:
                task = self.chunks.take()
                if task is None:
                    return
                self._launch(task)

    def _take(self, tasks: list[Assignment], elapsed_s: float, asked: float | None = None,
              wait_s: float | None = None) -> None:
        """Launch the acquired assignments (a repeat of one already running is not launched again)."""
        if self.stopping.is_set():
            return
        if not tasks:
            parked_for = self.config.acquire_wait_s if wait_s is None else wait_s
            if elapsed_s < parked_for / 2:  # the server did not park us: poll gently
                self.stopping.wait(self.interval_s)
            return
        # acquire repeats an assignment until its start: wait (a little) for the starts before asking again
        deadline = time.monotonic() + 0.5
        for handle in [self._launch(task, asked) for task in tasks]:
            handle.start_sent.wait(max(0.0, deadline - time.monotonic()))

    def _handed_over(self, task: Assignment, asked: float | None = None) -> None:
        """The next task a finish brought back: launch it (a stopping worker leaves it; deregister requeues it)."""
        if not self.stopping.is_set():
            self._launch(task, asked)

    def _launch(self, task: Assignment, asked: float | None = None) -> TaskHandle:
        """Start the task's runner once, whoever asks first (acquire loop or a finish).

        ``asked``: when the request that brought the assignment was sent; one sent before the task's runner
        ended was answered before its finish (a short task's start rides on it), so it is not run again.
        """
        task_id = task.task_id
        with self.lock:
            known = self.handles.get(task_id)
            if known is not None:
                return known
            if asked is not None and (task_id in self.unanswered or self.ended.get(task_id, asked) > asked):
                log_event("task_assignment_stale", task_id=task_id)
                stale = TaskHandle(task_id)
                stale.start_sent.set()
                return stale
            handle = TaskHandle(task_id)
            handle.on_change = self.beat_now.set
            handle.assignment = {"job_id": task.job_id, "attempt": task.attempt, "gpus": task.gpus}
            runner = TaskRunner(task, self.session.ctx, handle)
            handle.runner = runner
            thread = threading.Thread(target=self._run_task, args=(runner,), name=f"task-{task_id}", daemon=True)
            self.handles[task_id] = handle
            self.threads[task_id] = thread
        thread.start()
        return handle

    def _run_task(self, runner: TaskRunner) -> None:
        try:
            runner.run()
        finally:
            with self.lock:
                self.handles.pop(runner.task_id, None)
                self.threads.pop(runner.task_id, None)
                now = time.monotonic()
                self.ended.pop(runner.task_id, None)
                self.ended[runner.task_id] = now  # in time order: the oldest first
                for old in [k for k, _ in zip(self.ended, range(8)) if self.ended[k] < now - ENDED_KEPT_S]:
                    del self.ended[old]
                if not self.handles:
                    self.idle_since = time.monotonic()
            self.slot_freed.set()
            self._start_queued()

    def _fail(self, error: AgentError) -> None:
        if not self.fatal:
            log_event("worker_fatal", reason=str(error))
        self.fatal.append(error)

    # -- stopping ----------------------------------------------------------
    def _shutdown(self, heartbeat: threading.Thread) -> None:
        """Drain, then stop and report every task, stop the heartbeat, deregister."""
        self.stopping.set()
        self.slot_freed.set()
        if self.chunks is not None:  # what is leased ahead and not started goes back to the queue at once
            self.chunks.give_back()
        self._drain()
        revoked = any(isinstance(err, Revoked) for err in self.fatal)
        reason = "the worker was revoked" if revoked else "the worker is stopping"
        self.session.transport.give_up_at = time.monotonic() + SHUTDOWN_REPORT_S
        with self.lock:
            handles = list(self.handles.values())
            threads = list(self.threads.values())
        for handle in handles:
            handle.cancel(reason, by_worker=True)
        # Bounded whatever a task thread is doing (a FIFO, a hung upload); a second SIGTERM stops waiting at once.
        graces = [g for h in handles if h.runner is not None and (g := h.runner.assignment.grace_seconds) is not None]
        deadline = time.monotonic() + SHUTDOWN_REPORT_S + max([self.config.kill_grace_s, *graces]) + 5
        for thread in threads:
            while thread.is_alive() and not self.hurry.is_set() and time.monotonic() < deadline:
                thread.join(0.1)
        if self.chunks is not None:  # the finishes still waiting to be sent, before the session ends
            self.chunks.flush(2 if self.hurry.is_set() else max(0.1, deadline - time.monotonic()))
            self.chunks.close()
        self.heartbeat_stop.set()
        self.beat_now.set()
        if not self.hurry.is_set():
            heartbeat.join(max(0.1, min(self.interval_s + 5, deadline - time.monotonic())))
        if not self.fatal:  # the control plane puts back what was only assigned and loses what still runs
            self._deregister(timeout=2 if self.hurry.is_set() else 10)
        self.close()
        log_event("worker_stopped", tasks_stopped=len(handles))

    def _drain(self) -> None:
        """Let running tasks end by themselves for up to ``drain_timeout_s`` (a second signal cuts it short)."""
        with self.lock:
            busy = len(self.handles)
        limit = self.config.drain_timeout_s or 0
        if limit <= 0 or not busy or self.fatal:
            return
        log_event("worker_draining", tasks=busy, drain_timeout_s=limit)
        deadline = time.monotonic() + limit
        while not self.hurry.is_set() and not self.fatal:
            with self.lock:
                busy = len(self.handles)
            left = deadline - time.monotonic()
            if not busy or left <= 0:
                break
            self.slot_freed.wait(min(0.2, left))
            self.slot_freed.clear()
        log_event("worker_drained", tasks_left=busy)

    def _deregister(self, timeout: float) -> None:
        try:
            self.session.transport.request("POST", "/worker/deregister", {}, timeout=timeout)
            log_event("worker_deregistered")
        except (Unreachable, Rejected) as exc:
            log_event("deregister_failed", error=str(exc))

    def close(self) -> None:
        """Release the HTTP session, the GPU watch and NVML (safe to call twice)."""
        self._opened.close()
