"""The scheduler: every state change as one transaction on the writer path.

It knows nothing of HTTP. Time comes from an injected clock (tests pin it).
Changes that can make a queued task placeable wake parked `acquire` calls.
"""
from __future__ import annotations

import functools
import logging
import threading
import time
from functools import cached_property
from typing import BinaryIO, Callable, Sequence

import apsw

from gpulayer.server.config import MAX_ACQUIRE_WAIT_S, ControlPlaneConfig
from gpulayer.server.errors import InvalidRequest, NotFound
from gpulayer.server.scheduler import (access, aging, cascades, chunks, cordons, gauges, gpu_health, ingress,
                                       jobcontrol, jobs, leases,
                                       ledger, lifecycle, outcomes, placement, preemption, reconcile, renewals,
                                       secrets, sessions, teams, tokens, workers)
from gpulayer.server.scheduler import cadence, checkpoints, gpu_samples
from gpulayer.server.scheduler.follow import LogFollowers
from gpulayer.server.scheduler.spec import priority_number, validate_job
from gpulayer.server.security.auth import Authenticator, Principal, new_jti, new_token
from gpulayer.server.security.secretbox import SecretBox
from gpulayer.server.store.artifacts import ArtifactStore
from gpulayer.server.store.db import Store
from gpulayer.server.store.queries import QUERIES

log = logging.getLogger("gpulayer.server.scheduler.core")
# Who in-process callers (gpulayer.testing, `--target local`) act as: server init's client token's user.
ADMIN = Principal(kind="client", jti="server-client", name="server", user_id=teams.ADMIN_USER_ID, user="admin",
                  admin=True)


