"""One task from assignment to finish: working dir, artifacts, run, outputs, finish.

``TaskRunner.run()`` is a thread's target. It never raises: whatever goes
wrong ends as a finish with a reason (or, when the control plane says the
task is no longer ours, as no finish at all).
"""

import logging
import os
import select
import shutil
import subprocess
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from gpulayer.protocol import plural
from gpulayer.protocol.assignment import Assignment, assignments

from . import cdi
from .bundle import empty_dir, place_file, unpack_bundle
from .cache import ArtifactCache
from .checkpoint import DIR_NAME as CHECKPOINT_DIR, Checkpointer, DigestMemo, Periodic
from .caps import UnpackBudget, UnpackLimit
from .environment import task_argv, task_environment
from .errors import AgentError, Rejected, TaskSetupError, Unreachable
from .events import log_event
from .imagerun import TASK_DIR, image_argv, image_environment, startable_in, wrap_image
from .images import ImageCache, Prepared
from .launcher import Launched
from .leftovers import RunningTasks
from .logship import LogShipper
from .outputs import collect_outputs, upload_outputs
from .process import KILL_GRACE_S, TaskProcess, exit_code_of
from .rendezvous import RENDEZVOUS_TIMEOUT_S, distributed_env, free_port, rendezvous
from .sandbox import Sandbox, gpu_nodes, loader_variables, startable
from .services import run_service
from .shared import Holder, SharedSandboxes
from .spares import MadeAhead, Spare, Spares
from .supervision import Limits, StopRule, TaskHandle, TaskResult, result_of, supervise
from .transport import Transport

#: How long a stopping worker keeps trying to report (logs, outputs, finish).
SHUTDOWN_REPORT_S = 30.0
#: Seconds the task thread waits for its start's answer before leaving it to a retrying thread.
INLINE_START_TIMEOUT_S = 2.0
#: How long a plain task's thread waits, once its process runs, before sending the start: a process that
#: ended by then has its start carried by its finish (`pid`), one call fewer per short task.
QUICK_EXIT_S = 0.03


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
    #: How tasks are isolated (agent/sandbox.py; mode none: as the agent, unconfined).
    sandbox: Sandbox = field(default_factory=Sandbox)
    #: Each GPU index's /dev/nvidia<N> number, for the sandbox's device nodes.
    gpu_minors: list[int] = field(default_factory=list)
    #: The unpacked OCI images of image jobs (agent/images.py); None: made from the cache on first use.
    images: ImageCache | None = None
    #: One sandbox per job for its array elements (agent/shared.py); None: each task its own bwrap.
    shared: SharedSandboxes | None = None
    #: Sandboxes made ahead for plain tasks (agent/spares.py); None: each makes its own bwrap when it starts.
    spares: Spares | None = None
    #: Where finishes go to be sent in batches (agent/chunks.py: finish-many); None: each sent alone, here.
    finish_later: Callable[[dict, dict], None] | None = None
    #: Digests of checkpoint files already read (agent/checkpoint.py), shared by the worker's tasks.
    checkpoint_digests: DigestMemo = field(default_factory=DigestMemo)


