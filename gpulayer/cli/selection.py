"""Choosing jobs by state, name and age (`job list`, `job cancel`), and how a job reads in a table row."""
from __future__ import annotations

import datetime as dt
import fnmatch
import time
from typing import Any, Callable, Optional

import typer

from gpulayer.cli.common import fmt_clock, fmt_start, fmt_time, parse_duration, style
from gpulayer.client.api import Client
from gpulayer.client.jobs import FINISHED_STATES
from gpulayer.protocol import JOB_STATES

PAGE = 1000  # GET /v1/jobs answers at most this many at once
UNFINISHED = tuple(s for s in JOB_STATES if s not in FINISHED_STATES)
STATE_COLOURS = {"running": "cyan", "succeeded": "green", "failed": "red", "lost": "red", "cancelled": "yellow"}
COMMAND_WIDTH = 60


def check_states(values: Optional[list[str]]) -> list[str]:
    """--state values, each a job state (a usage error naming the states otherwise)."""
    for value in values or []:
        if value not in JOB_STATES:
            raise typer.BadParameter(f"{value!r} is not a job state ({', '.join(JOB_STATES)})", param_hint="--state")
    return list(dict.fromkeys(values or []))


def parse_since(text: Optional[str]) -> Optional[float]:
    """--since: a duration back from now (`2h`, `3d`) or a local date/time (`2026-12-01`, `2026-12-01T08:00`)."""
    if text is None:
        return None
    try:
        return dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        pass
    try:
        return time.time() - (parse_duration(text, "--since") or 0)
    except typer.BadParameter as exc:
        raise typer.BadParameter(f"{exc.message}; or a date such as 2026-12-01", param_hint="--since") from None


def select_jobs(client: Client, states: list[str], name: Optional[str], since: Optional[float],
                limit: int, **scope) -> list[dict]:
    """Jobs newest first in any of `states` (all when empty), named like the glob `name`, created at
    or after `since`; at most `limit`. `scope` (all, user, project: whose jobs) goes to the server as is.

    The server filters by state, name and age, so only matching jobs are paged
    in; they are matched here again, for a server from before the name and age
    filters (which sends every job, a page at a time, until `limit` match or
    the jobs are older than `since`).
    """
    found: list[dict] = []
    every: list[Optional[str]] = [None]  # no state filter
    for state in states or every:
        found.extend(_matching(client, state, name, since, limit, scope))
    found.sort(key=lambda j: j["id"], reverse=True)
    return found[:limit]


def _matching(client: Client, state: Optional[str], name: Optional[str], since: Optional[float],
              limit: int, scope: dict) -> list[dict]:
    found: list[dict] = []
    before = None
    size = min(limit, PAGE)
    while len(found) < limit:
        asked = size
        page = client.jobs(state=state, limit=asked, before=before, name=name, since=since,
                           **{k: v for k, v in scope.items() if v})
        for job in page:
            if since is not None and (job.get("created_at") or 0) < since:
                return found
            if name is None or fnmatch.fnmatchcase(job.get("name") or "", name):
                found.append(job)
            else:  # a server from before the name filter: most jobs do not match, ask for whole pages
                size = PAGE
        if len(page) < asked:
            break
        before = page[-1]["id"]
    return found


def _command(job: dict) -> str:
    """The job's command on one line (no newline breaks a row), cut at COMMAND_WIDTH."""
    command = " ".join(" ".join(str(part) for part in (job.get("spec") or {}).get("command", [])).split())
    return command[:COMMAND_WIDTH - 1] + "…" if len(command) > COMMAND_WIDTH else command


def state_text(job: dict) -> str:
    """The job's state; an array's with its progress: `running 812/1000 done, 16 running`."""
    array = job.get("array")
    if not array:
        return job["state"]
    counts = array.get("counts") or {}
    text = f"{job['state']} {array.get('done', 0)}/{array.get('size')} done"
    for label, n in (("running", counts.get("running", 0) + counts.get("assigned", 0)),
                     ("failed", counts.get("failed", 0) + counts.get("lost", 0)),
                     ("cancelled", counts.get("cancelled", 0))):
        if n:
            text += f", {n} {label}"
    return text


def state_style(text: str) -> str:
    """The STATE column in its colour (on a terminal only)."""
    colour = STATE_COLOURS.get(text.strip().split(" ")[0])
    return style(text, colour) if colour else text


def _current_tasks(job: dict) -> list[dict]:
    """The tasks of the job's current attempt; an array's listed ones, whatever their attempt (each element
    retries alone), those running first."""
    tasks = job.get("tasks") or []
    if job.get("array"):
        return [t for t in tasks if t.get("state") in ("assigned", "running")] or tasks
    return [t for t in tasks if t.get("attempt") == job.get("attempt")]


def _workers(job: dict) -> Optional[str]:
    """The worker of the job's current attempt (an array's running elements), `name+N` when its tasks are on
    several."""
    names = list(dict.fromkeys(t.get("worker_name") or str(t["worker_id"])
                               for t in _current_tasks(job) if t.get("worker_id") is not None))
    if not names:
        return None
    return names[0] if len(names) == 1 else f"{names[0]}+{len(names) - 1}"


