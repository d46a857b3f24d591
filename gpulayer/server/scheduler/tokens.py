"""Minted tokens (join, metrics, and client tokens of users) as rows of the `tokens` table: only hashes."""
from __future__ import annotations

import json
from typing import Any

import apsw

from gpulayer.server.errors import NotFound
from gpulayer.server.scheduler import events
from gpulayer.server.store.queries import row, rows


def insert(conn: apsw.Connection, *, jti: str, kind: str, name: str, labels: dict, token_hash: str, expires_at: float | None,
           source: str, now: float, user: str | None = None) -> None:
    """Store a new token's hash (the token itself is shown once, by the caller); a client token's `user`."""
    user_id = None
    if user is not None:
        found = row(conn, "user_by_name", name=user)
        if found is None or found["removed_at"] is not None:
            raise NotFound(f"no user {user!r}")
        user_id = found["id"]
    row(conn, "insert_token", jti=jti, kind=kind, name=name, labels=json.dumps(labels), token_hash=token_hash,
        expires_at=expires_at, source=source, now=now, user_id=user_id)
    data: dict[str, Any] = {"user": user} if user else {}
    events.record(conn, now, "token_created", jti=jti, token_kind=kind, name=name, labels=labels, expires_at=expires_at,
                  **data)


def listing(conn: apsw.Connection, user_id: int | None = None, after: int = 0, limit: int = -1) -> list[dict]:
    """Minted tokens (`user_id`: that user's client tokens alone), without secret or hash, in the order they were
    minted: after the position `after` (each token's `n`), at most `limit` (-1: all)."""
    return [{**t, "labels": json.loads(t["labels"])}
            for t in rows(conn, "list_tokens", user_id=user_id, after=after, limit=limit)]


def get(conn: apsw.Connection, jti: str) -> dict | None:
    found = row(conn, "get_token", jti=jti)
    return {**found, "labels": json.loads(found["labels"])} if found else None
