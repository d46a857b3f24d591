"""No task lease outlives its worker's (found by scripts/chaos.py: an offline worker held running tasks)."""
from __future__ import annotations

from helpers import add_worker, job, state_of


def test_a_task_acquired_after_the_last_heartbeat_is_lost_with_its_worker(sched, clock):
    w = add_worker(sched)                 # the worker's lease: now + 3 s
    j = sched.submit(job())
    clock.advance(2.0)
    a = sched.acquire(w)                  # the task's lease: now + 3 s, 2 s after the worker's
    sched.start(w, a["task_id"], 100)
    clock.advance(1.5)                    # the worker has been silent past its lease
    assert sched.expire() == {"tasks_lost": 1, "workers_offline": 1, "gangs_released": 0}
    info = state_of(sched, j)
    assert info["tasks"][0]["state"] == "lost" and info["state"] == "lost"
    held = sched.store.read(lambda c: c.execute(
        "SELECT count(*) AS n FROM tasks t JOIN workers w ON w.id = t.worker_id "
        "WHERE t.state IN ('assigned', 'running') AND w.state <> 'online'").fetchall())
    assert held == [{"n": 0}]
