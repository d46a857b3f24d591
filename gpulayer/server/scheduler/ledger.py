"""The usage ledger and fair share: what each task run used, written in the transaction that ends it.

One `usage` row per run (GPU-seconds, CPU-seconds, outcome), kept through
retention; the same transaction adds the run to its user's decayed usage in
its project (`fairshare`), which acquire reads to order work of the same
priority. A run that ends (its task gets a finished_at, by whatever path:
finish, loss, cancel, a GPU gone bad) is written by the trigger
`tasks_run_ended`, so no path can forget it; a run sent back to the queue (a
preemption, a gang released) is written here, by `record`, before the task is
requeued. A task that never started ran nothing and is charged nothing.
"""
from __future__ import annotations

import json

import apsw

from gpulayer.protocol import parse_duration as duration_seconds
from gpulayer.server.errors import InvalidRequest
from gpulayer.server.store.queries import QUERIES, rows
from gpulayer.server.validators import label_key

USAGE_BY = ("user", "project", "job-name")  # and label:KEY
RUNNING_REFRESH_S = 5.0  # upkeep rewrites fair share's running part this often
DEFAULT_SINCE_S = 30 * 86400.0


def record(conn: apsw.Connection, now: float, task_ids: list[int], outcome: str, preempted_by: int | None = None) -> int:
    """Write the ledger rows of these tasks' runs, ending now, and charge fair share; how many rows.

    For runs that go back to the queue (`outcome` preempted or requeued): call it in
    that transaction, before the requeue, while the task rows still hold their
    `started_at` and worker. (A run that ends is written by the trigger tasks_run_ended.)
    """
    if not task_ids:
        return 0
    charged = rows(conn, "insert_usage", task_ids=json.dumps(task_ids), now=now, outcome=outcome,
                   preempted_by=preempted_by)
    conn.executemany(QUERIES["charge_fairshare"], [{**c, "now": now} for c in charged])
    return len(charged)


def refresh_running(conn: apsw.Connection, now: float) -> None:
    """Rewrite fair share's running part: each (project, user)'s usage so far of the runs still going."""
    conn.execute(QUERIES["clear_fairshare_running"])
    conn.execute(QUERIES["set_fairshare_running"], {"now": now})


def parse_duration(value: str | float | int | None, field: str, default: float) -> float:
    """Seconds in a duration as every option takes it (gpulayer.protocol.parse_duration: 30d, 12h, 90m,
    seconds, Slurm's 1:00:00 or 2-00:00:00); `default` for none. Raises InvalidRequest naming `field`."""
    if value is None or value == "":
        return default
    try:
        return duration_seconds(value)
    except ValueError as exc:
        raise InvalidRequest(f"{field}: {exc}") from None


def report(conn: apsw.Connection, by: str, since_s: float, now: float, *, user_id: int | None = None,
           project_ids: list[int] | None = None, offset: int = 0, limit: int = -1) -> dict:
    """GPU-hours, CPU-hours, runs and jobs per key over the runs that ended in the last `since_s` seconds.

    `by` is user, project, job-name or label:KEY. With `user_id` and/or
    `project_ids`, only runs of that user or of those projects count. A page:
    at most `limit` rows (-1: all) after the first `offset`.
    Raises InvalidRequest for another `by`, and for a KEY that is no label key (the rule of labels at submit).
    """
    label = None
    if by.startswith("label:"):
        label = label_key(by[len("label:"):], "by")
    elif by not in USAGE_BY:
        raise InvalidRequest(f"by: must be one of {', '.join(USAGE_BY)} or label:KEY, not {by!r}")
    since = now - since_s
    found = rows(conn, "usage_report", by="label" if label else by, label=label, since=since, user_id=user_id,
                 project_ids=None if project_ids is None else json.dumps(project_ids), offset=offset, limit=limit)
    return {"by": by, "since": since, "until": now,
            "rows": [{**r, "gpu_hours": round(r["gpu_hours"], 6), "cpu_hours": round(r["cpu_hours"], 6)}
                     for r in found]}


def report_for(conn: apsw.Connection, principal, by: str, since_s: float, now: float, **page) -> dict:
    """`report` as `principal` may see it: an admin everything; a user their own runs and those of the
    projects they manage."""
    if principal.admin:
        return report(conn, by, since_s, now, **page)
    managed = [r["project_id"] for r in rows(conn, "managed_projects", user_id=principal.user_id)]
    return report(conn, by, since_s, now, user_id=principal.user_id if principal.user_id is not None else -1,
                  project_ids=managed, **page)
