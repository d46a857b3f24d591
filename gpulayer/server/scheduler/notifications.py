"""The Scheduler's notification calls: webhooks and alerts added and removed, and the delivery thread's writes.

The transactions are server/notify/'s (targets.py: the /v1/webhooks and /v1/alerts changes; deliveries.py:
cursors, tries, disabled webhooks, pruning; alerts.py: a run's digests and its `alert_fired` event). This is
their door into the writer, as every other write's (facade.Facade._write): nothing outside the scheduler and
the store calls `Store.write` (tests/unit/test_write_door.py).
"""
from __future__ import annotations

from gpulayer.server.notify import alerts, deliveries, targets
from gpulayer.server.scheduler import teams
from gpulayer.server.scheduler.facade import Facade
from gpulayer.server.security.auth import Principal


def submitted_with_mail(conn, principal: Principal, project: str | None, spec, now: float, mailbox: dict | None,
                        box) -> int:
    """The submit's transaction (teams.submit) and, when `mailbox`, the job's mailbox in it: one write, both
    or neither. The mailbox reads the job's events from its first on, so nothing is missed."""
    job_id = teams.submit(conn, principal, project, spec, now)
    if mailbox is not None:
        targets.add_webhook(conn, principal, box, {**mailbox, "job": job_id}, now)
    return job_id


class Notifications(Facade):
    """The calls of the notification routes and of the delivery thread (notify/outbox.py's Notifier)."""

    # -- the routes ----------------------------------------------------------

    def add_webhook(self, principal: Principal, spec: dict) -> dict:
        """A webhook or mailbox for what `principal` may read, answered with its secret (shown once)."""
        return self._write(targets.add_webhook, principal, self.secret_box, spec, self.clock())

    def remove_webhook(self, principal: Principal, webhook_id: int) -> None:
        self._write(targets.remove_webhook, principal, webhook_id, self.clock())

    def add_alert(self, principal: Principal, spec: dict) -> dict:
        return self._write(targets.add_alert, principal, spec, self.clock())

    def remove_alert(self, principal: Principal, name: str) -> None:
        self._write(targets.remove_alert, principal, name, self.clock())

    # -- the delivery thread (its tick's `now`) --------------------------------

    def advance_webhooks(self, advances: list[tuple[int, int]]) -> None:
        """Cursors moved past events the webhooks' owners may no longer read."""
        self._write(deliveries.advance, advances)

    def record_deliveries(self, done: list[dict], now: float) -> None:
        """What finished tries did: delivered, failed, or retrying after the configured backoff."""
        self._write(deliveries.record, done, now, self.config.webhook_retry_base_s, self.config.webhook_retry_for_s)

    def disable_webhooks(self, hooks: list[dict], now: float) -> None:
        """Webhooks whose owner is gone, disabled, each with a `webhook_disabled` event."""
        self._write(deliveries.disable, hooks, now)

    def prune_deliveries(self, before: float) -> None:
        self._write(deliveries.prune, before)

    def alert_ran(self, alert: dict, now: float, columns: list[str], found: list[tuple] | None,
                  error: str | None) -> int:
        """One run of `alert` recorded (alerts.ran); how many of its rows were new (it fired on them)."""
        return self._write(alerts.ran, alert, now, columns, found, error)
