"""The scheduler's side of an agent's requests: register, heartbeat, acquire, start, logs, rendezvous, finish.

Each is one transaction on the writer path (facade.Facade._write), or a read where nothing changes (a
heartbeat that renews only, an acquire with nothing for the worker). `core.Scheduler` carries them.
"""
from __future__ import annotations

import functools
import logging
import time
from typing import Callable, Sequence

import apsw

from gpulayer.server.config import MAX_ACQUIRE_WAIT_S
from gpulayer.server.scheduler import (cascades, checkpoints, chunks, leases, lifecycle, placement, reconcile,
                                       reservations, secrets, workers)
from gpulayer.server.scheduler.facade import Facade
from gpulayer.server.security.auth import Principal, new_token

log = logging.getLogger("gpulayer.server.scheduler.core")  # the name its lines have always had


class WorkerRequests(Facade):
    """The calls the /v1/worker routes make, on the facade's store, clock and wake-up."""

    def register(self, **kwargs) -> dict:
        return self._write(workers.register, now=self.clock(), lease_ttl_s=self.lease_ttl_s(), wake=True,
                           **kwargs)

    def join(self, *, body: dict, token: Principal, peer_address: str | None) -> dict:
        """Register a worker with a new session token, returned once (in `session_token`), only here."""
        session = new_token("worker")
        result = self.register(body=body, token=token, session_hash=self.auth.hash(session), peer_address=peer_address)
        if result.get("warnings"):
            log.warning("worker_name_in_use worker_id=%s name=%s", result["worker_id"], result["name"])
        return {**result, "session_token": session}

    def needs_upgrade(self, **kwargs) -> None:
        self._write(workers.needs_upgrade, now=self.clock(), **kwargs)

    def heartbeat(self, worker_id: int, reported: list[dict], gpus: list[dict] | None = None,
                  samples: list[dict] | None = None) -> dict:
        """Renew the worker's leases and answer what to cancel (leases.heartbeat).

        One that changes nothing is answered from a read transaction and its renewal noted in memory
        (leases.unchanged, renewals.py); anything else, and all of them while a restore's rules apply,
        takes the write path. Its GPU `samples` (wire.gpu_samples) are buffered either way, for upkeep
        to write (gpu_samples.py); a gone worker's are dropped.
        """
        now = self.clock()
        answer = None
        if self.restored is None or not self.restored.active():
            answer = self.store.read_statement(leases.unchanged, worker_id, reported, now, self.lease_ttl_s(),
                                               gpus)
            if answer is not None and answer["cancel_task_ids"]:  # with the preemption fields, in one snapshot
                answer = self.store.read(leases.unchanged, worker_id, reported, now, self.lease_ttl_s(), gpus)
        if answer is not None:
            self.renewals.note(worker_id, now)
        else:
            answer = self._write(leases.heartbeat, worker_id, reported, now, self.lease_ttl_s(), gpus, inline=0,
                                 restored=self.restored)
            if any(t.get("endpoint") for t in reported):  # a replica may have become ready: the ingress looks again
                self.ingress.endpoints_seen += 1
            if answer.get("reset_gpus"):
                self.wake()
        if samples and answer["lease_expires_at"] is not None:
            self.gpu_samples.add(worker_id, samples, now)
        return answer

    def heartbeat_terms(self, worker_id: int | None = None) -> dict:
        """What register and heartbeat answers tell an agent of its heartbeats (docs/protocol.md): the interval
        wanted, and that any successful worker request renews its leases (so an idle one may skip a beat)."""
        return {"heartbeat_interval_s": self.cadence.interval_s(worker_id), "requests_renew_lease": True}

    def acquire(self, worker_id: int, wait_s: float = 0.0) -> dict | None:
        """The worker's next Assignment, or None after waiting up to wait_s for one."""
        found = self.acquire_many(worker_id, wait_s, 1)
        return found[0] if found else None

    def acquire_many(self, worker_id: int, wait_s: float = 0.0, max_tasks: int = 1,
                     check: Callable[[], object] | None = None, ahead: list[dict] | None = None,
                     held: Sequence[int] = ()) -> list[dict]:
        """Up to max_tasks Assignments (placement.acquire_many), or [] after waiting up to wait_s for one.

        `check` runs after each wake-up and raises (Unauthorized) once the worker's session ended: a parked
        acquire of a deregistered or revoked worker ends at once, not at its deadline. `ahead` (a list, for
        an agent that takes them: `prefetch`) receives the Assignments of the elements leased ahead to the
        worker (chunks.lease_ahead) that it does not say it holds (`held`); some there end the wait too.
        """
        deadline = time.monotonic() + min(max(wait_s, 0.0), MAX_ACQUIRE_WAIT_S)
        parked = False
        self.seen(worker_id)
        try:
            while True:
                seen = self._generation
                if self.restored is not None and self.restored.paused():
                    return []  # reconciling after a restore (reconcile.py): the worker asks again later
                began = time.perf_counter()
                if self.store.read(placement.nothing_for, worker_id):
                    found = []  # nothing queued, nothing of its own waiting: no writer transaction
                    if ahead is not None:
                        ahead.clear()
                else:
                    found = self._write(self._acquire_once, worker_id, self.clock(), max_tasks, ahead, held)
                self.observe_acquire(time.perf_counter() - began)
                if found or ahead:
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closing:
                    return []
                if not parked:
                    parked = self._parked.acquire(blocking=False)
                    if not parked:
                        return []  # too many parked already: the worker polls again later
                with self._wake:
                    if self._generation == seen and not self._closing:
                        self._waiting += 1
                        try:
                            self._wake.wait(remaining)
                        finally:
                            self._waiting -= 1
                if check is not None:
                    check()
                if self.relay.wanted(worker_id):
                    return []  # the relay waits for this worker's link: answer now (`relay: true`)
        finally:
            self.seen(worker_id)
            if parked:
                self._parked.release()

    def _acquire_once(self, conn: apsw.Connection, worker_id: int, now: float, max_tasks: int = 1,
                      ahead: list[dict] | None = None, held: Sequence[int] = (), changed: bool = False) -> list[dict]:
        """One acquire transaction: the Assignments, built in the same transaction (maybe none); with `ahead`,
        the elements leased ahead too (chunks.lease_ahead, and those held ahead the agent does not name).
        `changed`: the transaction changed what the plan of reservations reads before this (a finish)."""
        taken = self._claim_planned(conn, worker_id, now, max_tasks, changed) if max_tasks else []
        if ahead is not None:
            ahead.clear()  # a write retried starts again
            leased = set(chunks.lease_ahead(conn, worker_id, now, self.lease_ttl_s(), self.pace))
            known = set(held)
            ahead += [self._assignment(conn, task_id) for task_id in chunks.held_ahead(conn, worker_id)
                      if task_id in leased or task_id not in known]
        return [self._assignment(conn, task_id) for task_id in taken]

    def _claim_planned(self, conn: apsw.Connection, worker_id: int, now: float, max_tasks: int,
                       changed: bool) -> list[int]:
        """placement.acquire_many on a plan of reservations as fresh as the state it claims from.

        Upkeep plans every tick, but a claim comes at once after what moves a plan (a submit, a finish, a
        cancel: the wake-up generation moved): on the last tick's plan it would judge by an end that came
        early, or give a job submitted since no reservation at all (EASY plans again at each such event). So
        the first claim after one plans again, in its transaction (reservations.plan: about 2 ms with 20,000
        queued, docs/benchmarks/issue-38.md); the claims after it at the same generation use that plan, which
        took each job that fits now as starting now and reserved room for the next.
        """
        generation = self._generation
        if changed or generation != self._planned_generation:
            reservations.plan(conn, now)
            self._planned_generation = generation
        return placement.acquire_many(conn, worker_id, now, self.lease_ttl_s(), max_tasks)

    def _assignment(self, conn: apsw.Connection, task_id: int) -> dict:
        return placement.assignment(conn, task_id, lambda names: secrets.env_for(conn, self.secret_box, names,
                                                                                 secrets.task_project(conn, task_id)),
                                    max_grace_s=self.config.max_grace_s)

    def start(self, worker_id: int, task_id: int, pid: int | None) -> None:
        self.seen(worker_id)
        self._write(self._adopting(lifecycle.start), worker_id, task_id, pid, self.clock())

    def _adopting(self, fn):
        """fn itself; on a restored plane, fn once the task was adopted if it is queued (reconcile.adopt_for_call)."""
        restored = self.restored
        if restored is None:
            return fn

        def adopting(conn: apsw.Connection, worker_id: int, task_id: int, *args, **kwargs):
            now = self.clock()
            reconcile.adopt_for_call(conn, worker_id, task_id, now, now + self.lease_ttl_s(), restored,
                                     ending=fn is lifecycle.finish)
            return fn(conn, worker_id, task_id, *args, **kwargs)
        return adopting

    def logs(self, worker_id: int, task_id: int, lines: list[dict]) -> int:
        self.seen(worker_id)
        accepted = self._write(lifecycle.append_logs, worker_id, task_id, lines)
        self.log_followers.written()
        return accepted

    def rendezvous(self, worker_id: int, task_id: int, address: str, port: int) -> dict:
        self.seen(worker_id)
        return self._write(lifecycle.rendezvous, worker_id, task_id, address, port, self.clock())

    def finish(self, worker_id: int, task_id: int, *, exit_code, outcome, outputs, reason, lines=(),
               pid=None, checkpoint=None, signals=()) -> bool:
        """Record a result (with the task's last log lines, its start when `pid`, its checkpoint) in one
        transaction."""
        self.seen(worker_id)
        accepted = self._write(self._adopting(lifecycle.finish), worker_id, task_id, exit_code, outcome, outputs,
                               reason, self.clock(), lines=lines, pid=pid, checkpoint=checkpoint,
                               keep=self.config.checkpoint_keep, signals=signals, wake=True)
        self.log_followers.written()  # the job may have ended: its log followers stop waiting
        return accepted

    def finish_next(self, worker_id: int, task_id: int, max_tasks: int, **finish) -> tuple[bool, list[dict]]:
        """finish (its keywords), then the freed room's next Assignments as acquire with wait_s 0 gives them, in
        the same write transaction: one writer operation a cycle fewer (docs/benchmarks/issue-41.md). When the
        finish set a cascade off (a job ended: dependents released, ...), the claim waits for its first steps,
        as a separate acquire after the finish did."""
        self.seen(worker_id)
        began = time.perf_counter()
        accepted, found = self._write(self._finish_next, worker_id, task_id, self.clock(), max_tasks, finish,
                                      wake=True)
        self.log_followers.written()  # the job may have ended: its log followers stop waiting
        if found is None:
            return accepted, self.acquire_many(worker_id, 0, max_tasks)
        self.observe_acquire(time.perf_counter() - began)
        return accepted, found

    def _finish_next(self, conn: apsw.Connection, worker_id: int, task_id: int, now: float, max_tasks: int,
                     finish: dict) -> tuple[bool, list[dict] | None]:
        accepted = self._adopting(lifecycle.finish)(conn, worker_id, task_id, finish["exit_code"], finish["outcome"],
                                                    finish["outputs"], finish["reason"], now,
                                                    lines=finish.get("lines", ()), pid=finish.get("pid"),
                                                    checkpoint=finish.get("checkpoint"),
                                                    keep=self.config.checkpoint_keep, signals=finish.get("signals", ()))
        if cascades.asked() or (self.restored is not None and self.restored.paused()):
            return accepted, None
        return accepted, self._acquire_once(conn, worker_id, now, max_tasks, changed=True)

    def finish_many(self, worker_id: int, finishes: list[dict], *, next_tasks: bool = False, max_tasks: int = 1,
                    ahead: list[dict] | None = None, held: Sequence[int] = (), release: Sequence[int] = ()) -> dict:
        """Several finishes in one transaction, each fenced by its attempt (chunks.finish_many): `results`.

        Then, in the same transaction: the elements leased ahead the agent gives back (`release`) go back
        to the queue, same attempt; `dropped` names those of `held` it must not start; with `next_tasks`,
        up to `max_tasks` Assignments to start now (`found`, as acquire with wait_s 0), and with `ahead`
        (a list) the elements leased ahead, as acquire_many gives them.
        """
        self.seen(worker_id)
        result = self._write(self._finish_many, worker_id, finishes, self.clock(), next_tasks, max_tasks, ahead, held,
                             release, wake=True)
        self.log_followers.written()  # jobs may have ended: their log followers stop waiting
        return result

    def _finish_many(self, conn: apsw.Connection, worker_id: int, finishes: list[dict], now: float, next_tasks: bool,
                     max_tasks: int, ahead: list[dict] | None, held: Sequence[int], release: Sequence[int]) -> dict:
        results = chunks.finish_many(conn, worker_id, finishes, now, self.pace,
                                     functools.partial(self._adopting(lifecycle.finish),
                                                       keep=self.config.checkpoint_keep))
        if release:
            chunks.requeue(conn, worker_id, now, "given_back", list(release))
        gone = chunks.dropped(conn, worker_id, list(held))
        found = self._acquire_once(conn, worker_id, now, max_tasks if next_tasks else 0, ahead,
                                   [t for t in held if t not in set(gone)], changed=bool(finishes))
        return {"results": results, "found": found, "dropped": gone}

    def record_checkpoint(self, worker_id: int, task_id: int, attempt: int | None, files: list[dict]) -> dict:
        """A periodic checkpoint of a task this worker holds (checkpoints.record: 409s for the rest)."""
        self.seen(worker_id)
        return self._write(checkpoints.record, worker_id, task_id, attempt, files, self.clock(),
                           self.config.checkpoint_keep)

    def deregister(self, worker_id: int) -> int:
        left = self._write(workers.depart, worker_id, "deregistered", self.clock(), wake=True)
        self._forget_principals()
        return left
