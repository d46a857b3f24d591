"""The scheduler: every state change as one transaction on the writer path.

It knows nothing of HTTP. Time comes from an injected clock (tests pin it).
Changes that can make a queued task placeable wake parked `acquire` calls.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from gpulayer.server.scheduler import jobs

from gpulayer.server.scheduler import leases

from gpulayer.server.scheduler import lifecycle

from gpulayer.server.scheduler import placement

from gpulayer.server.scheduler import secrets

from gpulayer.server.scheduler import workers
from gpulayer.server.config import MAX_ACQUIRE_WAIT_S, ControlPlaneConfig
from gpulayer.server.store.db import Store
from gpulayer.server.scheduler.spec import validate_job


class Scheduler:
    """Facade over the transaction functions, bound to one store, clock and config."""

    def __init__(self, store: Store, config: ControlPlaneConfig, clock: Callable[[], float] = time.time):
        self.store = store
        self.config = config
        self.clock = clock
        self.secret_box = secrets.SecretBox(config.layout)
        self._wake = threading.Condition()
        self._generation = 0
        self._parked = threading.BoundedSemaphore(max(1, config.max_parked_acquires))
        self._closing = False
        self._waiting = 0  # acquires inside self._wake.wait(): what a wake() reaches now
        self.observe_acquire: Callable[[float], None] = lambda seconds: None

    # -- wake-up -------------------------------------------------------------

    def wake(self) -> None:
        """Something may have become placeable: parked acquires look again."""
        with self._wake:
            self._generation += 1
            self._wake.notify_all()

    def stop_waiting(self) -> None:
        """The server is stopping: parked acquires answer "no task" now instead of at their deadline."""
        with self._wake:
            self._closing = True
            self._generation += 1
            self._wake.notify_all()

    @property
    def parked_acquires(self) -> int:
        """How many acquire calls wait on the wake-up now (a wake() or submit reaches each of them)."""
        with self._wake:
            return self._waiting

    def _write(self, fn, *args, wake: bool = False, **kwargs):
        result = self.store.write(fn, *args, **kwargs)
        if wake:
            self.wake()
        return result

    # -- clients -------------------------------------------------------------

    def submit(self, raw_spec) -> int:
        """Validate and queue a JobSpec; returns the job id. Raises InvalidRequest."""
        spec = validate_job(raw_spec)
        return self._write(jobs.submit, spec, self.clock(), wake=True)

    def cancel(self, job_id: int) -> bool:
        return self._write(jobs.cancel, job_id, self.clock(), wake=True)

    # -- workers -------------------------------------------------------------

    def register(self, **kwargs) -> dict:
        return self._write(workers.register, now=self.clock(), lease_ttl_s=self.config.lease_ttl_s, wake=True,
                           **kwargs)

    def needs_upgrade(self, **kwargs) -> None:
        self._write(workers.needs_upgrade, now=self.clock(), **kwargs)

    def heartbeat(self, worker_id: int, reported: list[dict]) -> dict:
        return self._write(leases.heartbeat, worker_id, reported, self.clock(), self.config.lease_ttl_s)

    def acquire(self, worker_id: int, wait_s: float = 0.0) -> dict | None:
        """The worker's next Assignment, or None after waiting up to wait_s for one."""
        deadline = time.monotonic() + min(max(wait_s, 0.0), MAX_ACQUIRE_WAIT_S)
        parked = False
        try:
            while True:
                seen = self._generation
                began = time.perf_counter()
                found = self._write(self._acquire_once, worker_id, self.clock())
                self.observe_acquire(time.perf_counter() - began)
                if found is not None:
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closing:
                    return None
                if not parked:
                    parked = self._parked.acquire(blocking=False)
                    if not parked:
                        return None  # too many parked already: the worker polls again later
                with self._wake:
                    if self._generation == seen and not self._closing:
                        self._waiting += 1
                        try:
                            self._wake.wait(remaining)
                        finally:
                            self._waiting -= 1
        finally:
            if parked:
                self._parked.release()

    def _acquire_once(self, conn, worker_id: int, now: float) -> dict | None:
        """One acquire transaction: the Assignment, built in the same transaction, or None."""
        task_id = placement.acquire(conn, worker_id, now, self.config.lease_ttl_s)
        return None if task_id is None else self._assignment(conn, task_id)

    def _assignment(self, conn, task_id: int) -> dict:
        return placement.assignment(conn, task_id, lambda names: secrets.env_for(conn, self.secret_box, names))

    def start(self, worker_id: int, task_id: int, pid: int | None) -> None:
        self._write(lifecycle.start, worker_id, task_id, pid, self.clock())

    def logs(self, worker_id: int, task_id: int, lines: list[dict]) -> int:
        return self._write(lifecycle.append_logs, worker_id, task_id, lines)

    def rendezvous(self, worker_id: int, task_id: int, address: str, port: int) -> dict:
        return self._write(lifecycle.rendezvous, worker_id, task_id, address, port, self.clock())

    def finish(self, worker_id: int, task_id: int, *, exit_code, outcome, outputs, reason, lines=()) -> bool:
        """Record a result (with the task's last log lines, if sent along) in one transaction."""
        return self._write(lifecycle.finish, worker_id, task_id, exit_code, outcome, outputs, reason, self.clock(),
                           lines=lines, wake=True)

    def deregister(self, worker_id: int) -> int:
        return self._write(workers.depart, worker_id, "deregistered", self.clock(), wake=True)

    def revoke_token(self, jti: str) -> dict | None:
        return self._write(workers.revoke_token, jti, self.clock(), wake=True)

    # -- upkeep --------------------------------------------------------------

    def expire(self) -> dict:
        """Expire leases and release gangs not started in time (run by upkeep)."""
        now = self.clock()
        result = self._write(leases.expire, now)
        result["gangs_released"] = self._write(leases.release_stale_gangs, now, self.config.start_timeout_s)
        if any(result.values()):
            self.wake()
        return result

