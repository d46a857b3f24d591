"""`gpulayer webhook ...` and `gpulayer alert ...`: be told when jobs end and when a query finds something."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Optional

import typer

from gpulayer.cli.common import client_of, fail, fmt_time, parse_duration, print_json, print_table
from gpulayer.client.errors import ApiError

webhook_app = typer.Typer(help="Signed webhooks (and mailboxes) delivered from the event log.", no_args_is_help=True)
alert_app = typer.Typer(help="Alerts: a read-only SQL query that fires on rows it did not return before (admins).", no_args_is_help=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]
# The request's fields (which the server's refusals name: `every_s: must be ...`) as this CLI's options.
WEBHOOK_FLAGS = {"url": "URL", "events": "--events", "format": "--format", "project": "--project", "job": "--job"}
ALERT_FLAGS = {"name": "NAME", "sql": "--sql", "every_s": "--every", "webhook": "--webhook", "email": "--email"}


@contextmanager
def _as_flags(flags: dict[str, str]) -> Iterator[None]:
    """A refusal that names a field of the request names the option that set it instead."""
    try:
        yield
    except ApiError as exc:
        field, colon, rest = exc.message.partition(": ")
        if colon and field in flags:
            exc.message = f"{flags[field]}: {rest}"
            exc.args = (exc.message,)
        raise


@webhook_app.command("add")
def webhook_add(
    ctx: typer.Context,
    url: Annotated[str, typer.Argument(help="Where to POST: an http(s) URL on a public address.")],
    events: Annotated[
        str,
        typer.Option(
            "--events", metavar="NAMES", help="Comma-separated event names: job.failed,job.succeeded,... (docs/notifications.md lists them)."
        ),
    ],
    project: Annotated[Optional[str], typer.Option("--project", help="Every job of this project (its managers, admins).")] = None,
    job: Annotated[Optional[int], typer.Option("--job", help="One job (who may read it).", min=1)] = None,
    format: Annotated[str, typer.Option("--format", help='standard (Standard Webhooks JSON) or slack ({"text"}).')] = "standard",  # noqa: A002
    as_json: JsonOpt = False,
) -> None:
    """Add a webhook: its signing secret is printed once, alone on the first line.

    \b
    Example:
      gpulayer webhook add https://hooks.example.org/gpu --events job.failed,job.succeeded --project ml
    """
    names = [n.strip() for n in events.split(",") if n.strip()]
    if not names:
        raise fail("--events: give at least one event name (job.failed, ...)", 2)
    if project is not None and job is not None:
        raise fail("--project and --job: give one of them", 2)
    if format not in ("standard", "slack"):
        raise fail(f"--format: must be standard or slack, not {format!r}", 2)
    with _as_flags(WEBHOOK_FLAGS):
        answer = client_of(ctx).add_webhook(url, names, project=project, job_id=job, format=format)
    if as_json:
        print_json(answer)
        return
    typer.echo(answer.get("secret") or "")
    typer.echo(f"webhook {answer['id']} added (scope {answer['scope']}); verify deliveries with the secret above, which is not shown again", err=True)


@webhook_app.command("list")
def webhook_list(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Your webhooks and mailboxes (an admin's: all), with their deliveries so far.

    \b
    Example:
      gpulayer webhook list
    """
    found = client_of(ctx).webhooks()
    if as_json:
        print_json(found)
        return
    rows = [
        [
            w["id"],
            w.get("url") or w.get("email"),
            ",".join(w["events"]),
            _scope(w) + (" (disabled)" if w.get("disabled") else ""),
            w.get("format"),
            w.get("delivered"),
            w.get("retrying"),
            w.get("failed"),
        ]
        for w in found
    ]
    print_table(rows, ["ID", "TARGET", "EVENTS", "SCOPE", "FORMAT", "DELIVERED", "RETRYING", "FAILED"])


def _scope(w: dict) -> str:
    if w["scope"] == "job":
        return f"job {w['job_id']}"
    if w["scope"] == "project":
        return f"project {w['project']}"
    if w["scope"] == "alert":
        return f"alert {w['alert_id']}"
    return "all" if w["scope"] == "all" else f"user {w.get('owner')}"


@webhook_app.command("remove")
def webhook_remove(ctx: typer.Context, webhook_id: Annotated[int, typer.Argument(help="The webhook's id.", min=1)]) -> None:
    """Remove a webhook (or mailbox) and its delivery records.

    \b
    Example:
      gpulayer webhook remove 3
    """
    client_of(ctx).remove_webhook(webhook_id)
    typer.echo(f"webhook {webhook_id} removed", err=True)


@webhook_app.command("test")
def webhook_test(ctx: typer.Context, webhook_id: Annotated[int, typer.Argument(help="The webhook's id.", min=1)], as_json: JsonOpt = False) -> None:
    """Send a signed `webhook.test` message now; exit 1 when the receiver did not answer 2xx.

    \b
    Example:
      gpulayer webhook test 3
    """
    answer = client_of(ctx).test_webhook(webhook_id)
    if as_json:
        print_json(answer)
    elif answer["ok"]:
        typer.echo(f"delivered: {answer['status']} ({answer['id']})")
    if not answer["ok"]:
        raise fail(f"webhook {webhook_id}: {answer['error']}", 1)


@alert_app.command("add")
def alert_add(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="A name: lower-case letters, digits, _ . -")],
    sql: Annotated[str, typer.Option("--sql", help="One read-only SELECT over the state file (docs/sql.md).")],
    every: Annotated[str, typer.Option("--every", metavar="DURATION", help="How often it runs: 30s, 1m, 1h (at least 10 s).")] = "1m",
    webhook: Annotated[Optional[int], typer.Option("--webhook", help="The webhook it fires to (its id).", min=1)] = None,
    email: Annotated[Optional[str], typer.Option("--email", metavar="ADDR", help="Or the address it mails.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Add an alert (admins): it fires when its query returns rows it did not return last time.

    \b
    Example:
      gpulayer alert add stuck --every 5m --webhook 3 \\
        --sql "select id, name from jobs where state = 'queued' and created_at < unixepoch() - 7200"
    """
    if (webhook is None) == (email is None):
        raise fail("give --webhook ID or --email ADDR, one of them", 2)
    every_s = parse_duration(every, "--every", positive=True)
    with _as_flags(ALERT_FLAGS):
        answer = client_of(ctx).add_alert(name, sql, float(every_s or 60), webhook=webhook, email=email)
    if as_json:
        print_json(answer)
        return
    typer.echo(f"alert {answer['name']} added: runs every {answer['every_s']:g} s", err=True)


@alert_app.command("list")
def alert_list(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Alerts: their query, how often, where they fire, when they last ran and what failed.

    \b
    Example:
      gpulayer alert list
    """
    found = client_of(ctx).alerts()
    if as_json:
        print_json(found)
        return
    rows = [
        [
            a["name"],
            f"{a['every_s']:g}s",
            a.get("email") or f"webhook {a['webhook_id']}",
            a.get("fired"),
            fmt_time(a.get("last_run_at")),
            a.get("last_error") or "",
            a["sql"][:60],
        ]
        for a in found
    ]
    print_table(rows, ["NAME", "EVERY", "TO", "FIRED", "LAST RUN", "ERROR", "SQL"])


@alert_app.command("remove")
def alert_remove(ctx: typer.Context, name: Annotated[str, typer.Argument(help="The alert's name.")]) -> None:
    """Remove an alert (and the mailbox --email made for it).

    \b
    Example:
      gpulayer alert remove stuck
    """
    client_of(ctx).remove_alert(name)
    typer.echo(f"alert {name} removed", err=True)
