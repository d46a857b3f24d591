"""Alerts: a read-only query run on a schedule that fires when it returns rows it did not return last time.

The query runs as the explorer's do (store/readonly_sql.py: a `mode=ro`, query_only connection with an
authorizer, one statement, a time limit and a row limit). What it returned is kept as one digest per row
(`alerts.seen`); a run whose rows include digests the last run did not have writes an `alert_fired` event
with those rows, in the same transaction as the new `seen`, and the outbox delivers it to the alert's
webhook or mailbox. A row that stays is not told twice; one that goes and comes back is.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable

import apsw

from gpulayer.server.errors import InvalidRequest
from gpulayer.server.scheduler import events
from gpulayer.server.store.db import Store
from gpulayer.server.store.queries import row, rows
from gpulayer.server.store.readonly_sql import QueryError, QueryTimeout, ReadOnlyDatabase

log = logging.getLogger("gpulayer.server.notify")
MAX_ROWS = 1000  # rows one run reads (past it the rest count as not returned)
MAX_FIRED_ROWS = 100  # rows one alert_fired event carries (the count says how many were new)


def digest(values) -> str:
    return hashlib.sha256(json.dumps(list(values), default=str).encode()).hexdigest()[:32]


def run_query(db: ReadOnlyDatabase, sql: str) -> tuple[list[str], list[tuple]]:
    """(columns, rows) of one read-only statement; raises QueryError (QueryTimeout past the limit)."""
    with db.session() as session:
        result = session.query(sql, max_rows=MAX_ROWS)
    return result.columns, result.rows


def check_sql(db: ReadOnlyDatabase, sql: str) -> None:
    """Run the query once, as the alert will: 400 for a query that writes, fails or runs past the limit."""
    try:
        run_query(db, sql)
    except QueryTimeout as e:
        raise InvalidRequest(f"sql: {e} (an alert's query must answer within {db.time_limit_s:g} s)", field="sql", code="query_too_slow") from None
    except QueryError as e:
        raise InvalidRequest(f"sql: {_for_alerts(str(e), sql)}", field="sql") from None


def _for_alerts(message: str, sql: str) -> str:
    """The explorer's refusal (store/readonly_sql.py) in an alert's words: what was refused, not the explorer."""
    verb = (sql.split() or ["this"])[0].upper()
    writes = f"an alert's query is read-only: {verb} would write to the state file (give one SELECT)"
    message = message.replace("the explorer is read-only: this statement would write", writes)
    return message.replace("the explorer is read-only", "an alert's query is read-only").replace("in the explorer", "in an alert's query")


def ran(conn: apsw.Connection, alert: dict, now: float, columns: list[str], found: list[tuple] | None, error: str | None) -> int:
    """Record one run of `alert` (its rows, or the error that stopped it); returns the new rows it fired on."""
    seen = set(json.loads(alert["seen"]))
    new: list[dict] = []
    digests = alert["seen"]
    if found is not None:
        now_seen = [digest(r) for r in found]
        new = [dict(zip(columns, r)) for r, d in zip(found, now_seen) if d not in seen]
        digests = json.dumps(sorted(set(now_seen)))
    if row(conn, "alert_ran", id=alert["id"], seen=digests, next_run_at=now + alert["every_s"], now=now, error=error, fired=1 if new else 0) is None:
        return 0  # removed meanwhile
    if new:
        events.record(
            conn,
            now,
            "alert_fired",
            alert_id=alert["id"],
            name=alert["name"],
            webhook_id=alert["webhook_id"],
            new=len(new),
            columns=columns,
            rows=json.loads(json.dumps(new[:MAX_FIRED_ROWS], default=str)),
        )
    return len(new)


def run_due(store: Store, db: ReadOnlyDatabase, now: float, record: Callable[..., int]) -> int:
    """Run every alert that is due; returns how many fired. `record(alert, now, columns, found, error)` writes
    a run (`ran`, through the Scheduler's door: Scheduler.alert_ran) and says how many rows were new."""
    fired = 0
    for alert in store.read(lambda conn: rows(conn, "due_alerts", now=now)):
        columns: list[str] = []
        found: list[tuple] | None = None
        error = None
        try:
            columns, found = run_query(db, alert["sql"])
        except QueryError as e:
            error = str(e)[:500]
            log.warning("alert_failed name=%s error=%r", alert["name"], error)
        except apsw.Error as e:  # the file busy or gone for a moment: the next run tries again
            error = f"{type(e).__name__}: {e}"[:500]
        n = record(alert, now, columns, found, error)
        if n:
            log.info("alert_fired name=%s new_rows=%d", alert["name"], n)
            fired += 1
    return fired
