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

A job that ends settles the jobs waiting on it (job_dependencies): one whose
last dependency ended is released (queued, its tasks let into task_queue),
one whose dependency ended against its condition is cancelled with reason
`dependency_failed`, which ends it in turn (a cascade). A cancel, a cascade,
a release and a big array's submit run in bounded steps (`end_step`,
`settle_step`, `release_step`, `insert_step`: at most BATCH task rows or
FANOUT jobs a write), each asked
for with cascades.follow, so that no transaction holds the writer for long
(scheduler/cascades.py); a job being cancelled keeps its state, with its
`reason` set, until its last task ended.
"""
from __future__ import annotations

import functools
import json
import re

import apsw

from gpulayer.protocol import array_text
from gpulayer.server.scheduler import cascades, events, rollout, service_drain
from gpulayer.server.scheduler.spec import array_indices
from gpulayer.server.store.queries import QUERIES, one, row, rows

ACTIVE = ("queued", "assigned", "running")
ACTIVE_JOB = ("queued", "running", "waiting")
FINAL_JOB_STATE = {"failed": "failed", "lost": "lost", "cancelled": "cancelled"}
#: Reasons the retry policy reads as another: a task its worker stopped (SIGTERM), one a drain's
#: deadline stopped, or one whose GPU turned unhealthy was lost with its worker (or device).
RETRY_AS = {"worker_stopped": "worker_lost", "worker_drained": "worker_lost", "gpu_unhealthy": "worker_lost"}
# One cascade step's bounds (a few ms of the writer each on 2 cores; docs/benchmarks/issue-22.md, "Cascades").
BATCH = 250     # task rows one step ends or releases
FANOUT = 100    # waiting jobs one step settles


def settle(conn: apsw.Connection, now: float, job_id: int, attempt: int, task: dict) -> str | None:
    """Decide the job's fate after `task` (its row, already ended) ended; returns the job's new state, if any.

    `task` holds at least state, reason and exit_code; `judged` (optional) is the reason the retry policy
    reads (failed, timed_out, start_timeout) where `reason` holds an agent's words.
    """
    job = row(conn, "job_for_update", job_id=job_id)
    if job is not None and job["kind"] == "service" and service_drain.was_draining(conn, task["id"]):
        return None  # a replica that left its service (scale-down, an update): not replaced, ends nothing
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
    if job["kind"] == "service" and rollout.absorbs(conn, now, job_id, task):
        return None  # a replica of the revision being rolled out failed (rolled back) or was lost (surged again)
    reason = task.get("reason") or task["state"]
    retryable = retry_reason(task) in json.loads(job["retry_on"])
    if (retryable and job["kind"] == "service" and task["state"] == "lost"
            and _replace_replica(conn, now, job, task)):
        return None
    if retryable and retries_left(conn, job, job["attempt"]):
        retry(conn, now, job, reason)
        return "queued"
    _stop_siblings(conn, now, job_id, attempt, f"{reason} (task {task['id']})")
    return finish(conn, now, job_id, FINAL_JOB_STATE.get(task["state"], "failed"), task.get("exit_code"), reason)


def retry_reason(task: dict) -> str:
    """The reason the retry policy reads for an ended task: its `judged` reason, else its reason (or
    state), read through RETRY_AS."""
    reason = task.get("judged") or task.get("reason") or task["state"]
    return RETRY_AS.get(reason, reason)


def retries_left(conn: apsw.Connection, job: dict, attempt: int, index: int | None = None) -> bool:
    """Whether the job (array element `index`) at `attempt` may be retried: its attempts not made by a
    `job requeue` (jobcontrol._attempt_requeued) are fewer than its max_attempts."""
    if attempt < job["max_attempts"]:
        return True
    requeued = one(conn, "requeued_attempts", job_id=job["id"], index=index)["n"]
    return attempt - requeued < job["max_attempts"]


def _replace_replica(conn: apsw.Connection, now: float, job: dict, task: dict) -> bool:
    """Queue a new task for a service replica lost with its worker; the other replicas keep running.

    A service's replicas are independent servers, so losing one machine must
    not restart the healthy ones (as retrying the whole attempt would). Each
    replica index may be placed `max_attempts` times per attempt; past that
    (False), the job's ordinary policy decides. A one-replica service simply
    retries its attempt, which is the same thing with the attempt counted.
    """
    tasks = rows(conn, "attempt_tasks", job_id=job["id"], attempt=job["attempt"])
    index = next((t["index"] for t in tasks if t["id"] == task["id"]), None)
    if job["width"] < 2 and not any(t["state"] in ACTIVE for t in tasks):
        return False  # the only replica (an autoscaled service may have had more): the attempt is retried
    placed = sum(t["index"] == index and t["drain_deadline"] is None for t in tasks)  # a drained one left on purpose
    if index is None or placed >= job["max_attempts"]:
        return False
    # Of the revision the lost replica ran (a rolling update's new one, while it rolls out: rollout.py).
    new = one(conn, "insert_revision_task", job_id=job["id"], index=index, attempt=job["attempt"],
              priority=job["priority"], now=now, revision=rollout.revision_of(conn, task["id"]))
    events.record(conn, now, "replica_replaced", job_id=job["id"], task_id=task["id"], new_task_id=new["id"],
                  index=index, reason=task.get("reason"))
    return True


def _succeeded(conn: apsw.Connection, now: float, job: dict) -> str | None:
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


def _stop_siblings(conn: apsw.Connection, now: float, job_id: int, attempt: int, reason: str) -> None:
    for stopped in rows(conn, "stop_attempt_tasks", job_id=job_id, attempt=attempt, state="cancelled",
                        reason=reason, now=now):
        events.record(conn, now, "task_stopped", job_id=job_id, task_id=stopped["id"], reason=reason)


def retry(conn: apsw.Connection, now: float, job: dict, reason: str) -> int:
    """Replace the job's current attempt by a new one, queued; returns the new attempt number."""
    for old in rows(conn, "detach_running_tasks", job_id=job["id"], attempt=job["attempt"], state="cancelled",
                    reason="attempt_replaced", now=now):
        events.record(conn, now, "task_stopped", job_id=job["id"], task_id=old["id"], worker_id=old["worker_id"],
                      reason="attempt_replaced")
    new = one(conn, "next_attempt", job_id=job["id"])
    for index in range(new["width"]):
        row(conn, "insert_task", job_id=job["id"], index=index, attempt=new["attempt"],
            priority=new["priority"], now=now)
    events.record(conn, now, "job_retried", job_id=job["id"], attempt=new["attempt"], reason=reason)
    return new["attempt"]


