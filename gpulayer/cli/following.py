"""What the CLI tells of a job while it is waited on and once it ended: what it waits for, its logs as they
come, why it did not succeed (`gpulayer submit --wait/--follow`, `gpulayer job logs -f`)."""
from __future__ import annotations

import re
from typing import Optional

import typer

from gpulayer.cli.common import (
    print_json, print_log_line, style,
)
from gpulayer.client.jobs import FINISHED_STATES, Job


def tell_ended(info: dict, index: Optional[int] = None) -> None:
    """Why a job (or its element `index`: `info` is then that element's latest task) that did not succeed
    ended, one line on stderr: `job 7 failed: exit code 3`, `job 7 cancelled: its dependency job 5 failed
    (dependency_failed)`, `job 7 lost (worker_lost)`: what it asked for, then the reason's code in parentheses
    (a reason in words, as an agent writes them, after the exit code)."""
    state = info.get("state")
    if state not in FINISHED_STATES or state == "succeeded":
        return
    reason, code = info.get("reason"), info.get("exit_code")
    what = f"job {info['id']}" if index is None else f"job {info['job_id']} element {index}"
    coded = reason != state and re.fullmatch(r"[a-z_]+", reason or "") is not None  # worker_lost
    told = [_unmet_dependency(info.get("after") or [])] if reason == "dependency_failed" else []
    if code not in (None, 0) and f"exit code {code}" not in (reason or ""):
        told.append(f"exit code {code}")
    if reason and reason != state and not coded:  # the agent's words ("timeout: ran longer than ...")
        told.append(reason)
    line = f"{what} {state}" + (f": {', '.join(told)}" if told else "") + (f" ({reason})" if coded else "")
    typer.echo(style(line, "red", err=True), err=True)


def _unmet_dependency(after: list[dict]) -> str:
    """Which of a job's dependencies ended against its condition, in words; one the caller may not see
    (its state rendered null: teams.hide_unseen) is named as hidden, its state untold."""
    for dep in after:
        state, condition = dep.get("state"), dep.get("condition") or "ok"
        if state in FINISHED_STATES and (condition == "ok") != (state == "succeeded") and condition != "any":
            asked = "" if condition == "ok" else f", and it runs after {dep['job']}:{condition}"
            return f"its dependency job {dep['job']} {state}{asked}"
    hidden = next((dep for dep in after if dep.get("state") is None), None)
    if hidden is not None:
        return (f"its dependency job {hidden['job']} (hidden: you may not see it) did not end as "
                f"{hidden['job']}:{hidden.get('condition') or 'ok'} asks")
    return "a dependency did not end as it asks"


def waiting_line(message: str) -> str:
    """ "waiting: no online worker ...", said once ("waiting for capacity: ..." as it is)."""
    return message if message.startswith("waiting") else f"waiting: {message}"


def tell_waiting(message: str) -> None:
    """What a job waits for, on stderr ("waiting: no online worker ...")."""
    typer.echo(style(waiting_line(message), "yellow", err=True), err=True)


def follow_logs(job: Job, index: Optional[int] = None, as_json: bool = False) -> None:
    """Print the job's logs (`index`: of that element alone) until it has finished (prefixed by task when it
    has several; with `as_json`, each line as one JSON object on stdout, as `job logs --json` prints it).

    What the job waits for goes to stderr while it has not started (tell_waiting).
    """
    prefixes = task_prefixes(job.data) if index is None else {}  # the job as submitted or just read
    for line in job.logs(follow=True, on_waiting=tell_waiting, index=index):
        if as_json:
            print_json(line, compact=True)
        else:
            print_log_line(line, line_prefix(prefixes, line))


def line_prefix(prefixes: Optional[dict], line: dict) -> str:
    """`[index] ` before a line of a job with several tasks; None for an array, whose lines carry their index."""
    if prefixes is None:
        return f"[{line['index']}] " if line.get("index") is not None else ""
    return prefixes.get(line.get("task_id"), "")


def task_prefixes(info: dict) -> Optional[dict]:
    spec = info.get("spec") or {}
    width = max(int(spec.get("nodes") or 1), int((spec.get("service") or {}).get("replicas") or 1))
    if spec.get("array"):
        return None
    if width <= 1:
        return {}
    return {t["task_id"]: f"[{t.get('index', '?')}] " for t in info.get("tasks", [])}
