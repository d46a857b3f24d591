"""One task from assignment to finish: working dir, artifacts, run, outputs, finish.

``TaskRunner.run()`` is a thread's target. It never raises: whatever goes
wrong ends as a finish with a reason (or, when the control plane says the
task is no longer ours, as no finish at all).

Its parts, each a class on the one below: state.TaskState (the context and the runner's state),
reports.TaskReports (start, outputs, finish), launch.TaskLaunch (working dir, artifacts, image,
sandbox, spawn), and TaskRunner here (the lifecycle: run, rendezvous, supervision).
"""

import time
import traceback

from ..artifacts.checkpoint import Periodic
from ..errors import AgentError, Rejected, TaskSetupError, Unreachable
from ..events import log_event
from ..sandbox.process import TaskProcess, exit_code_of
from .launch import TaskLaunch
from .place import unplace
from .rendezvous import distributed_env, free_port, rendezvous
from .services import run_service
from .supervision import Limits, StopRule, TaskResult, result_of, supervise

#: How long a stopping worker keeps trying to report (logs, outputs, finish).
SHUTDOWN_REPORT_S = 30.0
#: How long a plain task's thread waits, once its process runs, before sending the start: a process that
#: ended by then has its start carried by its finish (`pid`), one call fewer per short task.
QUICK_EXIT_S = 0.03


class TaskRunner(TaskLaunch):
    """Runs one assignment to its finish."""

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
            self.ctx.unpin_cpus(self.task_id)
            if self.image is not None and self.ctx.images is not None:
                self.ctx.images.release(self.image.manifest)
        try:
            self._report(result, outputs, checkpoint)
        finally:
            if self.place is not None:
                unplace(self.place, self.ctx.shared, self.ctx.spares)
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