def finish(conn: apsw.Connection, now: float, job_id: int, state: str, exit_code: int | None, reason: str | None) -> str | None:
    """End the job once, and settle the jobs that wait on it; returns its final state, or None when it had
    ended already."""
    if row(conn, "finish_job", job_id=job_id, state=state, exit_code=exit_code, reason=reason, now=now) is None:
        return None
    events.record(conn, now, "job_finished", job_id=job_id, state=state, exit_code=exit_code, reason=reason)
    settle_step(conn, now, job_id)  # the jobs that wait on it: the first FANOUT now, the rest in steps
    return state


# -- arrays ------------------------------------------------------------------

def settle_element(conn: apsw.Connection, now: float, job: dict, task: dict, *, freed: bool) -> str | None:
    """An array element's task ended (`freed`: it was released, so the next held one may go): retry that
    element alone, or release the next and end the array once no element is left to run."""
    if task["state"] not in ("succeeded", "cancelled"):
        reason = task.get("reason") or task["state"]
        element = one(conn, "task_element", task_id=task["id"])
        if (retry_reason(task) in json.loads(job["retry_on"])
                and retries_left(conn, job, element["attempt"], element["index"])):
            new = one(conn, "insert_task", job_id=job["id"], index=element["index"], attempt=element["attempt"] + 1,
                      priority=job["priority"], now=now)
            events.record(conn, now, "element_retried", job_id=job["id"], task_id=task["id"], new_task_id=new["id"],
                          index=element["index"], attempt=element["attempt"] + 1, reason=reason)
            return None  # the retry takes the ended task's place under the cap
    if freed:
        rows(conn, "release_held_tasks", job_id=job["id"], n=1, now=now)
    if row(conn, "job_has_active_task", job_id=job["id"]) is not None:
        return None
    if job["reason"] is not None:  # being cancelled (end_step) and this was its last element: cancelled
        return finish(conn, now, job["id"], "cancelled", None, job["reason"])
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


