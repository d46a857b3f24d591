"""A task's life on its worker: start, logs, rendezvous, finish; each ownership-checked."""
from __future__ import annotations

import json

import apsw

from gpulayer.server.scheduler import events

from gpulayer.server.scheduler import access, checkpoints, jobcontrol, outcomes, preemption
from gpulayer.server.errors import TaskNotAssigned
from gpulayer.server.store.queries import QUERIES, one, row, rows

# outcome reported by the worker → (task state, reason)
OUTCOMES = {"succeeded": ("succeeded", None), "failed": ("failed", "failed"),
            "timed_out": ("failed", "timed_out"), "cancelled": ("cancelled", "cancelled")}


def _owned(conn: apsw.Connection, worker_id: int, task_id: int, *, active: bool = True) -> dict:
    task = row(conn, "task_owned", task_id=task_id, worker_id=worker_id)
    if task is None or (active and task["state"] not in ("assigned", "running")):
        raise TaskNotAssigned(f"task {task_id} is not assigned to this worker (it was cancelled, lost or never yours)")
    return task


def start(conn: apsw.Connection, worker_id: int, task_id: int, pid: int | None, now: float) -> None:
    """The worker started the task. Starting twice is harmless; anything else is 409 task_not_assigned."""
    started = row(conn, "start_task", task_id=task_id, worker_id=worker_id, pid=pid, now=now)
    if started is not None:
        events.record(conn, now, "task_started", job_id=started["job_id"], task_id=task_id, worker_id=worker_id,
                      pid=pid)
        return
    task = _owned(conn, worker_id, task_id)
    if task["state"] != "running" or task["cancel_requested"]:
        raise TaskNotAssigned(f"task {task_id} was cancelled before it started")
    if pid is not None and task["pid"] != pid:
        row(conn, "set_task_pid", task_id=task_id, pid=pid)


def append_logs(conn: apsw.Connection, worker_id: int, task_id: int, lines: list[dict]) -> int:
    """Store log lines once each (by their `n`); returns how many were new."""
    task = _owned(conn, worker_id, task_id, active=False)
    before = conn.total_changes()
    conn.executemany(QUERIES["insert_log"], [
        {"job_id": task["job_id"], "task_id": task_id, "n": line["n"], "stream": line["stream"],
         "at": line["at"], "text": line["text"]} for line in lines])
    return conn.total_changes() - before


def rendezvous(conn: apsw.Connection, worker_id: int, task_id: int, address: str, port: int, now: float) -> dict:
    """Record where this rank listens; once every rank has arrived, everyone's place."""
    task = _owned(conn, worker_id, task_id)
    job = one(conn, "job_for_update", job_id=task["job_id"])
    if task["attempt"] != job["attempt"]:
        raise TaskNotAssigned(f"task {task_id} belongs to a replaced attempt")
    conn.execute(QUERIES["rendezvous_arrive"], {"job_id": task["job_id"], "attempt": task["attempt"],
                                                "rank": task["index"], "task_id": task_id, "address": address,
                                                "port": port, "now": now})
    peers = rows(conn, "rendezvous_peers", job_id=task["job_id"], attempt=task["attempt"])
    if len(peers) < job["width"]:
        return {"ready": False, "arrived": len(peers), "world_size": job["width"]}
    master = peers[0]
    return {"ready": True, "rank": task["index"], "world_size": job["width"],
            "master_addr": master["address"], "master_port": master["port"],
            "peers": [f"{p['address']}:{p['port']}" for p in peers]}


