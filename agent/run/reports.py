"""What a task runner tells the control plane: its start (once, with the pid), its outputs and its finish.

A finish is sent alone here, or handed to the worker's batches (agent/run/chunks.py); one the control plane answers
with no longer ours is dropped (no finish at all).
"""
import logging
import os
import queue
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from gpulayer.protocol import plural
from gpulayer.protocol.assignment import Assignment, assignments
from gpulayer.protocol.fields import to_wire
from gpulayer.protocol.finish import CheckpointUpload, Finish, FinishItem

from ..artifacts.checkpoint import DIR_NAME as CHECKPOINT_DIR
from ..artifacts.outputs import collect_outputs, upload_outputs
from ..errors import AgentError, Rejected, Unreachable
from ..events import log_event
from .state import TaskState
from .supervision import TaskResult

#: Seconds the task thread waits for its start's answer before leaving it to a retrying thread.
INLINE_START_TIMEOUT_S = 2.0


class TaskReports(TaskState):
    """The runner's start, outputs and finish, as the control plane hears them."""

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

    def _final_checkpoint(self, result: TaskResult | None) -> list[dict] | None:
        """The checkpoint folder uploaded, for the finish of an attempt that ran and did not succeed."""
        if result is None or result.outcome == "succeeded" or not self.assigned or not self.started:
            return None
        return self.checkpoint.final()

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
        want_next = self.ctx.hand_over is not None and self.ctx.want_next()
        ended: dict[str, Any] = {  # protocol/finish.py's Finished; those at their default are left off the wire
            "exit_code": result.exit_code, "outcome": result.outcome, "outputs": outputs, "lines": tail,
            "reason": result.reason or None,
            "signals": self.handle.signals,  # the signals its process got: task_signalled events (added with signals)
            "pid": self.start_pid,  # its start was never sent: this finish is also the start
            # recorded in the finish's transaction (an older control plane ignores it)
            "checkpoint": CheckpointUpload(files=checkpoint) if checkpoint is not None else None}
        if self.ctx.finish_later is not None:  # sent with others (agent/run/chunks.py), fenced by its attempt
            run_s = round(self.run_s, 6) if self.run_s is not None else None
            self.ctx.finish_later(FinishItem(**ended, task_id=self.task_id, attempt=self.assignment.attempt,
                                             run_s=run_s), self.handle.heartbeat_entry())
        else:
            self._send_finish(Finish(**ended, next=want_next,
                                     max_tasks=max(1, self.ctx.next_max()) if want_next else None))
        if not self.ctx.keep_task_dirs:
            (self.ctx.remove_later or remove_dir)(self.workdir)

    def _send_finish(self, finish: Finish) -> None:
        asked = time.monotonic()
        try:
            answer = self.ctx.transport.call("POST", f"/worker/tasks/{self.task_id}/finish", to_wire(finish))
        except (Rejected, Unreachable) as exc:
            log_event("task_finish_failed", task_id=self.task_id, outcome=finish.outcome, error=str(exc))
            return
        except AgentError as exc:
            self.ctx.fatal.append(exc)
            return
        accepted = bool(answer.get("accepted"))
        if self.ctx.hand_over is not None:
            for task in acquired(answer):
                self.ctx.hand_over(task, asked)
        log_event("task_finished", task_id=self.task_id, outcome=finish.outcome, exit_code=finish.exit_code, accepted=accepted)
        if not accepted:
            log_event("task_result_late", task_id=self.task_id, outcome=finish.outcome)




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


class DirSweeper:
    """Ended tasks' working dirs removed by one thread, off the path from a task's end to its slot's next start.

    Removing a short task's dir (two ``rmdir``) was about a tenth of its thread's time on this VM's file system,
    between its finish and the next element's start. The thread starts with the first dir; ``close`` removes what
    is left (bounded) when the worker stops.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Path | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def remove(self, path: Path) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="dir-sweeper", daemon=True)
                self._thread.start()
        self._queue.put(path)

    def _loop(self) -> None:
        while (path := self._queue.get()) is not None:
            remove_dir(path)

    def close(self, timeout_s: float = 10.0) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout_s)


def acquired(answer: dict) -> list[Assignment]:
    """The assignments an acquire or a finish answer carries; none (and a log line) when one is unreadable."""
    try:
        return assignments(answer)
    except TypeError as exc:
        log_event("assignment_unreadable", level=logging.WARNING, error=str(exc))
        return []
