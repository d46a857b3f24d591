"""A worker's session with the control plane: register, heartbeat, acquire and run tasks, drain, deregister.

`Worker.run()` registers, then runs two threads, the heartbeat and the acquire
loop, plus one thread per running task, until the caller's thread (worker.py's
`run_worker`) sees a stop, a fatal error or the idle limit; then it stops.

Its parts, each a class on the one below: worker_state.WorkerState (what it holds), registration.Registration
(register, rejoin), heartbeat.Heartbeat (the heartbeat loop), and Worker here (setup, the acquire loop, the
task runners, stopping).
"""

import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path

from gpulayer.protocol.assignment import Assignment
from gpulayer.protocol.finish import FinishItem

from .artifacts.cache import ArtifactCache, default_cache_bytes, default_cache_dir
from .artifacts.caps import UnpackBudget
from .config import interpreter, task_sandbox
from .errors import AgentError, Rejected, Revoked, Unauthorized, Unreachable
from .events import log_event
from .cpusets import cpu_list
from .gpu import pinning
from .gpu.inventory import Inventory
from .gpu.sharing import GpuSharing, MpsDaemons
from .heartbeat import Heartbeat
from .link.backoff import retry_delay
from .link.tls import resolve_verify
from .link.transport import Transport, check_url
from .run.chunks import Chunks, leased_ahead
from .run.environment import filtered_environ
from .run.reports import DirSweeper, acquired
from .run.runner import SHUTDOWN_REPORT_S, TaskRunner
from .run.state import TaskContext
from .run.supervision import TaskHandle
from .sandbox.bwrap import gpu_minors
from .sandbox.images import ImageCache
from .sandbox.leftovers import RunningTasks
from .sandbox.shared import SharedSandboxes
from .sandbox.spares import Spares
from .worker_state import Session

#: How long a task that ended is remembered, against stale assignments of it (longer than any request waits).
ENDED_KEPT_S = 600.0


