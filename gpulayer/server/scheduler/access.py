"""Artifacts in the state file: who may read and write them, and the record of what arrived.

A digest is no read capability of its own (issue 36). A client uploads any artifact; an admin
downloads any, another user only what it uploaded itself or what a job it may read names (teams: the
`read` level). A worker reads only what it uploaded or what its active tasks name (their element's
checkpoints included), and uploads only while it holds a task (its outputs and checkpoints), up to
`max_output_bytes` a file. Naming a digest (a job's source, inputs, weights or image; a checkpoint's
file) needs the same right as reading it: otherwise the name would hand the bytes over. A probe
(HEAD) answers 404 for what the caller may not read, so that it uploads the bytes (and proves it holds
them) rather than name them. A user's uploads that no job names yet count against its upload quota
(and its project's: the project of a user in exactly one).
"""
from __future__ import annotations

import apsw

from gpulayer.server.errors import BodyTooLarge, Forbidden, NotFound
from gpulayer.server.scheduler import events
from gpulayer.server.store.queries import one, row, rows


def check_read(conn: apsw.Connection, principal, digest: str) -> None:
    """Raises Forbidden when a worker did not upload `digest` and its active tasks do not name it, or when a
    non-admin user did not upload it and no job it may read names it (NotFound when it is not stored at all)."""
    if principal.kind == "worker" and \
            row(conn, "artifact_allowed_for_worker", worker_id=principal.worker_id, digest=digest) is None:
        raise Forbidden("this worker's tasks do not name that artifact")
    if principal.kind == "client" and not principal.admin and \
            row(conn, "artifact_allowed_for_user", user_id=principal.user_id, digest=digest) is None:
        if row(conn, "artifact_recorded", digest=digest) is None:
            raise NotFound(f"no artifact {digest}")
        raise Forbidden(f"artifact {digest} is neither your upload nor named by a job whose outputs you may "
                        "read (only admins download any artifact)")


def may_read(conn: apsw.Connection, principal, digest: str) -> bool:
    """Whether the caller may read `digest` (admin, its own upload, a job it may read, its tasks')."""
    if principal.kind == "worker":
        return worker_may_read(conn, principal.worker_id, digest)
    return principal.admin or row(conn, "artifact_allowed_for_user", user_id=principal.user_id,
                                  digest=digest) is not None


def worker_may_read(conn: apsw.Connection, worker_id: int, digest: str) -> bool:
    """Whether a worker uploaded `digest` itself or its active tasks name it."""
    return row(conn, "artifact_allowed_for_worker", worker_id=worker_id, digest=digest) is not None


def outputs_it_may_name(conn: apsw.Connection, worker_id: int, task: dict, outputs: dict, now: float) -> dict:
    """A finish's outputs ({path: digest}) without those the worker may not read: an output is readable by
    whoever may read its job, so naming a digest there needs the right to read it. The left-out paths are
    an `outputs_refused` event of the task's job."""
    refused = sorted(path for path, digest in outputs.items() if not worker_may_read(conn, worker_id, digest))
    if refused:
        events.record(conn, now, "outputs_refused", job_id=task["job_id"], task_id=task["id"], worker_id=worker_id,
                      paths=refused[:20], why="the worker neither uploaded these artifacts nor do its tasks name them")
    return {path: digest for path, digest in outputs.items() if path not in refused}


def check_probe(conn: apsw.Connection, principal, digest: str) -> bool:
    """May the caller learn that `digest` is stored? False (a 404, so it uploads the bytes) when it may
    not read it; Forbidden for a worker that holds no task."""
    if principal.kind == "worker" and row(conn, "worker_holds_task", worker_id=principal.worker_id) is None:
        check_read(conn, principal, digest)
    return may_read(conn, principal, digest)


