"""A worker's heartbeat loop: what it reports (tasks, GPUs), when it may skip a beat, and what the answers ask.

An answer cancels, preempts or requeues tasks, changes a running task's time limit, resets GPUs, revokes the
worker or asks for its relay link. A 401 registers it again (registration.Registration._rejoin).
"""

import time

from gpulayer.protocol.fields import to_wire
from gpulayer.protocol.heartbeat import Heartbeat as HeartbeatBody

from .errors import AgentError, Rejected, Revoked, Unauthorized, Unreachable
from .events import log_event
from .link.backoff import retry_delay
from .registration import Registration


class Heartbeat(Registration):
    """The heartbeat thread's loop and what it does with each answer."""

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
            gpus = None
            if self.gpu_health is not None:
                self.gpu_health.check()
                gpus = self.gpu_health.report()
            samples = self.gpu_stats.take() if self.gpu_stats is not None else []
            if self.gpu_sharing is not None and self.nvml is not None:  # time-slicing's memory shares
                with self.lock:
                    running = list(self.handles.values())
                try:  # never the heartbeat's end: a watch that cannot read NVML watches nothing this beat
                    self.gpu_sharing.watch_memory(self.nvml, running)
                except Exception as exc:  # noqa: BLE001
                    log_event("gpu_memory_watch_failed", error=f"{type(exc).__name__}: {exc}")
            # gpu_samples, when some: additive, an older control plane ignores it
            body = to_wire(HeartbeatBody(tasks=entries, gpus=gpus, gpu_samples=samples))
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
