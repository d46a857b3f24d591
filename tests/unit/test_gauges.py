"""The counts /metrics reports are the scheduler's answer (scheduler/gauges.py), on a real state file."""
from __future__ import annotations

from helpers import add_worker, job


def test_an_empty_state_counts_nothing(sched):
    assert sched.gauges() == {"jobs": {}, "workers": {}, "cordoned": {}, "gpus_unhealthy": 0, "queue": [],
                              "leases_expired": 0, "artifact_bytes": 0, "artifacts": 0}


def test_jobs_workers_and_the_queue_by_labels(sched, clock):
    w = add_worker(sched, "w", labels={"pool": "a"})
    add_worker(sched, "other")
    sched.submit(job(labels={"pool": "a"}))
    sched.submit(job(labels={"pool": "a"}))
    sched.submit(job())
    sched.acquire(w)
    sched.cordon("other", "maintenance")
    got = sched.gauges()
    assert got["jobs"] == {"queued": 2, "running": 1}
    assert got["workers"] == {"online": 2}
    assert got["cordoned"] == {"cordoned": 1}
    assert sorted(got["queue"], key=lambda q: len(q[0])) == [({}, 1), ({"pool": "a"}, 1)]
