"""A worker that leaves gracefully hands back what it never started."""
from __future__ import annotations

from helpers import add_worker, job, state_of


def test_deregister_requeues_what_the_worker_never_started(sched):
    w = add_worker(sched)
    first = sched.submit(job())
    sched.acquire(w)  # assigned, never started (the agent was stopping)
    sched.deregister(w)
    info = state_of(sched, first)
    assert info["state"] == "queued" and info["attempt"] == 1
    other = add_worker(sched, "w2")
    assert sched.acquire(other)["job_id"] == first
