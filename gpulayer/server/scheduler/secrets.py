"""Secrets for jobs: set, deleted, listed, and given to a task's environment.

Values are stored sealed (security/secretbox.py: encrypted with a key that is
never in the state file). A value leaves the control plane only inside an
assignment, to a worker whose join token carries the secret's labels.
"""
from __future__ import annotations

import json

import apsw

from gpulayer.server.errors import InvalidRequest, NotFound
from gpulayer.server.scheduler import events
from gpulayer.server.scheduler.spec import ENV_NAME
from gpulayer.server.security.secretbox import SecretBox
from gpulayer.server.store.queries import row, rows
from gpulayer.server.validators import labels as check_labels

MAX_SECRET_BYTES = 64 * 1024


def check(name: str, value, labels) -> tuple[str, dict]:
    """Validate a secret's name, value and labels; raises InvalidRequest."""
    if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
        raise InvalidRequest("secret names are letters, digits and _ (an environment variable name)")
    if not isinstance(value, str) or len(value.encode()) > MAX_SECRET_BYTES:
        raise InvalidRequest(f"value: must be a string of at most {MAX_SECRET_BYTES} bytes")
    return value, check_labels(labels or {}, "labels")


def put(conn: apsw.Connection, box: SecretBox, name: str, value: str, labels: dict, now: float, project_id: int = 1) -> None:
    row(conn, "put_secret", project_id=project_id, name=name, labels=json.dumps(labels), ciphertext=box.seal(value),
        now=now)
    events.record(conn, now, "secret_set", name=name, labels=labels, project_id=project_id)


def delete(conn: apsw.Connection, name: str, now: float, project_id: int = 1) -> None:
    if row(conn, "delete_secret", project_id=project_id, name=name) is None:
        raise NotFound(f"no secret named {name!r}")
    events.record(conn, now, "secret_deleted", name=name, project_id=project_id)


def listing(conn: apsw.Connection, project_id: int = 1, after: str = "", limit: int = -1) -> list[dict]:
    """A project's secrets: names and labels, never values; by name, after `after`, at most `limit` (-1: all)."""
    return [{**r, "labels": json.loads(r["labels"])}
            for r in rows(conn, "list_secrets", project_id=project_id, after=after, limit=limit)]


def task_project(conn: apsw.Connection, task_id: int) -> int:
    """The project of a task's job: its secrets are that project's."""
    found = row(conn, "task_project", task_id=task_id)
    return found["project_id"] if found else 1


def env_for(conn: apsw.Connection, box: SecretBox, names: list[str], project_id: int = 1) -> dict[str, str]:
    """{name: value} for a job's secrets, from its project (only called while building an assignment)."""
    found = {}
    for name in names:
        secret = row(conn, "get_secret", project_id=project_id, name=name)
        if secret is not None:
            found[name] = box.open(secret["ciphertext"])
    return found
