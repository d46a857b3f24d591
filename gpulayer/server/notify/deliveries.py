"""The delivery loop's writes, as pure transactions: cursors advanced, tries recorded, webhooks disabled, pruned.

The delivery thread (outbox.py) reads and hands out; what it learns goes to the state file through the
Scheduler's door (scheduler/notifications.py), which runs these in the writer.
"""

from __future__ import annotations

import logging

import apsw

from gpulayer.server.scheduler.events import record as record_event
from gpulayer.server.store.queries import row

log = logging.getLogger("gpulayer.server.notify")
MAX_BACKOFF_S = 3600.0


def advance(conn: apsw.Connection, advances: list[tuple[int, int]]) -> None:
    """Move webhooks' cursors past the events their owners may no longer read (each passed one given up)."""
    for webhook_id, seq in advances:
        row(conn, "advance_webhook", id=webhook_id, seq=seq)
        row(conn, "give_up_passed", id=webhook_id, seq=seq, error="not delivered: the webhook's owner may no longer read this event")


def record(conn: apsw.Connection, done: list[dict], now: float, base_s: float, retry_for_s: float) -> None:
    """What the finished tries did: delivered, failed (retried for too long) or retrying after a backoff."""
    for o in done:
        if o["ok"]:
            status, next_try, seq = "delivered", None, o["seq"]
        elif now - o["first_try_at"] >= retry_for_s:
            status, next_try, seq = "failed", None, o["seq"]
        else:
            wait = min(MAX_BACKOFF_S, base_s * 2 ** (o["attempts"] - 1))
            status, next_try, seq = "retrying", now + wait, o["seq"] - 1
        row(
            conn,
            "delivery_done",
            id=o["id"],
            seq=o["seq"],
            event=o["event"],
            status=status,
            attempts=o["attempts"],
            first_try_at=o["first_try_at"],
            now=now,
            next_try_at=next_try,
            http_status=o["status"],
            error=o["error"],
        )
        row(conn, "advance_webhook", id=o["id"], seq=seq)


def disable(conn: apsw.Connection, hooks: list[dict], now: float) -> None:
    """Disable the webhooks whose owner is gone (removed), each with a `webhook_disabled` event."""
    for hook in hooks:
        reason = f"its owner {hook['owner'] or hook['user_id']} was removed"
        done = row(conn, "disable_webhook", id=hook["id"], reason=reason)
        if done is None:
            continue
        row(conn, "give_up_passed", id=hook["id"], seq=1 << 62, error=f"not delivered: the webhook was disabled ({reason})")
        record_event(conn, now, "webhook_disabled", job_id=done["job_id"], webhook_id=hook["id"], reason=reason)
        log.warning("webhook_disabled webhook=%s reason=%r", hook["id"], reason)


def prune(conn: apsw.Connection, before: float) -> None:
    """Delivery rows older than `before` (the job retention) go."""
    row(conn, "prune_deliveries", before=before)