class Scheduler:
    """Facade over the transaction functions, bound to one store, clock and config.

    `auth` (token hashes and the principal cache) and `artifacts` (the files)
    are made from the config's home when not given; the front end passes the
    ones it authenticates and serves with, so one cache is invalidated.
    """

    def __init__(self, store: Store, config: ControlPlaneConfig, clock: Callable[[], float] = time.time, *,
                 auth: Authenticator | None = None, artifacts: ArtifactStore | None = None):
        self.store = store
        self.config = config
        self.clock = clock
        if auth is not None:
            self.auth = auth
            auth.on_invalidate(self._rights_changed)
        if artifacts is not None:
            self.artifacts = artifacts
        self.secret_box = SecretBox(config.layout)
        self.log_followers = LogFollowers(store, config.max_parked_log_polls)
        self._wake = threading.Condition()
        self._generation = 0
        self._parked = threading.BoundedSemaphore(max(1, config.max_parked_acquires))
        self._closing = False
        self._waiting = 0  # acquires inside self._wake.wait(): what a wake() reaches now
        self.observe_acquire: Callable[[float], None] = lambda seconds: None
        # Set when this plane was restored from a replica (ControlPlane.start): heartbeats reconcile against it.
        self.restored: reconcile.Restored | None = None
        # Big cancels, cascades and releases: one bounded write a step (scheduler/cascades.py).
        self.cascades = cascades.Cascades(store, outcomes.run_step, clock, after_step=self._cascade_stepped)
        self._cascades_recovered = False
        self._submit_locks: dict[int, threading.Lock] = {}
        self._submit_locks_guard = threading.Lock()
        # Per user, a number no smaller than their tasks not yet ended (the cap's count plus what they submitted
        # since): a submit that stays under the cap with it needs no count. Only submits add such tasks, but for
        # `job requeue`, which forgets them all (the generation: a count taken before a requeue is not kept).
        self._queued_bounds: dict[int, int] = {}
        self._queued_generation = 0
        # Lease renewals not yet in SQL: heartbeats that change nothing and other worker requests (renewals.py).
        self.renewals = renewals.Renewals()
        # GPU samples heartbeats brought, written with the renewals at each upkeep tick (gpu_samples.py).
        self.gpu_samples = gpu_samples.Buffer()
        # The heartbeat interval asked for and the lease TTL given, scaled with the online fleet (cadence.py).
        self.cadence = cadence.Cadence(config.heartbeat_interval_s, config.lease_ttl_s, config.max_heartbeats_per_s,
                                       config.heartbeat_jitter, clock)
        # Each array job's recent element run time, for how many elements to lease ahead (chunks.py).
        self.pace = chunks.Pace()
        # Workers whose relay link a client waits for (sessions.py): told `relay: true`.
        self.relay = sessions.Wants(self.wake)
        # Requests and bytes through the services' ingress (ingress.py; the proxy is server/relay/ingress.py).
        self.ingress = ingress.Counters()

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

    def gauges(self) -> dict:
        """The state file's counts that /metrics reports, read now (scheduler/gauges.py, `snapshot`)."""
        return self.store.read(gauges.snapshot)

    @cached_property
    def auth(self) -> Authenticator:
        made = Authenticator(self.config.layout, self.store, QUERIES)
        made.on_invalidate(self._rights_changed)
        return made

    def _rights_changed(self) -> None:
        """Principals changed (auth.invalidate): parked log follows and acquires wake to re-check their caller."""
        self.wake()
        self.log_followers.written()

    @cached_property
    def artifacts(self) -> ArtifactStore:
        return ArtifactStore(self.config.layout.artifacts)

    def _write(self, fn, *args, wake: bool = False, until_ended: int | None = None,
               inline: int = cascades.INLINE_STEPS, **kwargs):
        """fn in a write; then the cascade steps it asked for (cascades.Cascades.drive: `inline` of them
        here, and those of job `until_ended` until it has ended; the rest on the cascade thread)."""
        with cascades.collecting() as steps:
            result = self.store.write(fn, *args, **kwargs)
        if wake:
            self.wake()
        if steps:
            self.cascades.drive(steps, until_ended, inline)
        return result

    def _cascade_stepped(self) -> None:
        """A cascade step committed: it may have released tasks (acquires look again) or ended jobs."""
        self.wake()
        self.log_followers.written()

    def resume_cascades(self) -> int:
        """At start, then each upkeep tick: queue what a stopped control plane's cascades left undone (at
        start: `cascades_pending`), and run what is queued; returns how many steps were found at start."""
        found = 0
        if not self._cascades_recovered:
            self._cascades_recovered = True
            pending = self.store.read(lambda conn: conn.execute(QUERIES["cascades_pending"]).fetchall())
            found = len(pending)
            self.cascades.add((p["kind"], p["job_id"], -1 if p["arg"] is None else p["arg"]) for p in pending)
        self.cascades.resume()
        return found

    # -- clients -------------------------------------------------------------

    def submit(self, raw_spec, principal: Principal | None = None, project: str | None = None) -> int:
        """Validate and queue a JobSpec owned by `principal`'s user in `project` (teams.submit_project; no
        principal: the first admin); returns the job id. Raises InvalidRequest, Forbidden."""
        spec = validate_job(raw_spec, self.config.priority_classes)
        if spec.grace_seconds is not None and spec.grace_seconds > self.config.max_grace_s:
            raise InvalidRequest(f"grace_seconds: {spec.grace_seconds:g} is over this server's limit of "
                                 f"{self.config.max_grace_s:g} seconds (--max-grace)", code="grace_above_limit")
        principal = principal or ADMIN
        cap = self.config.max_queued_elements
        # The cap is counted on a reader (a walk of up to `cap` index entries, off the writer); one
        # user's submits take turns from the count to the last of a big array's elements made
        # (outcomes.insert_step, a write each), so none passes it beside another.
        user_id = principal.user_id or teams.ADMIN_USER_ID
        with self._submitting(user_id):
            adding, generation = len(jobs.elements(spec)), self._queued_generation
            bound = self._queued_bounds.pop(user_id, None)
            if cap and (bound is None or bound + adding > cap):  # counted, on a reader (raises TooManyQueued)
                bound = self.store.read(jobs.check_queued_elements, principal.user or f"#{user_id}", user_id,
                                        adding, cap)
            job_id = self._write(teams.submit, principal, project, spec, self.clock(), wake=True)
            if cap and bound is not None and generation == self._queued_generation:
                self._queued_bounds[user_id] = bound + adding
            self.cascades.drive([], until_ended=job_id, inline=0)  # its own steps left, if any, before the answer
            return job_id

    def _submitting(self, user_id: int) -> threading.Lock:
        """The lock one user's submits take in turn (TooManyQueued's count and the write)."""
        with self._submit_locks_guard:
            return self._submit_locks.setdefault(user_id, threading.Lock())

    def change_teams(self, fn, *args) -> object:
        """A change to users, projects or memberships (scheduler/teams.py): cached principals are forgotten."""
        try:
            return self._write(fn, *args, self.clock())
        finally:
            self._forget_principals()

    def cancel(self, job_id: int, index: int | None = None) -> bool:
        """Cancel a job, or one element of an array (`index`); False when it had ended already."""
        if index is not None:
            cancelled = self._write(jobs.cancel_element, job_id, index, self.clock(), wake=True)
        else:
            cancelled = self._write(jobs.cancel, job_id, self.clock(), wake=True, until_ended=job_id)
        self.log_followers.written()  # the job may have ended: its log followers stop waiting
        return cancelled

    @property
    def parked_log_polls(self) -> int:
        """How many log long-polls wait on new lines now."""
        return self.log_followers.parked

    def wait_for_logs(self, job_id: int, after: int, limit: int, wait_s: float, index: int | None = None,
                      check: Callable[[], object] | None = None) -> tuple[list[dict], bool, bool]:
        """Log lines after `after` (of element `index` alone, if given), long-polled up to wait_s; whether the
        job (element) had ended with them its last; False when too many wait already (LogFollowers.wait:
        `check` raises once the caller may no longer read them; NotFound for no such job or element)."""
        return self.log_followers.wait(job_id, after, limit, wait_s, index, check)

    def set_secret(self, name: str, value, labels, project_id: int = teams.DEFAULT_PROJECT_ID) -> dict:
        """Validate and store a project's secret (encrypted); a job waiting for it may now be placed.
        Raises InvalidRequest."""
        value, labels = secrets.check(name, value, labels)
        self._write(secrets.put, self.secret_box, name, value, labels, self.clock(), project_id, wake=True)
        return {"name": name, "labels": labels}

    def delete_secret(self, name: str, project_id: int = teams.DEFAULT_PROJECT_ID) -> None:
        """Raises NotFound for no such secret."""
        self._write(secrets.delete, name, self.clock(), project_id)

    # -- tokens --------------------------------------------------------------

    def mint_token(self, *, name: str, labels: dict, expires_in_s: float | None, kind: str = "join",
                   source: str = "minted", user: str | None = None) -> dict:
        """A new join, metrics or (for `user`) client token bound to a name and labels; the secret is returned
        once, only here. Raises NotFound for no such user."""
        secret, jti, now = new_token(kind), new_jti(), self.clock()
        expires_at = None if expires_in_s is None else now + expires_in_s
        self._write(tokens.insert, jti=jti, kind=kind, name=name, labels=labels, token_hash=self.auth.hash(secret),
                    expires_at=expires_at, source=source, now=now, user=user)
        return {"token": secret, "jti": jti, "name": name, "labels": labels, "kind": kind, "expires_at": expires_at,
                **({"user": user} if user else {})}

    def revoke_token(self, jti: str) -> dict:
        """Revoke a minted token and cut off the workers that joined with it; the token as it is now.

        Raises NotFound for no such token. Revoking one already revoked changes nothing.
        """
        if self.store.read(tokens.get, jti) is None:
            raise NotFound(f"no token with jti {jti!r}")
        result = self._write(workers.revoke_token, jti, self.clock(), wake=True)
        self._forget_principals()
        return {**self.store.read(tokens.get, jti), "workers_revoked": (result or {}).get("workers", [])}

    def _forget_principals(self) -> None:
        if "auth" in self.__dict__:  # no authenticator made yet: nothing cached to forget
            self.auth.invalidate()

    # -- artifacts -----------------------------------------------------------

    def check_artifact_read(self, principal: Principal, digest: str) -> None:
        """Raises Forbidden when the caller may not download `digest` (access.check_read)."""
        self.store.read(access.check_read, principal, digest)

    def check_artifact_probe(self, principal: Principal, digest: str) -> bool:
        """Whether the caller may learn that `digest` is stored (access.check_probe): False answers 404."""
        return self.store.read(access.check_probe, principal, digest)

    def put_artifact(self, principal: Principal, digest: str, stream: BinaryIO, length: int | None) -> int:
        """Store an upload; its size. A worker uploads only task outputs and checkpoints, up to `max_output_bytes`;
        a user within its upload quotas (access.quota_left).

        Raises Forbidden when a worker holds no active task, BodyTooLarge past the limit or a quota
        (nothing stored), and what ArtifactStore.put raises.
        """
        if principal.kind == "worker":
            limit = self.config.max_output_bytes
            self.store.read(access.check_upload, principal, length, limit)
            stream = access.Capped(stream, limit)  # type: ignore[assignment]  # put() only reads it
        quota = self.store.read(access.quota_left, principal, length, self.config.upload_quota_bytes,
                                self.config.project_upload_quota_bytes)
        if quota is not None:
            stream = access.Capped(stream, *quota)  # type: ignore[assignment]  # put() only reads it

        def record(digest: str, size: int) -> None:
            self._write(access.record, digest, size, self.clock(), principal)
        # Recorded under the digest's lock, so the artifact sweep cannot unlink the file in between.
        return self.artifacts.put(digest, stream, length, record=record)

    def record_artifact(self, digest: str, size: int) -> None:
        self._write(access.record, digest, size, self.clock())

    # -- workers -------------------------------------------------------------

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
            if answer.get("reset_gpus"):
                self.wake()
        if samples and answer["lease_expires_at"] is not None:
            self.gpu_samples.add(worker_id, samples, now)
        return answer

    def job_gpus(self, job_id: int, index: int | None = None) -> dict:
        """`GET /v1/jobs/{id}/gpus`: the GPUs of the job's running tasks and their newest samples
        (gpu_samples.job_usage), in one read; the caller checked the right to read the job."""
        return self.store.read(gpu_samples.job_usage, job_id, index, self.clock())

    def heartbeat_terms(self, worker_id: int | None = None) -> dict:
        """What register and heartbeat answers tell an agent of its heartbeats (docs/protocol.md): the interval
        wanted, and that any successful worker request renews its leases (so an idle one may skip a beat)."""
        return {"heartbeat_interval_s": self.cadence.interval_s(worker_id), "requests_renew_lease": True}

    def lease_ttl_s(self) -> float:
        """The TTL a renewal gives now: the configured one scaled with the fleet (cadence.py)."""
        return self.cadence.lease_ttl_s()

    def seen(self, worker_id: int) -> None:
        """A worker request other than a heartbeat: it renews the worker's leases as one would (renewals.py)."""
        self.renewals.note(worker_id, self.clock())

    # -- taking workers and GPUs out of service -------------------------------

    def cordon(self, ref: str, reason: str, *, drain: bool = False, timeout_s: float | None = None) -> dict:
        """Cordon (or drain) the worker named by id or name; its cordon. Raises NotFound, Conflict."""
        return self._write(cordons.cordon, ref, reason, self.clock(), drain=drain, timeout_s=timeout_s)

    def uncordon(self, ref: str) -> dict:
        """Put the worker back into service: queued work may now go there."""
        return self._write(cordons.uncordon, ref, self.clock(), wake=True)

    def advance_drains(self) -> int:
        """Upkeep: drained workers marked, drains past their deadline stopped (cordons.advance_drains)."""
        done = self._write(cordons.advance_drains, self.clock())
        if done:
            self.wake()
            self.log_followers.written()  # a stopped task may have ended its job
        return done

    def gpu_reset(self, ref: str, index: int) -> dict:
        """Mark a worker's GPU healthy again (its agent forgets the fault on its next heartbeat)."""
        return self._write(self._gpu_reset, ref, index, self.clock(), wake=True)

    @staticmethod
    def _gpu_reset(conn: apsw.Connection, ref: str, index: int, now: float) -> dict:
        return gpu_health.reset(conn, cordons.resolve(conn, ref), index, now)

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
                      ahead: list[dict] | None = None, held: Sequence[int] = ()) -> list[dict]:
        """One acquire transaction: the Assignments, built in the same transaction (maybe none); with `ahead`,
        the elements leased ahead too (chunks.lease_ahead, and those held ahead the agent does not name)."""
        taken = placement.acquire_many(conn, worker_id, now, self.lease_ttl_s(), max_tasks) if max_tasks else []
        if ahead is not None:
            ahead.clear()  # a write retried starts again
            leased = set(chunks.lease_ahead(conn, worker_id, now, self.lease_ttl_s(), self.pace))
            known = set(held)
            ahead += [self._assignment(conn, task_id) for task_id in chunks.held_ahead(conn, worker_id)
                      if task_id in leased or task_id not in known]
        return [self._assignment(conn, task_id) for task_id in taken]

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
                                   [t for t in held if t not in set(gone)])
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

    # -- upkeep --------------------------------------------------------------

    def restarted(self) -> dict:
        """At start-up, one transaction: forget the needs_upgrade list; no lease expires within one TTL.

        Returns how many task and worker leases were extended (leases.grace_after_restart).
        """
        return self._write(self._restarted, self.clock())

    def _restarted(self, conn: apsw.Connection, now: float) -> dict:
        # The fleet's interval before the first answer, held one TTL: the process before may have told it.
        self.cadence.fleet(cadence.online_workers(conn), hold=True)
        workers.forget_needs_upgrade(conn, "server_restarted")
        conn.execute(QUERIES["set_scheduler_settings"], {"half_life_s": self.config.fairshare_half_life_s,
                                                         "preempt_grace_s": self.config.preempt_grace_s})
        return leases.grace_after_restart(conn, now, self.lease_ttl_s())

    def refresh_fairshare(self) -> None:
        """Upkeep: fair share's running part rewritten (ledger.refresh_running), one transaction."""
        self._write(ledger.refresh_running, self.clock())

    def age_queue(self, max_batches: int = 100) -> int:
        """Upkeep: raise the age boost of the queued tasks due one (aging.age), a bounded batch per transaction,
        until none is due or `max_batches` were written (the rest at the next round); how many were raised."""
        raised = 0
        for _ in range(max_batches):
            done = self._write(aging.age, self.clock())
            raised += done
            if done < aging.AGING_BATCH:
                break
        return raised

    def begin_due(self) -> int:
        """Upkeep: the waiting jobs whose begin time came run, unless they wait for more (jobcontrol.begin_due)."""
        return self._write(jobcontrol.begin_due, self.clock(), wake=True)

    def hold(self, job_id: int) -> bool:
        """`job hold` (jobcontrol.hold): False when it was held already."""
        return self._write(jobcontrol.hold, self.clock(), job_id)

    def release(self, job_id: int) -> bool:
        """`job release` (jobcontrol.release): False when it was not held."""
        return self._write(jobcontrol.release, self.clock(), job_id, wake=True)

    def requeue(self, job_id: int, index: int | None = None, hold: bool = False) -> dict:
        """`job requeue` (jobcontrol.requeue): ended tasks not ended again, which no submit's cap has counted."""
        self._queued_generation += 1
        self._queued_bounds.clear()
        try:
            return self._write(jobcontrol.requeue, self.clock(), job_id, index, hold, wake=True)
        finally:
            self._queued_generation += 1
            self._queued_bounds.clear()

    def update_job(self, principal: Principal, job_id: int, changes: dict) -> dict:
        """`job update` (jobcontrol.update): what changed (a priority class's name as its number)."""
        if "priority" in changes:
            changes = {**changes, "priority": priority_number(changes["priority"], self.config.priority_classes)}
        return self._write(jobcontrol.update, principal, self.clock(), job_id, changes, wake=True)

    def preempt(self) -> list[int]:
        """Upkeep's preemption round, one transaction (preemption.preempt): the task ids asked to stop."""
        return self._write(preemption.preempt, self.clock(), self.lease_ttl_s())

    def _expire(self, conn: apsw.Connection, now: float, written: dict[int, float],
                samples: list[gpu_samples.Sample]) -> dict:
        written.update(self.renewals.pending())  # on the writer: every note made before it
        gpu_samples.flush(conn, samples)  # the tick's GPU samples, one statement (not counted in the result)
        result = leases.expire(conn, now, self.config.start_timeout_s, written, self.lease_ttl_s())
        self.cadence.fleet(cadence.online_workers(conn))
        return result

    def usage(self, principal: Principal | None, by: str = "user", since: str | float | None = None,
              offset: int = 0, limit: int = -1) -> dict:
        """The usage ledger summed per `by` over `since` (ledger.report_for; none: the last 30 days); a page of
        at most `limit` rows (-1: all) after the first `offset`.

        Raises InvalidRequest for a bad `by` or `since`.
        """
        since_s = ledger.parse_duration(since, "since", ledger.DEFAULT_SINCE_S)
        return self.store.read(ledger.report_for, principal or ADMIN, by, since_s, self.clock(), offset=offset,
                               limit=limit)

    def expire(self) -> dict:
        """Expire leases and release gangs not started in time (run by upkeep), in one transaction.

        It writes the renewals noted in memory first (renewals.py): each upkeep tick is their flush, and
        the GPU samples buffered since the last tick's (gpu_samples.py; put back if it fails).
        """
        written: dict[int, float] = {}
        samples = self.gpu_samples.take()
        try:
            result = self._write(self._expire, self.clock(), written, samples)
        except BaseException:
            self.gpu_samples.put_back(samples)
            raise
        self.renewals.flushed(written)
        if any(result.values()):
            self.wake()
            self.log_followers.written()  # a lost task may have ended its job
        return result

