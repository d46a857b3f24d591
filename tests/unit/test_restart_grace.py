"""A control plane that was down longer than the lease TTL loses nothing on its workers."""
from __future__ import annotations

from helpers import add_worker, job


def test_leases_are_extended_at_start_so_running_tasks_survive_a_long_outage(sched, clock):
    w = add_worker(sched)
    sched.submit(job())
    task = sched.acquire(w)
    sched.start(w, task["task_id"], 1)
    clock.advance(120)  # the server was down for two minutes; the worker kept running its task
    assert sched.restarted() == {"tasks": 1, "workers": 1}
    assert sched.expire() == {"tasks_lost": 0, "workers_offline": 0, "gangs_released": 0}
    hb = sched.heartbeat(w, [{"task_id": task["task_id"], "state": "running", "endpoint": None, "restarts": 0}])
    assert hb["cancel_task_ids"] == []
    clock.advance(sched.config.lease_ttl_s + 1)  # but a worker that does not come back is lost as usual
    assert sched.expire()["tasks_lost"] == 1

