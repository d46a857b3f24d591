"""A queued job says why it waits, down to "the workers that fit are busy"."""
from __future__ import annotations

from helpers import add_worker, job, state_of


def test_a_job_waiting_for_a_busy_worker_says_so(sched):
    w = add_worker(sched, gpus=1)
    first = sched.submit(job(gpus=1))
    sched.start(w, sched.acquire(w)["task_id"], 1)
    second = sched.submit(job(gpus=1))
    assert state_of(sched, first)["waiting_reason"] is None
    assert state_of(sched, second)["waiting_reason"].startswith("waiting for capacity")
    assert "1 GPUs" in state_of(sched, second)["waiting_reason"]