class Worker(Heartbeat):
    """One registered worker session and its tasks."""

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
                             hand_over=self._handed_over, queued_more=self._queued_more, fatal=self._fail,
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

    def _sharing(self, inventory: Inventory) -> GpuSharing:
        """What fractional tasks get from the worker's GPU sharing; MPS daemons quit when the session ends."""
        mps = None
        if inventory.gpu_sharing == "mps":
            mps = MpsDaemons(inventory.device_ids)
            self._opened.callback(mps.close)
        self.gpu_sharing = GpuSharing(inventory.gpu_sharing, inventory.gpu_memory_mb, mps,
                                      {i: d.gpu for i, d in inventory.nvml_devices.items()})
        return self.gpu_sharing

    def _pins(self, inventory: Inventory) -> pinning.CpuPins | None:
        """--pin-cpus: the tasks' CPU sets; None (said at start) where this machine's affinity cannot be read."""
        if not self.config.pin_cpus:
            return None
        pins, why = pinning.start(inventory.gpu_cpus)
        if pins is None:
            print(f"gpulayer worker: {why}", file=sys.stderr, flush=True)
            log_event("cpu_pinning_off", level=logging.WARNING, message=why)
            return None
        log_event("cpu_pinning", cpus=cpu_list(pins.allowed), gpus={i: cpu_list(c) for i, c in pins.local.items()})
        return pins

    def _task_context(self, transport: Transport, cache: ArtifactCache, answer: dict, inventory: Inventory,
                      state_dir: Path, unpack_caps: UnpackBudget) -> TaskContext:
        config = self.config
        advertise = answer.get("advertise_address") or config.advertise_address or socket.gethostname()
        shared = spares = None
        if self.sandbox.shares(False):  # an array's elements share their job's sandbox (agent/sandbox/shared.py)
            shared = SharedSandboxes(self.sandbox, state_dir / "tasks", RunningTasks(state_dir),
                                     keep_dirs=config.keep_task_dirs)
            self._opened.callback(shared.close)
            spares = Spares(self.sandbox, state_dir / "tasks", RunningTasks(state_dir), most=int(config.parallel),
                            keep_dirs=config.keep_task_dirs)
            self._opened.callback(spares.close)
        pins = self._pins(inventory)
        sweeper = None if config.keep_task_dirs else DirSweeper()
        if sweeper is not None:
            self._opened.callback(sweeper.close)
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
            gpu_share_env=self._sharing(inventory).environment,
            pin_cpus=pins.take if pins is not None else lambda _task, _gpus, _cpus: None,
            unpin_cpus=pins.release if pins is not None else lambda _task: None,
            images=ImageCache(cache),
            shared=shared,
            spares=spares,
            remove_later=sweeper.remove if sweeper is not None else None,
        )

    # -- serving and the acquire loop --------------------------------------
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

    def _finish_later(self, item: FinishItem, entry: dict | None = None) -> None:
        """A runner's finish, sent in a batch by `chunks`; its task counts as ended only once it is answered."""
        assert self.chunks is not None
        with self.lock:
            self.unanswered.add(item.task_id)
        self.chunks.finish(item, entry)

    def _finishes_answered(self, task_ids: set[int]) -> None:
        """`chunks` sent these finishes (answered, or given up): a request sent from now on sees them applied."""
        now = time.monotonic()
        with self.lock:
            for task_id in task_ids:
                self.unanswered.discard(task_id)
                self.ended.pop(task_id, None)
                self.ended[task_id] = now

    def _queued_more(self) -> None:
        self._start_queued()

    def _start_queued(self, reuse: bool = False) -> TaskRunner | None:
        """Start elements leased ahead while slots are free: no round trip between one's end and the next.

        ``reuse`` (a task thread whose task just ended): the first is returned for this thread to run, not given
        a thread of its own (a thread's start was a tenth of a short element's path)."""
        mine: TaskRunner | None = None
        if self.chunks is None:
            return None
        with self.start_lock:
            while not self.stopping.is_set() and self._free_slots() > 0:
                task = self.chunks.take()
                if task is None:
                    break
                if reuse and mine is None:
                    mine = self._runner_for(task, None, threading.current_thread())[1]
                else:
                    self._launch(task)
        return mine

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
        """Start the task's runner once, whoever asks first (acquire loop or a finish), on a thread of its own."""
        handle, _runner, thread = self._runner_for(task, asked)
        if thread is not None:
            thread.start()
        return handle

    def _runner_for(self, task: Assignment, asked: float | None = None, on: threading.Thread | None = None
                  ) -> tuple[TaskHandle, TaskRunner | None, threading.Thread | None]:
        """The task's handle and runner, once (a second ask gets the first's handle and no runner), to run ``on``
        that thread (the caller's) or a new one (returned, not started).

        ``asked``: when the request that brought the assignment was sent; one sent before the task's runner
        ended was answered before its finish (a short task's start rides on it), so it is not run again.
        """
        task_id = task.task_id
        with self.lock:
            known = self.handles.get(task_id)
            if known is not None:
                return known, None, None
            if asked is not None and (task_id in self.unanswered or self.ended.get(task_id, asked) > asked):
                log_event("task_assignment_stale", task_id=task_id)
                stale = TaskHandle(task_id)
                stale.start_sent.set()
                return stale, None, None
            handle = TaskHandle(task_id)
            handle.on_change = self.beat_now.set
            handle.assignment = {"job_id": task.job_id, "attempt": task.attempt, "gpus": task.gpus}
            if self.gpu_sharing is not None:  # time-slicing: the memory share the heartbeat's watch holds it to
                handle.gpu_memory_limit_mb = self.gpu_sharing.enforced_limit_mb(task)
            runner = TaskRunner(task, self.session.ctx, handle)
            handle.runner = runner
            new = None if on is not None else threading.Thread(target=self._run_task, args=(runner,),
                                                               name=f"task-{task_id}", daemon=True)
            self.handles[task_id] = handle
            self.threads[task_id] = on or new  # type: ignore[assignment]
        return handle, runner, new

    def _run_task(self, first: TaskRunner) -> None:
        """Run the task, then, on this same thread, each element leased ahead that its slot takes next."""
        runner: TaskRunner | None = first
        while runner is not None:
            try:
                runner.run()
            finally:
                self._ended(runner)
            self.slot_freed.set()
            runner = self._start_queued(reuse=True)

    def _ended(self, runner: TaskRunner) -> None:
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
        if revoked:  # never registered again: a task's call answered 401 does not wait for a new session
            self.session.transport.reauth_wait_s = 0.0
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
            self.chunks.flush(max(0.1, deadline - time.monotonic()), hurry=self.hurry)
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
