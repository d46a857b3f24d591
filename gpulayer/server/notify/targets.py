"""Webhooks, mailboxes and alerts: added, listed and removed in transactions, with who may do what.

Owners, managers and admins add a webhook for what they may read: one job (`job`: whoever may read its
logs), a project (`project`: its managers and admins; it fires for all its jobs), else an admin's fires
for everything (worker and GPU events included) and a user's for the jobs that user submits. Alerts are
admins' only: their SQL reads the whole state file, as the explorer's does (docs/explorer.md).
"""

from __future__ import annotations

import json
import re

import apsw

from gpulayer.server.errors import Conflict, Forbidden, InvalidRequest, NotFound
from gpulayer.server.notify import names, send, signing
from gpulayer.server.scheduler import events, teams
from gpulayer.server.security.secretbox import SecretBox
from gpulayer.server.store.queries import one, row, rows

EMAIL = re.compile(r"[^@\s<>(),;:\"\[\]]{1,64}@[A-Za-z0-9.-]{1,253}\.[A-Za-z]{2,63}")
FORMATS = ("standard", "slack")
WEBHOOK_FIELDS = {"url", "email", "events", "format", "project", "job", "mail_type"}
MIN_EVERY_S, MAX_EVERY_S = 10.0, 7 * 86400.0
MAX_SQL = 20_000


def check_email(value, field: str = "email") -> str:
    if not isinstance(value, str) or not EMAIL.fullmatch(value):
        raise InvalidRequest(f"{field}: must be one mail address (name@example.org), not {value!r}", field=field)
    return value


def check_events(value, mail_type=None) -> list[str]:
    """The public names asked for (`events`, or `mail_type`: Slurm's BEGIN, END, FAIL, REQUEUE, ALL)."""
    if mail_type is not None:
        if not isinstance(mail_type, list) or not mail_type or not all(isinstance(m, str) for m in mail_type):
            raise InvalidRequest("mail_type: must be a list of BEGIN, END, FAIL, REQUEUE, ALL", field="mail_type")
        unknown = [m for m in mail_type if m.upper() not in names.MAIL_TYPES]
        if unknown:
            raise InvalidRequest(f"mail_type: unknown {unknown[0]!r}: one of BEGIN, END, FAIL, REQUEUE, ALL", field="mail_type")
        return sorted({n for m in mail_type for n in names.MAIL_TYPES[m.upper()]})
    if not isinstance(value, list) or not value or not all(isinstance(n, str) for n in value):
        raise InvalidRequest("events: must be a non-empty list of event names (job.failed, ...)", field="events")
    unknown = [n for n in value if n not in names.EVENTS]
    if unknown:
        raise InvalidRequest(f"events: unknown event {unknown[0][:64]!r}; known: {', '.join(names.EVENTS)}", field="events")
    return sorted(set(value))


def parse_webhook(body: dict, *, allow_private: bool, smtp: bool) -> dict:
    """A webhook request checked: url or email, events, format, project or job. Raises InvalidRequest."""
    unknown = set(body) - WEBHOOK_FIELDS
    if unknown:
        raise InvalidRequest(f"unknown field {sorted(unknown)[0]}", field=sorted(unknown)[0])
    url, email = body.get("url"), body.get("email")
    if (url is None) == (email is None):
        raise InvalidRequest("url: give a url (a webhook) or an email (a mailbox), one of them", field="url")
    if url is not None:
        send.check_url(url)
    else:
        check_email(email)
        if not smtp:
            raise InvalidRequest("email: this control plane sends no mail (start it with --smtp-url)", field="email")
    found = check_events(body.get("events"), body.get("mail_type"))
    fmt = body.get("format", "standard")
    if fmt not in FORMATS:
        raise InvalidRequest(f"format: must be standard or slack, not {str(fmt)[:32]!r}", field="format")
    project, job = body.get("project"), body.get("job")
    if project is not None and job is not None:
        raise InvalidRequest("job: give a project or a job, not both", field="job")
    if job is not None and (not isinstance(job, int) or isinstance(job, bool) or not 0 < job < 1 << 62):
        raise InvalidRequest("job: must be a job id", field="job")
    if project is not None:
        teams.check_name(project, "project")
    if url is not None:  # last: the one check that asks DNS
        _, host, port, _ = send.check_url(url)
        send.resolve(host, port, allow_private)
    return {"url": url, "email": email, "events": found, "format": "email" if email else fmt, "project": project, "job": job}