def check_named(conn: apsw.Connection, principal, digests, what: str = "a job") -> None:
    """Raises Forbidden for the first stored digest of `digests` the caller may not read: naming it (in
    `what`) would let it read the bytes. A digest not stored at all is left to the caller to report."""
    for digest in sorted(set(digests)):
        if row(conn, "artifact_recorded", digest=digest) is not None and not may_read(conn, principal, digest):
            raise Forbidden(f"artifact {digest} is not yours to name in {what}: upload its bytes yourself "
                            "(PUT /v1/artifacts/{digest}) or name one that a job you may read names",
                            code="artifact_forbidden")


def check_upload(conn: apsw.Connection, principal, length: int | None, limit: int) -> None:
    """Raises Forbidden when a worker holds no active task, BodyTooLarge past `limit`."""
    if principal.kind != "worker":
        return
    if row(conn, "worker_may_upload", worker_id=principal.worker_id) is None:
        raise Forbidden("a worker uploads only the outputs and checkpoints of a task it runs, and it holds none")
    if length is not None and length > limit:
        raise BodyTooLarge(f"an output of {length} bytes is over the limit of {limit} (--max-output-mb)")


def record(conn: apsw.Connection, digest: str, size: int, now: float, principal=None) -> None:
    """An artifact arrived (or was used again): its row, for the retention sweep, and who uploaded it."""
    row(conn, "record_artifact", digest=digest, size=size, now=now)
    if principal is None:
        return
    if principal.kind == "worker":
        row(conn, "record_upload", digest=digest, uploader="worker", uploader_id=principal.worker_id,
            project_id=None, now=now)
    elif principal.user_id is not None:
        row(conn, "record_upload", digest=digest, uploader="user", uploader_id=principal.user_id,
            project_id=upload_project(conn, principal), now=now)


def upload_project(conn: apsw.Connection, principal) -> int | None:
    """The project a user's uploads count against: its only project; None in none or several."""
    mine = rows(conn, "user_projects", user_id=principal.user_id)
    return mine[0]["id"] if len(mine) == 1 else None


def quota_left(conn: apsw.Connection, principal, length: int | None, user_quota: int,
               project_quota: int) -> tuple[int, BodyTooLarge] | None:
    """The bytes a user may still upload before a job names them, and the error past them (None: no quota
    applies: a worker, an admin, quotas of 0). Raises that error when `length` is over them already."""
    if principal.kind != "client" or principal.admin or principal.user_id is None:
        return None
    project_id = upload_project(conn, principal)
    used = one(conn, "unnamed_upload_bytes", user_id=principal.user_id, project_id=project_id or 0)
    lefts = []
    if user_quota > 0:
        lefts.append((user_quota - used["user_bytes"], f"user {principal.user}", user_quota, used["user_bytes"]))
    if project_quota > 0 and project_id is not None:
        lefts.append((project_quota - used["project_bytes"], "its project", project_quota, used["project_bytes"]))
    if not lefts:
        return None
    left, who, quota, held = min(lefts)
    error = quota_exceeded(who, quota, held)
    if left < (length or 1):
        raise error
    return left, error


def quota_exceeded(who: str, quota: int, held: int | None = None) -> BodyTooLarge:
    """The 413 of an upload past a quota of unnamed uploads."""
    now_held = "" if held is None else f" ({held} held now)"
    return BodyTooLarge(f"upload quota exceeded: the uploads of {who} that no job names yet may hold at most "
                        f"{quota} bytes{now_held}; submit the jobs that name them, or wait for the sweep "
                        "(server start --upload-quota-mb, --unnamed-retention)",
                        code="upload_quota_exceeded", quota_bytes=quota)


class Capped:
    """A stream that raises BodyTooLarge (`error`, else the worker's output limit) once more than `limit`
    bytes were read from it."""

    def __init__(self, stream, limit: int, error: BodyTooLarge | None = None):
        self.stream, self.left, self.limit, self.error = stream, limit, limit, error

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.left -= len(data)
        if self.left < 0:
            raise self.error or BodyTooLarge(f"an output is over the limit of {self.limit} bytes (--max-output-mb)")
        return data
