"""The scheduler's calls for a service's rolling updates (issue 39; scheduler/rollout.py): `service update`,
`promote`, `rollback` on the writer path, the rollout's history on a reader, and upkeep's `rollouts` step."""
from __future__ import annotations

from gpulayer.server.scheduler import rollout
from gpulayer.server.scheduler.facade import Facade


class ServiceUpdates(Facade):
    """Rolling updates of a service on the writer path (each call one transaction: all or nothing)."""

    #: The soonest readiness deadline of a rollout's new replica (rollout.next_deadline, the clock's time), as the
    #: last `advance_rollouts` read it; None when none is pending.
    ready_deadline: float | None = None

    def update_service(self, job_id: int, update: rollout.Update) -> dict:
        """`service update` (rollout.start): the new revision's row; upkeep rolls it out."""
        made = self._write(rollout.start, self.clock(), job_id, update, self.config.priority_classes)
        self.advance_rollouts()  # its first surge now, not at the next tick
        return made

    def promote_service(self, job_id: int) -> dict:
        """`service promote` (rollout.promote): a canary's rollout goes on."""
        done = self._write(rollout.promote, self.clock(), job_id)
        self.advance_rollouts()
        return done

    def rollback_service(self, job_id: int) -> dict:
        """`service rollback` (rollout.rollback): the rollout under way turns around."""
        done = self._write(rollout.rollback, self.clock(), job_id)
        self.advance_rollouts()
        return done

    def service_revisions(self, job_id: int) -> dict:
        """GET /v1/jobs/{id}/service (rollout.history), on a reader."""
        return self.store.read(rollout.history, job_id)

    def advance_rollouts(self) -> int:
        """Upkeep: one round of every rollout's moves (rollout.advance); the moves made. No write (a read, off the
        writer) while no rollout is under way."""
        if not self.store.read(rollout.under_way):
            self.ready_deadline = None
            return 0
        moved = self._write(rollout.advance, self.clock(), wake=True)
        if moved:
            self.log_followers.written()  # a rolled-back replica may have ended
        self.ready_deadline = self.store.read(rollout.next_deadline)
        return moved

    def rollout_due_in(self) -> float | None:
        """Upkeep: seconds until a rollout's new replica reaches its readiness deadline (`ready_deadline`; 0 when
        past), None when none waits: the `rollouts` job's next run is then, not a whole tick later."""
        due = self.ready_deadline
        return None if due is None else max(0.0, due - self.clock())
