"""Checkpoints that follow a job (issue 27 part 2, docs/training.md): recorded, restored, listed, pruned.

A task's agent uploads its GPULAYER_CHECKPOINT_DIR file by file as artifacts, then records the
manifest (path, digest, size, mode) here: every `--checkpoint-every` on its own
(`POST /v1/worker/checkpoint`), and with the finish of an attempt that did not succeed, in the
finish's transaction. A checkpoint is written only when every file it names is stored with that
size, so an upload cut short never replaces the last complete one. Checkpoints belong to the job's
element or rank (`index`): the next attempt of the same index, on any worker, gets the newest in its
Assignment (`checkpoint`). The newest `keep` per index are kept (`server start --checkpoint-keep`).
"""

from __future__ import annotations

import json

import apsw

from gpulayer.server.errors import Conflict, Forbidden, NotFound, TaskNotAssigned
from gpulayer.server.scheduler import access, events
from gpulayer.server.store.queries import one, row, rows

#: Checkpoints kept per job element or rank, newest first (`server start --checkpoint-keep`).
DEFAULT_KEEP = 3
ACTIVE = ("assigned", "running")


def _task(conn: apsw.Connection, worker_id: int, task_id: int, attempt: int | None) -> dict:
    """The active task this worker holds, at `attempt` when given; TaskNotAssigned otherwise."""
    task = row(conn, "checkpoint_task", task_id=task_id, worker_id=worker_id)
    if task is None or task["state"] not in ACTIVE:
        raise TaskNotAssigned(f"task {task_id} is not assigned to this worker (it ended, was lost or was never yours)")
    if attempt is not None and task["attempt"] != attempt:
        raise TaskNotAssigned(f"task {task_id} is at attempt {task['attempt']}, not {attempt}")
    return task


def _missing(conn: apsw.Connection, files_json: str) -> list[dict]:
    return rows(conn, "checkpoint_missing_digests", files=files_json)


def _unreadable(conn: apsw.Connection, worker_id: int, task: dict, files: list[dict]) -> list[str]:
    """The paths of files whose artifact this worker may not read (it neither uploaded it nor do its tasks
    or an earlier checkpoint of the task's element name it): naming one in a checkpoint would hand its
    bytes to the worker and the job's readers."""
    allowed: dict[str, bool] = {}
    for f in files:
        if f["digest"] not in allowed:
            allowed[f["digest"]] = access.worker_may_read(conn, worker_id, f["digest"]) or row(
                conn, "element_checkpoint_names", job_id=task["job_id"], index=task["index"],
                digest=f["digest"]) is not None
    return [f["path"] for f in files if not allowed[f["digest"]]]


def _write(conn: apsw.Connection, task: dict, worker_id: int, files_json: str, kind: str, now: float, keep: int) -> dict:
    made = one(
        conn,
        "insert_checkpoint",
        job_id=task["job_id"],
        index=task["index"],
        task_id=task["id"],
        attempt=task["attempt"],
        worker_id=worker_id,
        kind=kind,
        now=now,
        files=files_json,
    )
    row(conn, "insert_checkpoint_files", checkpoint_id=made["id"], files=files_json)
    row(conn, "touch_checkpoint_artifacts", files=files_json, now=now)
    row(conn, "prune_element_checkpoint_files", job_id=task["job_id"], index=task["index"], keep=keep)
    pruned = rows(conn, "prune_element_checkpoints", job_id=task["job_id"], index=task["index"], keep=keep)
    events.record(
        conn,
        now,
        "checkpoint_recorded",
        job_id=task["job_id"],
        task_id=task["id"],
        worker_id=worker_id,
        checkpoint_id=made["id"],
        attempt=task["attempt"],
        index=task["index"],
        checkpoint_kind=kind,
        files=made["files"],
        bytes=made["bytes"],
        pruned=len(pruned),
    )
    return {"checkpoint_id": made["id"], "attempt": task["attempt"], "index": task["index"], "files": made["files"], "bytes": made["bytes"]}


