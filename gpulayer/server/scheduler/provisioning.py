"""Provision requests as transactions: opened with their join token, submitted, attached, ended, an error noted.

The provisioning loop (server/provisioning/loop.py) decides and talks to Slurm; what it decides goes to the
state file through the Scheduler (core.Scheduler's `provision_*` calls), which runs these in the writer.
"""
from __future__ import annotations

from typing import Callable

import apsw

from gpulayer.server.scheduler import events, tokens, workers
from gpulayer.server.store.queries import one, row, rows

ERROR_CHARS = 2000  # the tail of an error a request's row and event keep


def open_request(conn: apsw.Connection, *, provisioner: str, profile: str, name_for: Callable[[int], str],
                 labels: dict, token_hash: str, jti: str, expires_at: float, now: float) -> dict:
    """Record the decision and mint its join token (named `name_for(request id)`) in one transaction; {id, name}."""
    request_id = one(conn, "insert_provision_request", provisioner=provisioner, profile=profile,
                     token_jti=jti, now=now)["id"]
    name = name_for(request_id)
    tokens.insert(conn, jti=jti, kind="join", name=name, labels=labels, token_hash=token_hash,
                  expires_at=expires_at, source="provisioner", now=now)
    events.record(conn, now, "provision_requested", request_id=request_id, provisioner=provisioner,
                  profile=profile, worker_name=name)
    return {"id": request_id, "name": name}


def submitted(conn: apsw.Connection, request_id: int, slurm_job_id: str, now: float) -> None:
    if row(conn, "provision_submitted", id=request_id, slurm_job_id=slurm_job_id, now=now):
        events.record(conn, now, "provision_submitted", request_id=request_id, slurm_job_id=slurm_job_id)


def end(conn: apsw.Connection, request_id: int, state: str, error: str, now: float) -> dict | None:
    """Close an open request as cancelled or failed and revoke its token; None when it was not open."""
    ended = row(conn, "provision_end", id=request_id, state=state, error=error[-ERROR_CHARS:], now=now)
    if ended is None:
        return None
    if ended["token_jti"]:
        workers.revoke_token(conn, ended["token_jti"], now)
    events.record(conn, now, f"provision_{state}", request_id=request_id, slurm_job_id=ended["slurm_job_id"],
                  error=error[-ERROR_CHARS:])
    return ended


def attach(conn: apsw.Connection, now: float) -> list[dict]:
    """Open requests whose token a worker registered with, marked attached (an event each)."""
    attached = rows(conn, "provision_attach", now=now)
    for a in attached:
        events.record(conn, now, "provision_attached", worker_id=a["worker_id"], request_id=a["id"],
                      slurm_job_id=a["slurm_job_id"])
    return attached


def note_error(conn: apsw.Connection, request_id: int, error: str, now: float) -> None:
    """squeue failed for an open request: the error's tail on its row (the next round looks again)."""
    row(conn, "provision_note_error", id=request_id, error=error[-ERROR_CHARS:], now=now)
