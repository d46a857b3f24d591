"""No task lease outlives its worker's (found by scripts/chaos.py: an offline worker held running tasks)."""
from __future__ import annotations

from helpers import add_worker, job, state_of


def test_a_task_acquired_after_the_last_heartbeat_is_lost_with_its_worker(sched, clock):
    w = add_worker(sched)                 # the worker's lease: now + 3 s
    j = sched.submit(job())
    clock.advance(2.0)
    a = sched.acquire(w)                  # the task's lease: now + 3 s; the acquire renews the worker's too
    sched.start(w, a["task_id"], 100)
    # A task's lease later than its worker's (a gang rank placed on it by another worker's acquire does
    # not renew it): the worker's own lease decides.
    sched.store.write(lambda c: c.execute("UPDATE tasks SET lease_expires_at = lease_expires_at + 10"))
    clock.advance(1.5)
    assert sched.expire() == {"tasks_lost": 0, "workers_offline": 0, "gangs_released": 0}  # acquire/start renewed
    clock.advance(1.6)                    # the worker has been silent past its lease (3 s after its start)
    assert sched.expire() == {"tasks_lost": 1, "workers_offline": 1, "gangs_released": 0}
    info = state_of(sched, j)
    assert info["tasks"][0]["state"] == "lost" and info["state"] == "lost"
    held = sched.store.read(lambda c: c.execute(
        "SELECT count(*) AS n FROM tasks t JOIN workers w ON w.id = t.worker_id "
        "WHERE t.state IN ('assigned', 'running') AND w.state <> 'online'").fetchall())
    assert held == [{"n": 0}]