class TaskRunner:
    """Runs one assignment to its finish."""

    def __init__(self, assignment: Assignment, ctx: TaskContext, handle: TaskHandle):
        self.assignment = assignment
        self.ctx = ctx
        self.handle = handle
        self.task_id = assignment.task_id
        #: The job's shared sandbox, for an element that runs in one (agent/shared.py).
        self.holder: Holder | None = None
        #: What the running process got on top of the task's environment (PORT, MASTER_*): exec gets it too.
        self.extra_env: dict[str, str] = {}
        #: An element the job's launcher started (agent/launcher.py), until spawn() takes it.
        self.launched: Launched | None = None
        #: bwrap's --info-fd pipe (read, write) for the task's own sandbox, until spawn() hands it to TaskProcess.
        self.info: tuple[int, int] | None = None
        #: A sandbox made ahead that this task runs in (agent/spares.py), and its command once started there.
        self.spare: Spare | None = None
        self.made_ahead: MadeAhead | None = None
        self.shares = ctx.shared is not None and _shareable(assignment, ctx.sandbox)
        parent = ctx.tasks_dir / f"job-{assignment.job_id}{'' if assignment.network != 'none' else '-netless'}"
        self.workdir = (parent if self.shares else ctx.tasks_dir) / f"{self.task_id}-{assignment.attempt}"
        self.weights: str | None = None
        #: The image an image job runs in, once fetched and unpacked (held until the task ends).
        self.image: Prepared | None = None
        #: An image job's GPU driver files: bwrap mounts and the environment that finds them (agent/cdi.py).
        self.driver: tuple[list[str], dict[str, str]] | None = None
        self.started = False
        self.pid_reported = False
        #: The pid of a process that ended before its start was sent: the finish carries the start.
        self.start_pid: int | None = None
        self.assigned = True
        self.shipper = LogShipper(self._send_logs, first_n=assignment.log_base)
        self.run_s: float | None = None
        #: The task's GPULAYER_CHECKPOINT_DIR (agent/checkpoint.py), and the attempt it was restored from.
        self.checkpoint = self._checkpointer()
        self.restored_from: int | None = None

    def _checkpointer(self) -> Checkpointer:
        ctx = self.ctx
        return Checkpointer(self.workdir / CHECKPOINT_DIR, ctx.transport, ctx.cache, ctx.checkpoint_digests,
                            self.shipper.system)

    def _send_logs(self, lines: list[dict]) -> None:
        self.ctx.transport.request("POST", f"/worker/tasks/{self.task_id}/logs", {"lines": lines})

    def run(self) -> None:
        """The whole lifecycle; never raises."""
        log_event("task_assigned", task_id=self.task_id, job_id=self.assignment.job_id, attempt=self.assignment.attempt)
        self.shipper.start()
        began = time.monotonic()
        try:
            result = self._execute()
            self.run_s = time.monotonic() - began  # what one element costs here: the pace of leasing ahead
            if self.start_pid is not None and self.assignment.outputs:  # uploads take a while: start first
                pid, self.start_pid = self.start_pid, None
                self._report_start(pid)
            outputs = self._outputs() if result is not None and result.exit_code is not None else {}
            checkpoint = self._final_checkpoint(result)
        except AgentError as exc:  # protocol mismatch or revoked mid-task: the worker stops
            self.ctx.fatal.append(exc)
            result, outputs, checkpoint = TaskResult(None, "failed", str(exc)), {}, None
        except Unreachable as exc:  # only when the worker gave up on the control plane
            result, outputs, checkpoint = TaskResult(None, "cancelled", f"control plane unreachable: {exc}"), {}, None
        except Exception as exc:
            log_event("task_agent_error", task_id=self.task_id, error=repr(exc), trace=traceback.format_exc(limit=5))
            result, outputs, checkpoint = TaskResult(None, "failed", f"agent error: {type(exc).__name__}: {exc}"), {}, None
        finally:
            if self.ctx.running is not None:
                self.ctx.running.remove(self.workdir.name)
            if self.image is not None and self.ctx.images is not None:
                self.ctx.images.release(self.image.manifest)
        try:
            self._report(result, outputs, checkpoint)
        finally:
            if self.holder is not None and self.ctx.shared is not None:
                self.ctx.shared.release(self.holder)
            if self.spare is not None and self.ctx.spares is not None:
                self.ctx.spares.done(self.spare)
        self.handle.start_sent.set()

    def _execute(self) -> TaskResult | None:
        self._prepare_dir()
        try:
            self._materialize()
            self._isolate()
        except TaskSetupError as exc:
            self.shipper.system(f"setup failed: {exc}")
            return TaskResult(None, "failed", str(exc)) if self._send_start(None) else None
        if self.handle.cancelled:
            if self.handle.by_worker:  # it never ran: deregister puts it back in the queue, same attempt
                return None
            return TaskResult(None, "cancelled", f"cancelled before start: {self.handle.cancel_reason}")
        extra: dict[str, str] = {}
        if self.assignment.world_size > 1:
            if not self._send_start(None):
                return None
            try:
                answer = self._rendezvous()
            except TaskSetupError as exc:
                self.shipper.system(str(exc))
                return TaskResult(None, "failed", str(exc))
            except Rejected as exc:  # the gang was released or replaced while this rank waited
                log_event("task_not_assigned", task_id=self.task_id, error=str(exc))
                self.assigned = False
                return None
            if answer is None:
                return TaskResult(None, "cancelled", f"cancelled during rendezvous: {self.handle.cancel_reason}")
            extra = distributed_env(answer)
        if self.assignment.service is not None:
            return run_service(self, self.assignment.service, extra)
        return self._run_once(extra)

    def _prepare_dir(self) -> None:
        if self.shares and self.ctx.shared is not None:  # the job's directory stays while this element holds it
            self.holder = self.ctx.shared.hold(self.assignment.job_id, self.assignment.network != "none")
        elif self.ctx.spares is not None and _fits_a_spare(self.assignment, self.ctx.sandbox):
            self.spare = self.ctx.spares.take(self.assignment.network != "none")
            if self.spare is not None:  # its working dir is made in the sandbox's box, which is bound there
                self.workdir = self.spare.box / self.workdir.name
                self.checkpoint = self._checkpointer()
        if self.workdir.exists():
            shutil.rmtree(self.workdir)
        self.workdir.mkdir(parents=True)

    def _materialize(self) -> None:
        """Fetch and place the source bundle, the inputs and the weights (weights are linked, not capped)."""
        if self.assignment.image is not None:
            self._prepare_image()
        budget = self.ctx.unpack_caps.fresh()
        try:
            self._place_artifacts(budget)
        except UnpackLimit:
            empty_dir(self.workdir)
            raise
        weights = self.assignment.service.weights if self.assignment.service else None
        if weights:
            self.weights = self._link_weights(self.ctx.cache.get(weights))
        self.restored_from = self.checkpoint.prepare(self.assignment.checkpoint)

    def _final_checkpoint(self, result: TaskResult | None) -> list[dict] | None:
        """The checkpoint folder uploaded, for the finish of an attempt that ran and did not succeed."""
        if result is None or result.outcome == "succeeded" or not self.assigned or not self.started:
            return None
        return self.checkpoint.final()

    def _checkpoint_env(self, extra: dict[str, str], root: str) -> None:
        extra.setdefault("GPULAYER_CHECKPOINT_DIR", f"{root}/{CHECKPOINT_DIR}")
        if self.restored_from is not None:
            extra.setdefault("GPULAYER_RESTORED_FROM_ATTEMPT", str(self.restored_from))

    def _prepare_image(self) -> None:
        """Fetch and unpack (or find in the cache) the job's image: TaskSetupError with the reason."""
        if self.ctx.sandbox.mode == "none":
            raise TaskSetupError("an image job needs a sandbox, and this worker runs tasks without one (--sandbox)")
        if self.ctx.images is None:
            self.ctx.images = ImageCache(self.ctx.cache)
        assert self.assignment.image is not None
        self.image = self.ctx.images.prepare(self.assignment.image, self.shipper.system)
        if self.assignment.gpus:
            try:
                self.driver = cdi.driver_mounts(cdi.load([str(n) for n in self._gpu_numbers()]))
            except (cdi.CdiError, OSError) as exc:
                raise TaskSetupError(f"the GPU driver's files for the image: {exc}") from None

    def _gpu_numbers(self) -> list[int]:
        minors = self.ctx.gpu_minors
        return [minors[i] if 0 <= i < len(minors) else i for i in self.assignment.gpus]

    def _place_artifacts(self, budget: UnpackBudget) -> None:
        source = self.assignment.source
        if source:
            count = unpack_bundle(self.ctx.cache.get(source, budget.max_bytes), self.workdir, budget)
            self.shipper.system(f"source bundle {source} unpacked: {plural(count, 'entry', 'entries')}")
        for relative, digest in sorted(self.assignment.inputs.items()):
            place_file(self.ctx.cache.get(digest, budget.max_bytes), self.workdir, relative, "input", budget)

    def _link_weights(self, cached: Path) -> str:
        """A hard link of the cached weights in the working dir, safe from eviction; a copy when the task runs as
        the agent's own user, which could change a linked file's bytes (owner of the inode) under the cache."""
        target = self.workdir / ".gpulayer-weights"
        user = self.ctx.sandbox.drops_to(self.assignment.run_as_root)
        try:
            if user is None or user.uid == os.geteuid():
                raise PermissionError("the task runs as the cache's owner")
            os.link(cached, target)
        except OSError:
            shutil.copyfile(cached, target)
        return str(target)

    def _rendezvous(self) -> dict | None:
        port = free_port()
        return rendezvous(
            self.ctx.transport,
            self.task_id,
            self.ctx.advertise_address,
            port,
            self.handle.wait_cancel,
            timeout_s=self.ctx.rendezvous_timeout_s,
        )

    def environment(self, extra: dict[str, str]) -> dict[str, str]:
        """The task's environment with ``extra`` (PORT, MASTER_*) on top."""
        extra = dict(extra)
        self._checkpoint_env(extra, TASK_DIR if self.image is not None else str(self.workdir))
        if self.image is not None:
            if self.weights:
                extra["GPULAYER_WEIGHTS"] = f"{TASK_DIR}/.gpulayer-weights"
            return task_environment(image_environment(self.image.config), self.assignment, TASK_DIR,
                                    self.ctx.device_ids, None, extra)
        if self.weights:
            extra["GPULAYER_WEIGHTS"] = self.weights
        return task_environment(
            self.ctx.base_env, self.assignment, str(self.workdir), self.ctx.device_ids, self.ctx.python, extra
        )

    def spawn(self, extra: dict[str, str], quick_exit_s: float = 0.0) -> "TaskProcess | TaskResult":
        """Start the command; a command that cannot start gives a failed result (126/127).

        ``quick_exit_s``: wait that long for the process to end before sending the start; one that ended
        by then sends none (its finish carries it, ``start_pid``).
        """
        if self.image is not None:
            weights = f"{TASK_DIR}/.gpulayer-weights" if self.weights else None
            argv = image_argv(self.image.config, task_argv(list(self.assignment.command), None, weights))
        else:
            argv = task_argv(list(self.assignment.command), self.ctx.python, self.weights)
        self.extra_env = dict(extra)
        try:
            env = self.environment(extra)
            launch, popen_env = self._launch_image(self.image, argv, env) if self.image else self._launch(argv, env)
            launched, self.launched = self.launched, None
            info, self.info = self.info, None
            made_ahead, self.made_ahead = self.made_ahead, None
            init_pidfd = None
            if made_ahead is not None and self.spare is not None:  # the pidfd is the task's process's now
                init_pidfd, self.spare.init_pidfd = self.spare.init_pidfd, None
            proc = TaskProcess(launch, popen_env, str(self.workdir), self.shipper.add,
                               sandboxed=self.ctx.sandbox.mode != "none" and self.holder is None,
                               entered=self.holder is not None and launched is None,
                               started=launched or made_ahead, info=info, init_pidfd=init_pidfd)
        except OSError as exc:
            for fd in self.info or ():  # _launch made the pipe, then the command could not start
                os.close(fd)
            self.info = None
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            self.shipper.system(f"cannot start {argv[0]!r}: {exc.strerror or exc}")
            if not self.started:
                self._send_start(None)
            return TaskResult(code, "failed", f"cannot start {argv[0]!r}: {exc.strerror or exc}")
        log_event("task_started", task_id=self.task_id, pid=proc.pid)
        if self.ctx.running is not None:
            self.ctx.running.add(self.workdir.name, proc.pid)
        if not self.pid_reported:  # a gang rank sent its start before the rendezvous, without a pid
            self.started = self.pid_reported = True
            if quick_exit_s > 0 and _ended_within(proc, quick_exit_s):
                self.start_pid = proc.pid
            else:
                self._report_start(proc.pid)
        return proc

    def _isolate(self) -> None:
        """Hand the working dir to the task's user; TaskSetupError for a job this worker cannot isolate as asked."""
        if self.assignment.network == "none" and self.ctx.sandbox.mode == "none":
            raise TaskSetupError("network none needs a sandbox, and this worker runs tasks without one (--sandbox)")
        self.ctx.sandbox.give(self.workdir, self.assignment.run_as_root)

    def _launch(self, argv: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        """``argv`` in the worker's sandbox, and the environment to start it with: the job's ``LD_*`` set inside,
        by the inner ``env`` (raises what exec would for a command that cannot start)."""
        sandbox = self.ctx.sandbox
        if sandbox.mode == "none":
            return argv, env
        startable(argv, env, str(self.workdir))
        outer, loader = loader_variables(env)
        if self.holder is not None and self.ctx.shared is not None:  # into the job's sandbox: two execs, no bwrap
            try:
                pid = self.ctx.shared.started(self.holder)
            except TaskSetupError as exc:
                raise OSError(str(exc)) from None
            self.launched = self.ctx.shared.launch(self.holder, argv, env, str(self.workdir), self.shipper.system)
            if self.launched is not None:  # forked inside by the job's launcher, already running
                return argv, env
            return sandbox.enter_argv(pid, argv, str(self.workdir), network=self.assignment.network != "none",
                                      loader=loader), outer
        if self.spare is not None and self.ctx.spares is not None:  # made ahead: the command is all that starts
            self.made_ahead = self.ctx.spares.start(self.spare, argv, env, str(self.workdir))
            return argv, env
        self.info = os.pipe()  # bwrap's --info-fd: the sandbox init's pid, whose end is the namespace's
        wrapped = sandbox.wrap([*loader, *argv], str(self.workdir), gpu_nodes=gpu_nodes(self._gpu_numbers()),
                               network=self.assignment.network != "none", root_asked=self.assignment.run_as_root,
                               info_fd=self.info[1])
        return wrapped, outer

    def image_place(self, env: dict[str, str]) -> tuple[dict[str, str], str]:
        """An image job's environment (with the GPU driver's files) and working directory as its task sees them:
        where the task starts, and where exec, shell and SSH enter it (agent/relay_exec.py)."""
        assert self.image is not None
        workdir = self.image.config.workdir
        cwd = workdir if workdir and not (self.assignment.source or self.assignment.inputs) else TASK_DIR
        if self.driver is not None:
            env = {**self.driver[1], **env}
            env["LD_LIBRARY_PATH"] = ":".join(filter(None, [env.get("LD_LIBRARY_PATH"), f"{cdi.DRIVER_DIR}/lib"]))
            env["PATH"] = f"{env.get('PATH', '')}:{cdi.DRIVER_DIR}/bin"
        return env, cwd

    def _launch_image(self, image: Prepared, argv: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        """``argv`` in the sandbox with the image as its root, and the environment bwrap starts with (raises what
        exec would for a command the image lacks)."""
        env, cwd = self.image_place(env)
        startable_in(image, argv, env, cwd)
        driver = self.driver[0] if self.driver is not None else []
        return wrap_image(self.ctx.sandbox, image, argv, env, str(self.workdir), cwd,
                          gpu_nodes=gpu_nodes(self._gpu_numbers()),
                          driver=driver, network=self.assignment.network != "none",
                          root_asked=self.assignment.run_as_root)

    def _report_start(self, pid: int) -> None:
        """POST start with the pid once; if the control plane does not answer, a thread retries it.

        The supervision that follows must not wait on an unreachable control
        plane (timeouts, silence, cancel); a thread per task only for that
        case keeps the common one cheap.
        """
        try:
            self.ctx.transport.request("POST", f"/worker/tasks/{self.task_id}/start", {"pid": pid}, timeout=INLINE_START_TIMEOUT_S)
        except Unreachable:  # a start sent twice is harmless (protocol)
            threading.Thread(target=self._send_start, args=(pid,), daemon=True, name=f"start-{self.task_id}").start()
            return
        except Rejected as exc:
            self._not_assigned(exc)
        except AgentError as exc:  # protocol mismatch: the worker stops, which stops this task
            self.ctx.fatal.append(exc)
        self.handle.start_sent.set()

    def _send_start(self, pid: int | None) -> bool:
        """POST start (retried); False, and the task is dropped, when the server says it is not ours."""
        self.started = True
        body = {"pid": pid} if pid is not None else {}
        try:
            self.ctx.transport.call("POST", f"/worker/tasks/{self.task_id}/start", body)
            return True
        except Rejected as exc:
            self._not_assigned(exc)
            return False
        finally:
            self.handle.start_sent.set()

    def _not_assigned(self, exc: Rejected) -> None:
        log_event("task_not_assigned", task_id=self.task_id, error=str(exc))
        self.assigned = False
        self.handle.cancel("the control plane no longer assigns this task to this worker")

    def exit_code(self, proc: TaskProcess) -> int:
        """The process's shell-style exit code (it must have ended)."""
        return exit_code_of(proc.popen.wait())

    def _run_once(self, extra: dict[str, str]) -> TaskResult:
        # A plain task's start may ride on its finish; a gang rank sent its start before the rendezvous.
        proc = self.spawn(extra, quick_exit_s=0.0 if self.started else QUICK_EXIT_S)
        if isinstance(proc, TaskResult):
            return proc
        limits = Limits(self.assignment.timeout_seconds, self.assignment.silence_timeout_seconds, proc.started)
        every = self.assignment.checkpoint_every_seconds
        periodic = Periodic(self.checkpoint, self.task_id, self.assignment.attempt, every).start() if every else None
        try:
            stop = supervise(proc, self.handle, limits, self.shipper.system, self.ctx.kill_grace_s,
                             rule=self.stop_rule())
        finally:
            if periodic is not None:
                periodic.stop()
        proc.finish_readers()
        return result_of(stop, self.exit_code(proc))

    def stop_rule(self) -> StopRule:
        """How this task is stopped: the job's `signal` and `grace_seconds` (supervision.StopRule)."""
        return StopRule.of(self.assignment.signal, self.assignment.grace_seconds)

    def _outputs(self) -> dict[str, str]:
        files, problems = collect_outputs(self.workdir, list(self.assignment.outputs))
        for problem in problems:
            self.shipper.system(problem)
        if not files or not self.assigned:
            return {}
        recorded = upload_outputs(self.workdir, files, self._upload, self.shipper.system)
        self.shipper.system(f"{plural(len(recorded), 'output file')} uploaded")
        return recorded

    def _upload(self, key: str, digest: str, path: str) -> bool:
        """Upload one output (``path``: the descriptor it was hashed from); False (and a log line) when the
        control plane refuses it."""
        try:
            self.ctx.transport.upload_artifact(digest, path)
            return True
        except (Rejected, OSError) as exc:  # Rejected: the task rewrote the file since it was hashed
            self.shipper.system(f"output {key} not uploaded: {exc}")
            return False

    def _report(self, result: TaskResult | None, outputs: dict[str, str], checkpoint: list[dict] | None = None) -> None:
        """Send the last log lines and the finish (unless the task is no longer ours)."""
        if result is None or not self.assigned:
            self.shipper.close(time.monotonic() + 5)
            log_event("task_dropped", task_id=self.task_id)
            return
        code = f" (exit code {result.exit_code})" if result.exit_code is not None else ""
        if result.outcome == "cancelled" and self.handle.why == "requeued":  # `job requeue`: no cancel, a new attempt
            summary = f"requeued{code}: this attempt was stopped; the job is queued again as a new attempt"
        else:
            summary = f"finished: {result.outcome}{code}"
            summary += f": {result.reason}" if result.reason and result.outcome != "succeeded" else ""
        tail = self.shipper.close_keeping_tail(self.ctx.transport.give_up_at, last_line=summary)
        body: dict = {"exit_code": result.exit_code, "outcome": result.outcome, "outputs": outputs, "lines": tail,
                "next": self.ctx.hand_over is not None and self.ctx.want_next()}
        if body["next"]:
            body["max_tasks"] = max(1, self.ctx.next_max())
        if result.reason:
            body["reason"] = result.reason
        if self.handle.signals:  # the signals its process got: task_signalled events (added with signals)
            body["signals"] = self.handle.signals
        if self.start_pid is not None:  # its start was never sent: this finish is also the start
            body["pid"] = self.start_pid
        if checkpoint is not None:  # recorded in the finish's transaction (an older control plane ignores it)
            body["checkpoint"] = {"files": checkpoint}
        if self.ctx.finish_later is not None:  # sent with others (agent/chunks.py), fenced by its attempt
            del body["next"]
            body.pop("max_tasks", None)
            body.update(task_id=self.task_id, attempt=self.assignment.attempt)
            if self.run_s is not None:
                body["run_s"] = round(self.run_s, 6)
            self.ctx.finish_later(body, self.handle.heartbeat_entry())
        else:
            self._send_finish(body)
        if not self.ctx.keep_task_dirs:
            remove_dir(self.workdir)

    def _send_finish(self, body: dict) -> None:
        asked = time.monotonic()
        try:
            answer = self.ctx.transport.call("POST", f"/worker/tasks/{self.task_id}/finish", body)
        except (Rejected, Unreachable) as exc:
            log_event("task_finish_failed", task_id=self.task_id, outcome=body["outcome"], error=str(exc))
            return
        except AgentError as exc:
            self.ctx.fatal.append(exc)
            return
        accepted = bool(answer.get("accepted"))
        if self.ctx.hand_over is not None:
            for task in acquired(answer):
                self.ctx.hand_over(task, asked)
        log_event("task_finished", task_id=self.task_id, outcome=body["outcome"], exit_code=body["exit_code"], accepted=accepted)
        if not accepted:
            log_event("task_result_late", task_id=self.task_id, outcome=body["outcome"])


def remove_dir(path: Path) -> None:
    """Remove a task's working dir and what is in it: two rmdirs when it holds nothing but its empty checkpoint
    folder (most short tasks leave it so), the walk of shutil.rmtree otherwise."""
    try:
        os.rmdir(path / CHECKPOINT_DIR)
    except OSError:
        pass
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError:
        shutil.rmtree(path, ignore_errors=True)


def _fits_a_spare(task: Assignment, sandbox: Sandbox) -> bool:
    """Whether a task may run in a sandbox made ahead (agent/spares.py): a plain command of its own, started once
    (no image, GPUs, gang or service, whose restarts start it again; no user but the task user) on a root agent's
    sandbox."""
    return (task.image is None and not task.gpus and task.service is None and task.world_size == 1
            and sandbox.shares(task.run_as_root))


def _shareable(task: Assignment, sandbox: Sandbox) -> bool:
    """Whether an assignment runs in its job's shared sandbox: an array element of a plain command (no image,
    GPUs, service or gang) on a worker whose sandbox shares (Sandbox.shares: a root agent, nsenter)."""
    return (task.array_index is not None and task.image is None and not task.gpus and task.service is None
            and task.world_size == 1 and sandbox.shares(task.run_as_root))


def acquired(answer: dict) -> list[Assignment]:
    """The assignments an acquire or a finish answer carries; none (and a log line) when one is unreadable."""
    try:
        return assignments(answer)
    except TypeError as exc:
        log_event("assignment_unreadable", level=logging.WARNING, error=str(exc))
        return []


def _ended_within(proc: TaskProcess, seconds: float) -> bool:
    """Whether the process (its leader) ended within ``seconds``; it is reaped then.

    A pidfd wakes at the exit itself; Popen.wait's timeout polls at growing intervals (0.5, 1, 2, 4 ms...).
    """
    if isinstance(proc.popen, MadeAhead):  # its end is the status bash writes, not bwrap's exit
        try:
            proc.popen.wait(seconds)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # not Linux 5.3+: poll
        fd = None
    try:
        if fd is None:
            proc.popen.wait(timeout=seconds)
        elif select.select([fd], [], [], seconds)[0]:
            proc.popen.wait()  # it has exited: reaped at once
        else:
            return False
        return True
    except subprocess.TimeoutExpired:
        return False
    finally:
        if fd is not None:
            os.close(fd)