def record(conn: apsw.Connection, worker_id: int, task_id: int, attempt: int | None, files: list[dict], now: float, keep: int = DEFAULT_KEEP) -> dict:
    """Record a periodic checkpoint of a task this worker holds; its id, files and bytes.

    Raises TaskNotAssigned (409) for a task not active on this worker (or at another attempt), Conflict
    `checkpoint_incomplete` (409) when a file's artifact is not stored with its size, Forbidden
    `artifact_forbidden` (403) when the worker may not read one (access.py): nothing is written.
    """
    task = _task(conn, worker_id, task_id, attempt)
    files_json = json.dumps(files)
    missing = _missing(conn, files_json)
    if missing:
        raise Conflict(
            f"the checkpoint names files not uploaded (or of another size): {', '.join(m['path'] for m in missing)}; nothing was recorded",
            code="checkpoint_incomplete",
        )
    unreadable = _unreadable(conn, worker_id, task, files)
    if unreadable:
        raise Forbidden(f"the checkpoint names artifacts this worker did not upload and its tasks do not name: "
                        f"{', '.join(unreadable[:5])}; nothing was recorded", code="artifact_forbidden")
    return _write(conn, task, worker_id, files_json, "periodic", now, keep)


def record_final(conn: apsw.Connection, worker_id: int, task: dict, files: list[dict], now: float, keep: int = DEFAULT_KEEP) -> None:
    """The checkpoint that came with a finish (`task`: its row as the finish read it; a rank its attempt's end
    stopped has ended already, and its checkpoint counts unless a later attempt left one): written in
    the finish's transaction; one naming a file not stored is left out with a `checkpoint_incomplete` event
    (the finish itself is never refused for it)."""
    if task["state"] not in ACTIVE and row(conn, "checkpoint_of_later_attempt", job_id=task["job_id"],
                                           index=task["index"], attempt=task["attempt"]) is not None:
        return  # a rank stopped with its attempt, finishing after the next attempt checkpointed: too old
    files_json = json.dumps(files)
    missing = [m["path"] for m in _missing(conn, files_json)] or _unreadable(conn, worker_id, task, files)
    if missing:
        events.record(
            conn,
            now,
            "checkpoint_incomplete",
            job_id=task["job_id"],
            task_id=task["id"],
            worker_id=worker_id,
            attempt=task["attempt"],
            missing=missing[:5],
        )
        return
    _write(conn, task, worker_id, files_json, "final", now, keep)


def latest(conn: apsw.Connection, job_id: int, index: int) -> dict | None:
    """The checkpoint the next attempt of an element restores (the Assignment's `checkpoint`), or None."""
    found = row(conn, "latest_checkpoint", job_id=job_id, index=index)
    if found is None:
        return None
    return {"id": found["id"], "attempt": found["attempt"], "files": rows(conn, "checkpoint_manifest", checkpoint_id=found["id"])}


def listing(conn: apsw.Connection, job_id: int, index: int | None, after: int, limit: int) -> list[dict]:
    """A job's checkpoints (one element's with `index`), oldest first, `limit` of them after id `after`."""
    return rows(conn, "list_checkpoints", job_id=job_id, index=index, after=after, n=limit)


def get(conn: apsw.Connection, job_id: int, index: int | None, attempt: int | None, checkpoint_id: int | None) -> dict:
    """One checkpoint with its files: by id, else the newest of `attempt`, else the newest (of `index`).

    Raises NotFound when the job has none that matches.
    """
    found = row(conn, "job_checkpoint", job_id=job_id, index=index, attempt=attempt, checkpoint_id=checkpoint_id)
    if found is None:
        raise NotFound(f"job {job_id} has no such checkpoint", code="no_checkpoint")
    return {**found, "manifest": rows(conn, "checkpoint_manifest", checkpoint_id=found["id"])}