def parse_mailbox(mail, *, smtp: bool) -> dict | None:
    """A submit's `mail` ({`email`, `mail_type`}, beside the JobSpec) as a mailbox request for the job it
    makes, checked as parse_webhook checks one (`smtp`: the control plane sends mail) before the job is
    made; None for none. Raises InvalidRequest naming `mail.<field>`."""
    if mail is None:
        return None
    if not isinstance(mail, dict) or set(mail) - {"email", "mail_type"}:
        raise InvalidRequest('mail: must be {"email": ADDR, "mail_type": [BEGIN|END|FAIL|REQUEUE|ALL]}', field="mail")
    try:
        return parse_webhook(dict(mail), allow_private=False, smtp=smtp)
    except InvalidRequest as exc:
        raise InvalidRequest(f"mail.{exc.message}", field="mail") from None


def add_webhook(conn: apsw.Connection, principal, box: SecretBox, spec: dict, now: float) -> dict:
    """Add a webhook (or mailbox) for what `principal` may read; answers it with its secret (shown once)."""
    scope, project_id, job_id = ("all" if principal.admin else "user"), None, None
    if spec["job"] is not None:
        teams.check_job(conn, principal, spec["job"], "read")
        scope, job_id = "job", spec["job"]
        cursor = one(conn, "job_first_event", job_id=job_id)["seq"]
    else:
        cursor = one(conn, "last_event_seq")["seq"]
    if spec["project"] is not None:
        scope, project_id = "project", _managed_project(conn, principal, spec["project"])
    secret = signing.new_secret() if spec["url"] else None
    created = one(
        conn,
        "insert_webhook",
        url=spec["url"],
        email=spec["email"],
        events=json.dumps(spec["events"]),
        format=spec["format"],
        scope=scope,
        project_id=project_id,
        job_id=job_id,
        alert_id=None,
        user_id=principal.user_id,
        secret=box.seal(secret) if secret else None,
        cursor=cursor,
        now=now,
    )
    events.record(
        conn,
        now,
        "webhook_added",
        job_id=job_id,
        webhook_id=created["id"],
        scope=scope,
        events=spec["events"],
        target="email" if spec["email"] else "url",
    )
    answer = get_webhook(conn, principal, created["id"])
    if secret:
        answer["secret"] = secret
    return answer


def _managed_project(conn: apsw.Connection, principal, name: str) -> int:
    found = row(conn, "project_by_name", name=name)
    if found is None:
        raise NotFound(f"no project {name!r}")
    if principal.admin:
        return found["id"]
    role = row(conn, "membership_role", user_id=principal.user_id, project_id=found["id"])
    if role is None:
        raise NotFound(f"no project {name!r}")
    if role["role"] != "manager":
        raise Forbidden(f"only the managers of project {name} and admins may add webhooks for all its jobs (add one for a job you may read: --job)")
    return found["id"]


def _view(found: dict) -> dict:
    view = {k: v for k, v in found.items() if k not in ("secret", "user_id")}
    view["events"] = json.loads(found["events"])
    return view


def get_webhook(conn: apsw.Connection, principal, webhook_id: int) -> dict:
    """A webhook its adder or an admin may see; NotFound otherwise."""
    found = row(conn, "webhook_by_id", id=webhook_id)
    if found is None or not (principal.admin or found["user_id"] == principal.user_id):
        raise NotFound(f"no webhook {webhook_id}")
    return _view(found)


def list_webhooks(conn: apsw.Connection, principal, after: int, limit: int) -> list[dict]:
    """An admin's list is every webhook; a user's, its own."""
    return [_view(r) for r in rows(conn, "list_webhooks", after=after, limit=limit, user_id=None if principal.admin else principal.user_id)]


def remove_webhook(conn: apsw.Connection, principal, webhook_id: int, now: float) -> None:
    get_webhook(conn, principal, webhook_id)
    alerts = [r["name"] for r in rows(conn, "webhook_alerts", id=webhook_id)]
    if alerts:
        raise Conflict(f"webhook {webhook_id} delivers alert {alerts[0]!r}: remove the alert first", code="webhook_in_use")
    _delete_webhook(conn, webhook_id)
    events.record(conn, now, "webhook_removed", webhook_id=webhook_id)


def _delete_webhook(conn: apsw.Connection, webhook_id: int) -> None:
    row(conn, "delete_webhook_deliveries", id=webhook_id)
    row(conn, "delete_webhook", id=webhook_id)