def cancel(conn: apsw.Connection, now: float, job_id: int, reason: str) -> None:
    """Start cancelling an active job for `reason` (cancelled, dependency_failed) and run its first
    end_step now: a job of up to BATCH tasks (any job but a big array) ends in this transaction."""
    row(conn, "mark_job_ending", job_id=job_id, reason=reason)
    end_step(conn, now, job_id)


def cancel_dependent(conn: apsw.Connection, now: float, job_id: int, after_job_id: int, state: str | None = None, *,
                     first_step: bool = False) -> None:
    """Cancel a job that can never run, its dependency `after_job_id` having ended (in `state`) against
    its condition: reason dependency_failed, in end_steps of their own (`first_step`: the first now)."""
    events.record(conn, now, "dependency_failed", job_id=job_id, after=after_job_id, state=state)
    if first_step:
        cancel(conn, now, job_id, "dependency_failed")
        return
    row(conn, "mark_job_ending", job_id=job_id, reason="dependency_failed")
    _follow(conn, now, ("end", job_id, 0))


def end_step(conn: apsw.Connection, now: float, job_id: int, _arg: int = 0) -> None:
    """One step of a cancel: up to BATCH of the job's tasks not yet running end (an array's in one
    `elements_cancelled` event, not one per element); after the last, its running tasks are asked to
    stop and the job ends `cancelled`, which settles what waits on it. A no-op for a job not being
    cancelled (marked by mark_job_ending), so a step that runs twice changes nothing."""
    job = row(conn, "get_job", job_id=job_id)
    if job is None or job["state"] not in ACTIVE_JOB or job["reason"] is None:
        return
    reason, array = job["reason"], job["array_size"] is not None
    ended = rows(conn, "cancel_queued_batch", job_id=job_id, now=now, reason=reason, n=BATCH if array else -1)
    extra = {} if reason == "cancelled" else {"reason": reason}
    # An array's queued elements in one event; a task of any other job, or one that held a worker, in its own.
    alone = [t for t in ended if not array or t["worker_id"] is not None]
    together = [t for t in ended if array and t["worker_id"] is None]
    if together:
        events.record(conn, now, "elements_cancelled", job_id=job_id, count=len(together),
                      indices=array_text(sorted(t["index"] for t in together)), **extra)
    for task in alone:
        events.record(conn, now, "task_cancelled", job_id=job_id, task_id=task["id"], worker_id=task["worker_id"],
                      **extra)
    if array and len(ended) == BATCH:
        _follow(conn, now, ("end", job_id, 0))
        return
    for task in rows(conn, "cancel_running_tasks", job_id=job_id):
        events.record(conn, now, "task_cancel_requested", job_id=job_id, task_id=task["id"],
                      worker_id=task["worker_id"])
    finish(conn, now, job_id, "cancelled", None, reason)


def settle_step(conn: apsw.Connection, now: float, job_id: int, cursor: int = 0) -> None:
    """One step of settling the jobs waiting on `job_id`, which has ended: up to FANOUT of them (after
    job `cursor`) are released when their last dependency ended, or set to be cancelled when this one
    ended against their condition; each goes on in steps of its own (down a chain, one link a step)."""
    job = row(conn, "get_job", job_id=job_id)
    if job is None or job["finished_at"] is None:
        return
    found = rows(conn, "waiting_dependents", after_job_id=job_id, cursor=cursor, n=FANOUT)
    for dependent in found:
        if not dependency_met(dependent["condition"], job["state"]):
            cancel_dependent(conn, now, dependent["job_id"], job_id, job["state"])
            continue
        if not elements_made(conn, one(conn, "get_job", job_id=dependent["job_id"])):
            continue  # its last insert_step settles this again
        released = row(conn, "release_job", job_id=dependent["job_id"], now=now)
        if released is None:
            continue  # another dependency has not ended yet
        events.record(conn, now, "job_released", job_id=dependent["job_id"], after=job_id)
        _follow(conn, now, ("release", dependent["job_id"], released["max_running"] or -1))
    if len(found) == FANOUT:
        _follow(conn, now, ("settle", job_id, found[-1]["job_id"]))


