"""What a job does when one of its tasks ends: wait, retry the attempt, or end.

A job's tasks of one attempt (its ranks) stand or fall together: a task that
fails or is lost stops its siblings, and the attempt is retried as a whole
when the reason is in `retry.retry_on` and attempts remain. A service replica
lost with its worker is the exception: only that replica is placed again.

An array's elements are the other exception: each element is one task with
its own attempts (retried alone, by the same policy), and the array ends when
no element is left to run: succeeded if every element's last task did, else
failed. A capped array (%N) keeps at most N tasks released (queued in
task_queue, or active); each element that ends releases the next held one.

A job that ends settles the jobs waiting on it (job_dependencies), in the same
transaction: one whose last dependency ended is released (queued, its tasks
let into task_queue), one whose dependency ended against its condition is
cancelled with reason `dependency_failed`, which ends it in turn (a cascade).
"""
from __future__ import annotations

import json

from gpulayer.server.scheduler import events
from gpulayer.server.store.queries import row, rows

ACTIVE = ("queued", "assigned", "running")
ACTIVE_JOB = ("queued", "running", "waiting")
FINAL_JOB_STATE = {"failed": "failed", "lost": "lost", "cancelled": "cancelled"}
#: Reasons the retry policy reads as another: a task its worker stopped (SIGTERM), one a drain's
#: deadline stopped, or one whose GPU turned unhealthy was lost with its worker (or device).
RETRY_AS = {"worker_stopped": "worker_lost", "worker_drained": "worker_lost", "gpu_unhealthy": "worker_lost"}


def settle(conn, now: float, job_id: int, attempt: int, task: dict) -> str | None:
    """Decide the job's fate after `task` (its row, already ended) ended; returns the job's new state, if any.

    `task` holds at least state, reason and exit_code.
    """
    job = row(conn, "job_for_update", job_id=job_id)
    if job is not None and job["array_size"] is not None and job["state"] in ("queued", "running"):
        return settle_element(conn, now, job, task, freed=True)
    if job is None or job["state"] not in ("queued", "running") or job["attempt"] != attempt:
        return None  # the job already ended, or this is an old attempt's straggler
    if task["state"] == "succeeded":
        return _succeeded(conn, now, job)
    if task["state"] == "cancelled":
        if not any(t["state"] in ACTIVE for t in rows(conn, "attempt_tasks", job_id=job_id, attempt=attempt)):
            return finish(conn, now, job_id, "cancelled", None, "cancelled")
        return None
    reason = task.get("reason") or task["state"]
    retryable = RETRY_AS.get(reason, reason) in json.loads(job["retry_on"])
    if (retryable and job["kind"] == "service" and job["width"] > 1 and task["state"] == "lost"
            and _replace_replica(conn, now, job, task)):
        return None
    if retryable and job["attempt"] < job["max_attempts"]:
        retry(conn, now, job, reason)
        return "queued"
    _stop_siblings(conn, now, job_id, attempt, f"{reason} (task {task['id']})")
    return finish(conn, now, job_id, FINAL_JOB_STATE.get(task["state"], "failed"), task.get("exit_code"), reason)


def _replace_replica(conn, now: float, job: dict, task: dict) -> bool:
    """Queue a new task for a service replica lost with its worker; the other replicas keep running.

    A service's replicas are independent servers, so losing one machine must
    not restart the healthy ones (as retrying the whole attempt would). Each
    replica index may be placed `max_attempts` times per attempt; past that
    (False), the job's ordinary policy decides. A one-replica service simply
    retries its attempt, which is the same thing with the attempt counted.
    """
    tasks = rows(conn, "attempt_tasks", job_id=job["id"], attempt=job["attempt"])
    index = next((t["index"] for t in tasks if t["id"] == task["id"]), None)
    if index is None or sum(t["index"] == index for t in tasks) >= job["max_attempts"]:
        return False
    new = row(conn, "insert_task", job_id=job["id"], index=index, attempt=job["attempt"],
              priority=job["priority"], now=now)
    events.record(conn, now, "replica_replaced", job_id=job["id"], task_id=task["id"], new_task_id=new["id"],
                  index=index, reason=task.get("reason"))
    return True


def _succeeded(conn, now: float, job: dict) -> str | None:
    siblings = rows(conn, "attempt_tasks", job_id=job["id"], attempt=job["attempt"])
    if job["kind"] == "service":
        # One replica ended for good with a clean exit: the service ends with it.
        _stop_siblings(conn, now, job["id"], job["attempt"], "replica_ended")
        return finish(conn, now, job["id"], "succeeded", 0, "replica_ended")
    if any(t["state"] in ACTIVE for t in siblings):
        return None
    if all(t["state"] == "succeeded" for t in siblings):
        return finish(conn, now, job["id"], "succeeded", 0, None)
    return None


def _stop_siblings(conn, now: float, job_id: int, attempt: int, reason: str) -> None:
    for stopped in rows(conn, "stop_attempt_tasks", job_id=job_id, attempt=attempt, state="cancelled",
                        reason=reason, now=now):
        events.record(conn, now, "task_stopped", job_id=job_id, task_id=stopped["id"], reason=reason)