def webhook_secret(conn: apsw.Connection, principal, box: SecretBox, webhook_id: int) -> tuple[dict, str | None]:
    """A webhook (as get_webhook) and its signing secret, for `webhook test`."""
    view = get_webhook(conn, principal, webhook_id)
    sealed = one(conn, "webhook_by_id", id=webhook_id)["secret"]
    return view, box.open(sealed) if sealed else None


# -- alerts -------------------------------------------------------------------


def parse_alert(body: dict, *, smtp: bool) -> dict:
    """An alert request checked (not its SQL: alerts.check_sql runs it). Raises InvalidRequest."""
    unknown = set(body) - {"name", "sql", "every_s", "webhook", "email"}
    if unknown:
        raise InvalidRequest(f"unknown field {sorted(unknown)[0]}", field=sorted(unknown)[0])
    name = teams.check_name(body.get("name"), "name")
    sql = body.get("sql")
    if not isinstance(sql, str) or not sql.strip() or len(sql) > MAX_SQL:
        raise InvalidRequest(f"sql: must be one SELECT of at most {MAX_SQL} characters", field="sql")
    every = body.get("every_s", 60)
    if isinstance(every, bool) or not isinstance(every, (int, float)) or not MIN_EVERY_S <= every <= MAX_EVERY_S:
        raise InvalidRequest(f"every_s: must be between {MIN_EVERY_S:g} s and 7 days ({MAX_EVERY_S:g} s), not {every!r}", field="every_s")
    webhook, email = body.get("webhook"), body.get("email")
    if (webhook is None) == (email is None):
        raise InvalidRequest("webhook: give a webhook id or an email, one of them", field="webhook")
    if webhook is not None and (not isinstance(webhook, int) or isinstance(webhook, bool) or webhook < 1):
        raise InvalidRequest("webhook: must be a webhook id", field="webhook")
    if email is not None:
        check_email(email)
        if not smtp:
            raise InvalidRequest("email: this control plane sends no mail (start it with --smtp-url)", field="email")
    return {"name": name, "sql": sql, "every_s": float(every), "webhook": webhook, "email": email}


def add_alert(conn: apsw.Connection, principal, spec: dict, now: float) -> dict:
    teams.require_admin(principal, "add alerts (their SQL reads the whole state file)")
    if row(conn, "alert_by_name", name=spec["name"]) is not None:
        raise Conflict(f"an alert named {spec['name']!r} exists: remove it first", code="alert_exists")
    webhook_id = spec["webhook"]
    if webhook_id is not None:
        if row(conn, "webhook_by_id", id=webhook_id) is None:
            raise InvalidRequest(f"webhook: no webhook {webhook_id}", field="webhook")
    else:
        webhook_id = one(
            conn,
            "insert_webhook",
            url=None,
            email=spec["email"],
            events=json.dumps(["alert.fired"]),
            format="email",
            scope="alert",
            project_id=None,
            job_id=None,
            alert_id=0,
            user_id=principal.user_id,
            secret=None,
            cursor=one(conn, "last_event_seq")["seq"],
            now=now,
        )["id"]
    alert = one(
        conn, "insert_alert", name=spec["name"], sql=spec["sql"], every_s=spec["every_s"], webhook_id=webhook_id, user_id=principal.user_id, now=now
    )
    if spec["email"] is not None:
        row(conn, "alert_email_webhook", alert_id=alert["id"], id=webhook_id)
    events.record(conn, now, "alert_added", alert_id=alert["id"], name=spec["name"], webhook_id=webhook_id)
    return next(a for a in list_alerts(conn, principal, alert["id"] - 1, 1))


def list_alerts(conn: apsw.Connection, principal, after: int, limit: int) -> list[dict]:
    teams.require_admin(principal, "list alerts")
    return rows(conn, "list_alerts", after=after, limit=limit)


def remove_alert(conn: apsw.Connection, principal, name: str, now: float) -> None:
    teams.require_admin(principal, "remove alerts")
    found = row(conn, "alert_by_name", name=teams.check_name(name, "name"))
    if found is None:
        raise NotFound(f"no alert {name!r}")
    row(conn, "delete_alert", id=found["id"])
    for mailbox in rows(conn, "delete_alert_webhooks", alert_id=found["id"]):
        row(conn, "delete_webhook_deliveries", id=mailbox["id"])
    events.record(conn, now, "alert_removed", alert_id=found["id"], name=name)