def release_step(conn: apsw.Connection, now: float, job_id: int, count: int = -1) -> None:
    """One step of releasing a job's held tasks into task_queue: up to BATCH of the `count` left
    (-1: all of them), lowest index first; the rest in steps of their own."""
    n = BATCH if count < 0 else min(count, BATCH)
    released = rows(conn, "release_held_tasks", job_id=job_id, n=n, now=now)
    if len(released) == n and count != n:
        _follow(conn, now, ("release", job_id, -1 if count < 0 else count - n))


def insert_step(conn: apsw.Connection, now: float, job_id: int, offset: int = 0) -> None:
    """One step of making a big array's elements: BATCH of them from the `offset`-th, held (so none runs
    and ends the array before the last is made); after the last, released as its %N cap (or none) says
    unless it waits, and what it waits on settled again (a dependency may have ended meanwhile: see
    settle_step). A no-op for an array that ended or is being cancelled: the rest are never made."""
    job = row(conn, "job_for_update", job_id=job_id)
    if job is None or job["state"] not in ACTIVE_JOB or job["reason"] is not None:
        return
    indices = _array_indices(json.loads(one(conn, "get_job", job_id=job_id)["spec"])["array"])
    made = indices[offset:offset + BATCH]
    if not made or row(conn, "array_element_made", job_id=job_id, index=made[0]) is not None:
        return  # a step that ran already
    conn.execute(QUERIES["insert_tasks"], {"job_id": job_id, "indices": json.dumps(made), "now": now,
                                           "priority": job["priority"], "offset": offset, "released": 0})
    if offset + len(made) < len(indices):
        _follow(conn, now, ("insert", job_id, offset + len(made)))
    elif job["state"] != "waiting":
        _follow(conn, now, ("release", job_id, job["max_running"] or -1))
    else:
        for dep in rows(conn, "job_dependencies_of", job_id=job_id):
            if dep["state"] not in ACTIVE_JOB:
                _follow(conn, now, ("settle", dep["job"], job_id - 1))


def elements_made(conn: apsw.Connection, job: dict) -> bool:
    """Whether every element of an array has its first task (insert_step made the last); True for no array."""
    if job["array_size"] is None:
        return True
    last = int(re.split(r"[,-]", json.loads(job["spec"])["array"])[-1])  # its text is ascending ranges: "0-9,12"
    return row(conn, "array_element_made", job_id=job["id"], index=last) is not None


@functools.lru_cache(maxsize=8)
def _array_indices(text: str) -> list[int]:
    return array_indices(text)


#: The cascade steps by kind (cascades.Step), each idempotent.
STEPS = {"end": end_step, "settle": settle_step, "release": release_step, "insert": insert_step}


def run_step(conn: apsw.Connection, now: float, step: cascades.Step) -> None:
    """Run one cascade step (runtime/cascades.py's Cascades calls this, in a write of its own)."""
    kind, job_id, arg = step
    STEPS[kind](conn, now, job_id, arg)


def _follow(conn: apsw.Connection, now: float, step: cascades.Step) -> None:
    """Ask for `step` in a write of its own; with nothing to collect it, run it and all that follows now,
    in this transaction (a loop, not recursion: a chain may be thousands of jobs long)."""
    if cascades.follow(step):
        return
    with cascades.collecting() as noted:
        pending = [step]
        while pending:
            run_step(conn, now, pending.pop(0))
            pending.extend(noted)
            noted.clear()