def retry(conn, now: float, job: dict, reason: str) -> int:
    """Replace the job's current attempt by a new one, queued; returns the new attempt number."""
    for old in rows(conn, "detach_running_tasks", job_id=job["id"], attempt=job["attempt"], state="cancelled",
                    reason="attempt_replaced", now=now):
        events.record(conn, now, "task_stopped", job_id=job["id"], task_id=old["id"], worker_id=old["worker_id"],
                      reason="attempt_replaced")
    new = row(conn, "next_attempt", job_id=job["id"])
    for index in range(new["width"]):
        row(conn, "insert_task", job_id=job["id"], index=index, attempt=new["attempt"],
            priority=new["priority"], now=now)
    events.record(conn, now, "job_retried", job_id=job["id"], attempt=new["attempt"], reason=reason)
    return new["attempt"]


def finish(conn, now: float, job_id: int, state: str, exit_code: int | None, reason: str | None) -> str | None:
    """End the job once, and settle the jobs that wait on it; returns its final state, or None when it had
    ended already."""
    if row(conn, "finish_job", job_id=job_id, state=state, exit_code=exit_code, reason=reason, now=now) is None:
        return None
    events.record(conn, now, "job_finished", job_id=job_id, state=state, exit_code=exit_code, reason=reason)
    _settle_dependents(conn, now, job_id, state)
    return state


# -- arrays ------------------------------------------------------------------

def settle_element(conn, now: float, job: dict, task: dict, *, freed: bool) -> str | None:
    """An array element's task ended (`freed`: it was released, so the next held one may go): retry that
    element alone, or release the next and end the array once no element is left to run."""
    if task["state"] not in ("succeeded", "cancelled"):
        reason = task.get("reason") or task["state"]
        element = row(conn, "task_element", task_id=task["id"])
        if (RETRY_AS.get(reason, reason) in json.loads(job["retry_on"])
                and element["attempt"] < job["max_attempts"]):
            new = row(conn, "insert_task", job_id=job["id"], index=element["index"], attempt=element["attempt"] + 1,
                      priority=job["priority"], now=now)
            events.record(conn, now, "element_retried", job_id=job["id"], task_id=task["id"], new_task_id=new["id"],
                          index=element["index"], attempt=element["attempt"] + 1, reason=reason)
            return None  # the retry takes the ended task's place under the cap
    if freed:
        rows(conn, "release_held_tasks", job_id=job["id"], n=1, now=now)
    if row(conn, "job_has_active_task", job_id=job["id"]) is not None:
        return None
    failed = rows(conn, "array_failed_indices", job_id=job["id"], limit=1)
    if not failed:
        return finish(conn, now, job["id"], "succeeded", 0, None)
    return finish(conn, now, job["id"], "failed", failed[0]["exit_code"] or 1, "array_elements_failed")


# -- dependencies ------------------------------------------------------------

def dependency_met(condition: str, state: str) -> bool:
    """Whether a dependency that ended in `state` lets its dependent run (ok, notok or any)."""
    if condition == "any":
        return True
    return (state == "succeeded") == (condition == "ok")


def cancel_dependent(conn, now: float, job_id: int, after_job_id: int, state: str | None = None) -> bool:
    """Cancel a job that can never run, its dependency `after_job_id` having ended (in `state`) against
    its condition: reason dependency_failed. Its own dependents are left to the caller."""
    events.record(conn, now, "dependency_failed", job_id=job_id, after=after_job_id, state=state)
    for task in rows(conn, "cancel_queued_tasks", job_id=job_id, now=now, reason="dependency_failed"):
        events.record(conn, now, "task_cancelled", job_id=job_id, task_id=task["id"], reason="dependency_failed")
    if row(conn, "finish_job", job_id=job_id, state="cancelled", exit_code=None, reason="dependency_failed",
           now=now) is None:
        return False
    events.record(conn, now, "job_finished", job_id=job_id, state="cancelled", exit_code=None,
                  reason="dependency_failed")
    return True


def _settle_dependents(conn, now: float, job_id: int, state: str) -> None:
    """The jobs waiting on `job_id`, which just ended in `state`: released when their last dependency
    ended, cancelled when this one ended against their condition, and so on down a chain (a loop, not
    recursion: a chain may be thousands of jobs long)."""
    ended = [(job_id, state)]
    while ended:
        after, after_state = ended.pop()
        for dependent in rows(conn, "waiting_dependents", after_job_id=after):
            if not dependency_met(dependent["condition"], after_state):
                if cancel_dependent(conn, now, dependent["job_id"], after, after_state):
                    ended.append((dependent["job_id"], "cancelled"))
                continue
            released = row(conn, "release_job", job_id=dependent["job_id"])
            if released is None:
                continue  # another dependency has not ended yet
            rows(conn, "release_held_tasks", job_id=dependent["job_id"], n=released["max_running"] or -1, now=now)
            events.record(conn, now, "job_released", job_id=dependent["job_id"], after=after)
