"""Streams through the relay as the scheduler knows them: who may open one where, its `sessions` row, and
which workers are asked to connect their relay link (docs/architecture.md, "The relay").

The bytes never come here: the relay (server/relay/) forwards them on the front end's asyncio loop. What
comes here is one read when a stream is asked for (`target`: the caller's right to the job and the task it
runs in) and two writes per stream (`opened`, `closed`), each with its job event.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import apsw

from gpulayer.protocol.relay import COMMAND_KINDS, KINDS
from gpulayer.server.errors import Conflict
from gpulayer.server.scheduler import events, teams
from gpulayer.server.store.queries import one, row, rows


@dataclass(frozen=True)
class Target:
    """Where a stream goes: the task, its worker, and what its agent said of the relay at register."""

    job_id: int
    task_id: int
    index: int
    worker_id: int
    worker_name: str
    kinds: tuple[str, ...]  # empty: the agent predates the relay
    no_exec: bool
    version: str


class RelayUnavailable(Conflict):
    """The task's worker cannot take this stream (an agent without the relay, or started with --no-exec)."""

    code = "relay_unavailable"


def target(conn: apsw.Connection, principal, job_id: int, index: int | None, kind: str) -> Target:
    """The running task a `kind` stream into job `job_id` (element `index`, or its first running one) opens on.

    Raises NotFound (no such job for this caller: teams' rules), Forbidden (only the job's owner, its
    project's managers and admins open streams), Conflict (nothing of it runs now), RelayUnavailable.
    """
    teams.check_job(conn, principal, job_id, "manage")
    found = row(conn, "relay_task", job_id=job_id, index=index)
    if found is None:
        states = row(conn, "job_task_states", job_id=job_id, index=index) or {}
        what = f"job {job_id}" + (f" has no element {index} running" if index is not None else " has no task running")
        raise Conflict(
            f"{what} (job {states.get('job_state')}, tasks: {states.get('task_states') or 'none'}): the relay reaches a running task only",
            code="not_running",
        )
    relay = json.loads(found["relay"] or "{}")
    kinds = tuple(k for k in relay.get("kinds") or () if isinstance(k, str))
    name = found["worker_name"]
    if found["worker_state"] != "online":
        raise Conflict(
            f"worker {name}, where job {job_id}'s task runs, is {found['worker_state']}: its agent cannot be reached now", code="not_running"
        )
    if kind not in kinds:
        if not relay:
            raise RelayUnavailable(
                f"worker {name}'s agent does not support the relay (version {found['version'] or 'unknown'}): upgrade it (pip install -U gpulayer)"
            )
        if kind in COMMAND_KINDS and relay.get("no_exec"):
            raise RelayUnavailable(f"worker {name} was started with --no-exec: it runs no command for the relay ({kind})")
        raise RelayUnavailable(f"worker {name}'s agent does not serve {kind} streams (it serves {', '.join(kinds)})")
    return Target(
        job_id, found["task_id"], found["index"], found["worker_id"], name, kinds, bool(relay.get("no_exec")), found["version"] or "unknown"
    )


def opened(conn: apsw.Connection, to: Target, user: str, kind: str, detail: dict, now: float) -> int:
    """A stream opened: its sessions row and a `session_opened` event; its id."""
    session_id = one(
        conn, "insert_session", worker_id=to.worker_id, job_id=to.job_id, task_id=to.task_id, user=user, kind=kind, detail=json.dumps(detail), now=now
    )["id"]
    events.record(
        conn,
        now,
        "session_opened",
        job_id=to.job_id,
        task_id=to.task_id,
        worker_id=to.worker_id,
        session_id=session_id,
        stream=kind,
        user=user,
        **detail,
    )
    return session_id


def closed(conn: apsw.Connection, session_id: int, bytes_in: int, bytes_out: int, exit_code: int | None, reason: str, now: float) -> None:
    """A stream ended: its row closed and a `session_closed` event (nothing when it was closed already)."""
    found = row(conn, "close_session", id=session_id, bytes_in=bytes_in, bytes_out=bytes_out, exit_code=exit_code, reason=reason, now=now)
    if found is not None:
        _closed_event(
            conn,
            now,
            found,
            session_id,
            bytes_in=bytes_in,
            bytes_out=bytes_out,
            exit_code=exit_code,
            reason=reason,
            seconds=round(now - found["opened_at"], 3),
        )


def restarted(conn: apsw.Connection, now: float) -> int:
    """At start: close the rows a stopped control plane left open (their streams ended with it); how many."""
    ended = rows(conn, "close_open_sessions", now=now)
    for found in ended:
        _closed_event(conn, now, found, found["id"], reason="the control plane stopped")
    return len(ended)


def _closed_event(conn: apsw.Connection, now: float, found: dict, session_id: int, **data) -> None:
    events.record(
        conn,
        now,
        "session_closed",
        job_id=found["job_id"],
        task_id=found["task_id"],
        worker_id=found["worker_id"],
        session_id=session_id,
        stream=found["kind"],
        **data,
    )


def relay_field(value) -> dict:
    """Register's `relay` ({"version": 1, "kinds": [...], "no_exec": bool}) as stored: unknown kinds dropped."""
    if not isinstance(value, dict):
        return {}
    kinds = [k for k in value.get("kinds") or () if k in KINDS] if isinstance(value.get("kinds"), list) else []
    version = value.get("version")
    return {
        "version": version if isinstance(version, int) and not isinstance(version, bool) else 1,
        "kinds": kinds,
        "no_exec": value.get("no_exec") is True,
    }



__all__ = ["Target", "target", "opened", "closed", "restarted", "relay_field", "RelayUnavailable"]
