"""The scheduler: every state change as one transaction on the writer path.

It knows nothing of HTTP. Time comes from an injected clock (tests pin it).
Changes that can make a queued task placeable wake parked `acquire` calls.
"""
from __future__ import annotations

import threading
from typing import BinaryIO, Callable

import apsw

from gpulayer.server.errors import InvalidRequest, NotFound
from gpulayer.server.replication.restore import skip_lost_event_seqs
from gpulayer.server.runtime import cadence
from gpulayer.server.runtime.gpu_samples import Sample
from gpulayer.server.scheduler import (access, aging, cordons, forecast, gpu_health, gpu_samples, idle, jobcontrol, jobs,
                                       leases, ledger, preemption, provisioning, reservations, secrets, sessions,
                                       teams, tokens, workers)
from gpulayer.server.scheduler.notifications import Notifications, submitted_with_mail
from gpulayer.server.scheduler.services import Services
from gpulayer.server.scheduler.service_updates import ServiceUpdates
from gpulayer.server.scheduler.spec import ValidSpec, priority_number, validate_job
from gpulayer.server.scheduler.worker_requests import WorkerRequests
from gpulayer.server.security.auth import Principal, new_jti, new_token
from gpulayer.server.store.queries import QUERIES

# Who in-process callers (gpulayer.testing, `--target local`) act as: server init's client token's user.
ADMIN = Principal(kind="client", jti="server-client", name="server", user_id=teams.ADMIN_USER_ID, user="admin",
                  admin=True)


