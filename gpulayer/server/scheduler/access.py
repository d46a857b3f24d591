"""Artifacts in the state file: who may read and write them, and the record of what arrived.

A client uploads and probes any artifact; an admin downloads any, another user only those
that a job it may read names (teams: the `read` level). A worker reads only what its active
tasks name (their element's checkpoints included), asks whether a digest exists only while it holds a
task, and uploads only while it holds a task (its outputs and checkpoints), up to `max_output_bytes` a file.
"""
from __future__ import annotations

import apsw

from gpulayer.server.errors import BodyTooLarge, Forbidden, NotFound
from gpulayer.server.store.queries import row


def check_read(conn: apsw.Connection, principal, digest: str) -> None:
    """Raises Forbidden when a worker's active tasks do not name `digest`, or when no job a non-admin user
    may read names it (NotFound when it is not stored at all)."""
    if principal.kind == "worker" and \
            row(conn, "artifact_allowed_for_worker", worker_id=principal.worker_id, digest=digest) is None:
        raise Forbidden("this worker's tasks do not name that artifact")
    if principal.kind == "client" and not principal.admin and \
            row(conn, "artifact_allowed_for_user", user_id=principal.user_id, digest=digest) is None:
        if row(conn, "artifact_recorded", digest=digest) is None:
            raise NotFound(f"no artifact {digest}")
        raise Forbidden(f"artifact {digest} is named by no job whose outputs you may read "
                        "(only admins download any artifact)")


def check_probe(conn: apsw.Connection, principal, digest: str) -> None:
    """May the caller learn whether `digest` exists? Raises Forbidden if not.

    A worker asks before uploading an output (dedup): existence of a digest it
    already knows reveals nothing else, so holding a task is enough.
    """
    if principal.kind == "worker" and row(conn, "worker_holds_task", worker_id=principal.worker_id) is None:
        check_read(conn, principal, digest)


def check_upload(conn: apsw.Connection, principal, length: int | None, limit: int) -> None:
    """Raises Forbidden when a worker holds no active task, BodyTooLarge past `limit`."""
    if principal.kind != "worker":
        return
    if row(conn, "worker_may_upload", worker_id=principal.worker_id) is None:
        raise Forbidden("a worker uploads only the outputs and checkpoints of a task it runs, and it holds none")
    if length is not None and length > limit:
        raise BodyTooLarge(f"an output of {length} bytes is over the limit of {limit} (--max-output-mb)")


def record(conn: apsw.Connection, digest: str, size: int, now: float) -> None:
    """An artifact arrived (or was used again): its row, for the retention sweep."""
    row(conn, "record_artifact", digest=digest, size=size, now=now)


class Capped:
    """A stream that raises BodyTooLarge once more than `limit` bytes were read from it."""

    def __init__(self, stream, limit: int):
        self.stream, self.left, self.limit = stream, limit, limit

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.left -= len(data)
        if self.left < 0:
            raise BodyTooLarge(f"an output is over the limit of {self.limit} bytes (--max-output-mb)")
        return data
