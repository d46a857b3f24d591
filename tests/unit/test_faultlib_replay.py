"""The fault harness's event replay (tests/faultlib.py) catches a real double run and only that
(issue 36 item 17): a requeued task's `task_requeued` ends its hold, so a `job requeue` is not
reported as two running attempts, while a new attempt assigned with the old one still held is.
Crafted event logs, and the log a real scheduler writes for a requeue (a real state file)."""
from __future__ import annotations

import json

import faultlib
from helpers import add_worker, job


def _event(seq: int, kind: str, job_id: int = 1, task: int | None = None, worker: int | None = None, **data) -> dict:
    return {"seq": seq, "kind": kind, "job_id": job_id, "task_id": task, "worker_id": worker,
            "data": json.dumps(data)}


def _log(first_ends_with: str | None) -> list[dict]:
    """Attempt 1 (task 1) on worker 7, ended by `first_ends_with` (None: never), then attempt 2 (task 2)."""
    log = [_event(1, "task_assigned", task=1, worker=7, attempt=1), _event(2, "task_started", task=1, worker=7)]
    if first_ends_with is not None:
        log.append(_event(3, first_ends_with, task=1, worker=7, attempt=1, reason="requeued"))
    return log + [_event(4, "job_retried", attempt=2, reason="requeued"),
                  _event(5, "task_assigned", task=2, worker=8, attempt=2)]


def test_a_requeue_is_one_attempt_after_another():
    assert faultlib.replay(_log("task_requeued")) == []


def test_a_new_attempt_while_the_old_one_is_held_is_a_double_run():
    problems = faultlib.replay(_log(None))
    assert len(problems) == 1 and problems[0].startswith("two_running_attempts: job 1 task 2"), problems


def test_a_requeued_task_leaves_its_worker_holding_nothing():
    log = _log("task_requeued") + [_event(6, "worker_offline", job_id=None, worker=7)]
    assert faultlib.replay(log) == []
    held = _log(None)[:2] + [_event(6, "worker_offline", job_id=None, worker=7)]
    assert faultlib.replay(held)[0].startswith("lease_outlived_worker: worker 7")


def test_a_real_requeue_passes_every_invariant(sched, config):
    w = add_worker(sched, "w")
    j = sched.submit(job(retry={"max_attempts": 1}))
    first = sched.acquire(w)
    sched.start(w, first["task_id"], 100)
    sched.requeue(j)
    sched.finish(w, first["task_id"], exit_code=143, outcome="cancelled", outputs={}, reason="requeued")
    second = sched.acquire(w)
    assert second is not None and second["task_id"] != first["task_id"]
    assert faultlib.check_state(config.layout.state) == []
