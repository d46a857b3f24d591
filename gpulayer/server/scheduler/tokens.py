"""Minted tokens (join and metrics) as rows of the `tokens` table: only hashes."""
from __future__ import annotations

import json

from gpulayer.server.scheduler import events
from gpulayer.server.store.queries import row, rows


def insert(conn, *, jti: str, kind: str, name: str, labels: dict, token_hash: str, expires_at: float | None,
           source: str, now: float) -> None:
    """Store a new token's hash (the token itself is shown once, by the caller)."""
    row(conn, "insert_token", jti=jti, kind=kind, name=name, labels=json.dumps(labels), token_hash=token_hash,
        expires_at=expires_at, source=source, now=now)
    events.record(conn, now, "token_created", jti=jti, token_kind=kind, name=name, labels=labels, expires_at=expires_at)


def listing(conn) -> list[dict]:
    """Every minted token, without secret or hash."""
    return [{**t, "labels": json.loads(t["labels"])} for t in rows(conn, "list_tokens")]


def get(conn, jti: str) -> dict | None:
    found = row(conn, "get_token", jti=jti)
    return {**found, "labels": json.loads(found["labels"])} if found else None