def finish(conn: apsw.Connection, worker_id: int, task_id: int, exit_code: int | None, outcome: str, outputs: dict,
           reason: str | None, now: float, *, lines=(), pid: int | None = None, checkpoint: list[dict] | None = None,
           keep: int = checkpoints.DEFAULT_KEEP, signals=()) -> bool:
    """Record a task's result; False (and only an event) when the task was lost or cancelled meanwhile.

    `pid`: the worker never sent this task's start (its process ended first); a task still `assigned`
    is started here first, as `start` would have, in the same transaction (a cancel requested before it
    makes the whole finish 409 task_not_assigned, as the start would have been). `checkpoint`: the
    manifest of the task's checkpoint directory (an attempt that did not succeed), recorded first, in this
    transaction, while the task is still this worker's (checkpoints.record_final). Raises TaskNotAssigned
    for a task that was never this worker's.
    """
    state, default_reason = OUTCOMES[outcome]
    done = _owned(conn, worker_id, task_id, active=False)
    outputs = access.outputs_it_may_name(conn, worker_id, done, outputs, now)
    if pid is not None and done["state"] == "assigned":
        start(conn, worker_id, task_id, pid, now)
        done = {**done, "state": "running", "pid": pid}
    if lines:  # the last lines ride along with the result: one call, one transaction
        append_logs(conn, worker_id, task_id, lines)
    for sent in signals:  # what the agent sent its process (--signal's warning, a planned stop's signal)
        events.record(conn, now, "task_signalled", job_id=done["job_id"], task_id=task_id, worker_id=worker_id,
                      attempt=done["attempt"], signal=sent["signal"], why=jobcontrol.signal_why(conn, done, sent),
                      sent_at=sent["at"])
    if checkpoint is not None and done["state"] != "succeeded":
        checkpoints.record_final(conn, worker_id, done, checkpoint, now, keep)
    if state == "cancelled" and done["state"] in ("assigned", "running") and not done["cancel_requested"]:
        # Nobody asked to cancel it: its worker stopped it (SIGTERM, a drain that ran out). The agent's
        # text stays in the logs; the retry policy judges the task as `worker_lost` (outcomes.RETRY_AS).
        state, default_reason, reason = "lost", "worker_stopped", None
    if done["cancel_requested"] and done["reason"] == "requeued":  # job requeue: queued again, a new attempt
        return jobcontrol.requeued(conn, worker_id, done, exit_code, outcome, json.dumps(outputs), now)
    if done["cancel_requested"] and done["reason"] == "gpu_unhealthy" and outcome != "succeeded":
        state, default_reason, reason = "lost", "gpu_unhealthy", None  # stopped for its GPU (gpu_health)
    elif done["cancel_requested"] and outcome != "succeeded" and preemption.requeue(conn, worker_id, done, now):
        return True  # stopped to make room: queued again, same attempt
    ended = row(conn, "finish_task", task_id=task_id, worker_id=worker_id, state=state, exit_code=exit_code,
                outcome=outcome, reason=reason or default_reason, outputs=json.dumps(outputs), now=now)
    if ended is None:
        events.record(conn, now, "late_finish", job_id=done["job_id"], task_id=task_id,
                      worker_id=worker_id, exit_code=exit_code, outcome=outcome)
        return False
    events.record(conn, now, "task_finished", job_id=ended["job_id"], task_id=task_id, worker_id=worker_id,
                  exit_code=exit_code, outcome=outcome, state=state, reason=reason or default_reason)
    # The retry policy judges the outcome, never the agent's words ("exit code 1", "timeout: ..."),
    # which stay the task's (and the job's) reason for people to read.
    judged = _start_timed_out(conn, done) if default_reason == "failed" else default_reason
    outcomes.settle(conn, now, ended["job_id"], ended["attempt"],
                    {"id": task_id, "state": state, "reason": reason or default_reason, "judged": judged,
                     "exit_code": exit_code})
    return True


def _start_timed_out(conn: apsw.Connection, task: dict) -> str:
    """How the retry policy judges a failed task: `start_timeout` for a gang rank that arrived at its
    attempt's rendezvous and failed while a rank was still missing (its agent's rendezvous timeout:
    the command never started), else `failed`."""
    job = one(conn, "job_for_update", job_id=task["job_id"])
    if not job["gang"] or job["width"] < 2:
        return "failed"
    peers = rows(conn, "rendezvous_peers", job_id=task["job_id"], attempt=task["attempt"])
    arrived = any(p["rank"] == task["index"] for p in peers)
    return "start_timeout" if arrived and len(peers) < job["width"] else "failed"