class Scheduler(WorkerRequests, Notifications, Services, ServiceUpdates):
    """Facade over the transaction functions, bound to one store, clock and config (facade.Facade).

    An agent's requests are worker_requests.WorkerRequests'; the notification routes' and the delivery thread's
    notifications.Notifications'; services' replicas leaving and autoscaling services.Services'; a service's
    rolling updates service_updates.ServiceUpdates'; the clients', the
    operators', the relay's and upkeep's are here.
    `auth` (token hashes and the principal cache) and `artifacts` (the files)
    are made from the config's home when not given; the front end passes the
    ones it authenticates and serves with, so one cache is invalidated.
    """

    # -- clients -------------------------------------------------------------

    def submit(self, raw_spec, principal: Principal | None = None, project: str | None = None,
               mailbox: dict | None = None) -> int:
        """Validate and queue a JobSpec owned by `principal`'s user in `project` (teams.submit_project; no
        principal: the first admin); returns the job id. `mailbox` (notify.targets.parse_mailbox's): a mailbox
        for the job's events from its first on, added in the same transaction as the job (both or neither).
        Raises InvalidRequest, Forbidden."""
        spec = self._valid_spec(raw_spec)
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
            job_id = self._write(submitted_with_mail, principal, project, spec, self.clock(),
                                 mailbox, self.secret_box, wake=True)
            if cap and bound is not None and generation == self._queued_generation:
                self._queued_bounds[user_id] = bound + adding
            self.cascades.drive([], until_ended=job_id, inline=0)  # its own steps left, if any, before the answer
            return job_id

    def _valid_spec(self, raw_spec) -> ValidSpec:
        """The JobSpec as submit takes it: validated, its grace within --max-grace (InvalidRequest otherwise)."""
        spec = validate_job(raw_spec, self.config.priority_classes)
        if spec.grace_seconds is not None and spec.grace_seconds > self.config.max_grace_s:
            raise InvalidRequest(f"grace_seconds: {spec.grace_seconds:g} is over this server's limit of "
                                 f"{self.config.max_grace_s:g} seconds (--max-grace)", code="grace_above_limit")
        idle.check_timeout(spec.idle_timeout_seconds, self.config.heartbeat_interval_s, "idle_timeout_seconds")
        return spec

    def estimate(self, raw_spec, principal: Principal | None = None, project: str | None = None) -> forecast.Estimate:
        """When a job of this spec would start if `principal` submitted it now (`submit --test-only`): the submit's
        validation and admission (its errors: InvalidRequest, Forbidden, TooManyQueued) and the forward replay,
        on a copy of the state file; nothing is submitted."""
        spec = self._valid_spec(raw_spec)
        principal = principal or ADMIN
        user_id, cap, now = principal.user_id or teams.ADMIN_USER_ID, self.config.max_queued_elements, self.clock()
        copy = self.store.read(forecast.snapshot)
        try:
            if cap:
                jobs.check_queued_elements(copy, principal.user or f"#{user_id}", user_id, len(jobs.elements(spec)), cap)
            return forecast.what_if(copy, lambda conn: teams.submit(conn, principal, project, spec, now), now,
                                    horizon_s=self.config.estimate_horizon_s, max_starts=self.config.estimate_max_jobs)
        finally:
            copy.close()

    def _submitting(self, user_id: int) -> threading.Lock:
        """The lock one user's submits take in turn (TooManyQueued's count and the write)."""
        with self._submit_locks_guard:
            return self._submit_locks.setdefault(user_id, threading.Lock())

    def change_teams(self, fn, *args) -> object:
        """A change to users, projects or memberships (scheduler/teams.py): cached principals are forgotten. A
        project's idle timeout under one GPU sample interval is refused (idle.check_timeout)."""
        for arg in args:
            if isinstance(arg, dict):
                idle.check_timeout(arg.get("idle_timeout_seconds"), self.config.heartbeat_interval_s,
                                   "idle_timeout_seconds")
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

    def job_gpus(self, job_id: int, index: int | None = None) -> dict:
        """`GET /v1/jobs/{id}/gpus`: the GPUs of the job's running tasks and their newest samples
        (gpu_samples.job_usage), in one read; the caller checked the right to read the job."""
        return self.store.read(gpu_samples.job_usage, job_id, index, self.clock())

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

    # -- upkeep --------------------------------------------------------------

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

    def restarted(self) -> dict:
        """At start-up, one transaction: forget the needs_upgrade list; no lease expires within one TTL.

        Returns how many task and worker leases were extended (leases.grace_after_restart).
        """
        return self._write(self._restarted, self.clock())

    def _restarted(self, conn: apsw.Connection, now: float) -> dict:
        # The fleet's interval before the first answer, held one TTL: the process before may have told it.
        self.cadence.fleet(cadence.online_workers(conn), hold=True)
        workers.forget_needs_upgrade(conn, "server_restarted")
        c = self.config
        conn.execute(QUERIES["set_scheduler_settings"], {
            "half_life_s": c.fairshare_half_life_s, "preempt_grace_s": c.preempt_grace_s, "backfill": int(c.backfill),
            "backfill_depth": c.backfill_depth, "backfill_max_jobs": c.backfill_max_jobs,
            "default_runtime_s": c.default_runtime_s})
        return leases.grace_after_restart(conn, now, self.lease_ttl_s())

    def sessions_left_closed(self) -> int:
        """At start: the relay sessions a stopped control plane left open, closed in their rows; how many."""
        return self._write(sessions.restarted, self.clock())

    def skip_lost_event_seqs(self) -> int:
        """At a restored home's first start: event seqs jump past the lost window (replication/restore.py)."""
        return self._write(skip_lost_event_seqs)

    # -- the relay (its loop's clock) ----------------------------------------

    def session_opened(self, to: sessions.Target, user: str, kind: str, detail: dict, now: float) -> int:
        """A relay stream opened: its sessions row and event; its id."""
        return self._write(sessions.opened, to, user, kind, detail, now)

    def session_closed(self, session_id: int, bytes_in: int, bytes_out: int, exit_code: int | None, reason: str,
                       now: float) -> None:
        self._write(sessions.closed, session_id, bytes_in, bytes_out, exit_code, reason, now)

    # -- the provisioning loop (its clock) -------------------------------------

    def provision_open(self, provisioner: str, profile: str, name_for: Callable[[int], str], labels: dict, *,
                       token_hash: str, jti: str, expires_at: float, now: float) -> dict:
        """A provision request and its join token; {id, name} (scheduler/provisioning.py)."""
        return self._write(provisioning.open_request, provisioner=provisioner, profile=profile, name_for=name_for,
                           labels=labels, token_hash=token_hash, jti=jti, expires_at=expires_at, now=now)

    def provision_submitted(self, request_id: int, slurm_job_id: str, now: float) -> None:
        self._write(provisioning.submitted, request_id, slurm_job_id, now)

    def provision_end(self, request_id: int, state: str, error: str, now: float) -> dict | None:
        return self._write(provisioning.end, request_id, state, error, now)

    def provision_attach(self, now: float) -> list[dict]:
        return self._write(provisioning.attach, now)

    def provision_note_error(self, request_id: int, error: str, now: float) -> None:
        self._write(provisioning.note_error, request_id, error, now)

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

    def plan_reservations(self) -> list[dict]:
        """Upkeep: this tick's reservations for EASY backfill, one transaction (reservations.plan): the rows."""
        generation = self._generation
        made = self._write(reservations.plan, self.clock())
        self._planned_generation = generation
        return made

    def preempt(self) -> list[int]:
        """Upkeep's preemption round, one transaction (preemption.preempt): the task ids asked to stop."""
        return self._write(preemption.preempt, self.clock(), self.lease_ttl_s())

    def reclaim_idle(self) -> list[tuple[int, str]]:
        """Upkeep's idle round: the idle tasks read on a reader (idle.idle_tasks), then acted on in one write
        transaction (idle.reclaim): [(task id, warn|notify|requeue|cancel)]."""
        c = self.config
        fleet = idle.Fleet(c.idle_timeout_s, c.idle_below_pct, c.idle_action, c.idle_warning_s,
                           gap_s=2 * c.heartbeat_interval_s + min(c.heartbeat_interval_s, 1.0))
        now = self.clock()
        found = self.store.read(idle.idle_tasks, now, fleet)  # the samples' window read off the writer
        return self._write(idle.reclaim, now, fleet, found) if found else []

    def _expire(self, conn: apsw.Connection, now: float, written: dict[int, float],
                samples: list[Sample]) -> dict:
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