def elapsed(job: dict, now: float) -> Optional[str]:
    """How long the job has run (until it ended, or until now), as Slurm writes it: [D-]H:MM:SS; an array
    since its first element started."""
    started = [t["started_at"] for t in _current_tasks(job) if t.get("started_at")]
    started += [t for t in [(job.get("array") or {}).get("started_at")] if t]
    if not started:
        return None
    return clock(max(0.0, (job.get("finished_at") or now) - min(started)))


def held_time(job: dict, now: float, resource: str) -> Optional[str]:
    """sacct's CPUTime (`resource` "cpus") or its GPU twin ("gpus"): the seconds each task of the current
    attempt ran (until it ended, or until now) times the CPUs (GPUs) it holds, summed; None for an array
    (its elements' runs are not all listed) and for a job that has not started."""
    if job.get("array"):
        return None
    runs = [(t.get("finished_at") or now) - t["started_at"] for t in _current_tasks(job) if t.get("started_at")]
    if not runs:
        return None
    return clock(max(0.0, sum(runs)) * float((job.get("spec") or {}).get(resource) or 0))


def clock(seconds: float) -> str:
    """Seconds as Slurm writes a time: [D-]H:MM:SS."""
    days, rest = divmod(int(seconds), 86400)
    text = f"{rest // 3600}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def start_line(job: dict, now: float) -> Optional[str]:
    """A waiting job's expected start, "starts about 14:20, in 35 min", or why it has none ("start unknown:
    held: ..."); None for a job that does not wait to start (or a server from before estimates)."""
    if job.get("estimated_start_at") is not None:
        return f"starts about {fmt_start(job['estimated_start_at'], now)}"
    if job.get("estimate_reason"):
        return f"start unknown: {job['estimate_reason']}"
    return None


def start_cell(job: dict, now: float) -> str:
    """`job list --start`'s START: "14:20, in 35 min", or N/A (as squeue --start) when none is known."""
    at = job.get("estimated_start_at")
    return "N/A" if at is None else fmt_start(at, now)


def start_order(job: dict) -> tuple:
    """The sort key of `job list --start`: soonest expected start first, then those with none, by id."""
    at = job.get("estimated_start_at")
    return (at is None, at or 0.0, job["id"])


#: `job list --format`'s columns, as squeue's -o: name → (header, the cell of a job at `now`).
COLUMNS: dict[str, tuple[str, Callable[[dict, float], Any]]] = {
    "id": ("ID", lambda j, now: j["id"]),
    "state": ("STATE", lambda j, now: state_text(j)),
    "exit": ("EXIT", lambda j, now: j.get("exit_code")),
    "name": ("NAME", lambda j, now: j.get("name")),
    "user": ("USER", lambda j, now: j.get("owner")),
    "project": ("PROJECT", lambda j, now: j.get("project")),
    "prio": ("PRIO", lambda j, now: (j.get("spec") or {}).get("priority")),
    "worker": ("WORKER", lambda j, now: _workers(j)),
    "elapsed": ("ELAPSED", elapsed),
    "cputime": ("CPUTIME", lambda j, now: held_time(j, now, "cpus")),
    "gputime": ("GPUTIME", lambda j, now: held_time(j, now, "gpus")),
    "created": ("CREATED", lambda j, now: fmt_time(j.get("created_at"))),
    "start": ("START", start_cell),
    "command": ("COMMAND", lambda j, now: _command(j)),
}
DEFAULT_COLUMNS = ["id", "state", "exit", "name", "prio", "worker", "elapsed", "created", "command"]
OWNER_COLUMNS = [*DEFAULT_COLUMNS[:4], "user", "project", *DEFAULT_COLUMNS[4:]]
START_COLUMNS = ["id", "state", "name", "prio", "start", "created", "command"]  # `job list --start`, as squeue --start
WAITING_STATES = ["queued", "waiting"]
HEADERS = [COLUMNS[c][0] for c in DEFAULT_COLUMNS]


def parse_columns(text: Optional[str]) -> Optional[list[str]]:
    """--format `id,state,name,elapsed`: the column names in order (None: the default); a usage error
    naming the columns for an unknown or missing one."""
    if text is None:
        return None
    names = [n.strip().lower() for n in text.split(",")]
    unknown = [n for n in names if n not in COLUMNS]
    if unknown or not names:
        raise typer.BadParameter(f"{', '.join(map(repr, unknown)) or repr(text)} is not a column "
                                 f"({', '.join(COLUMNS)})", param_hint="--format")
    return names


def table_of(jobs: list[dict], columns: list[str], now: float) -> tuple[list[list], list[str]]:
    """The jobs' rows and the headers of `columns` (COLUMNS' names)."""
    cells = [COLUMNS[c][1] for c in columns]
    return [[cell(j, now) for cell in cells] for j in jobs], [COLUMNS[c][0] for c in columns]


def scaling_lines(scaling: dict | None) -> list[str]:
    """`job status`'s lines for a service that autoscales (docs/services.md, "Autoscaling"): its replicas now,
    then its latest decisions, oldest first ("replicas 1 -> 4 at 14:20:03 (up: 3.9 in flight per ready replica)")."""
    if not scaling:
        return []
    lines = [f"replicas={scaling['replicas']} ready={scaling['ready']} draining={scaling['draining']}"]
    for d in scaling.get("history") or []:
        load = f": {d['load']:g} in flight per ready replica" if d.get("load") is not None else ""
        lines.append(f"  replicas {d['from_replicas']} -> {d['to_replicas']} at {fmt_clock(d['at'])} ({d['why']}{load})")
    return lines
