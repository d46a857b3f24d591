"""Issue 22 item 2: a big cancel or cascade never holds the writer long enough to lose a healthy task.

A real server process (heartbeat 0.5 s, lease TTL 3 s) and a real worker running a long task. Four
arrays of 50,000 elements wait on one job, a fifth (released, placeable nowhere) is queued; cancelling
the one job and the fifth array ends 250,000 elements. In one transaction (before) that held the
writer for seconds, past the TTL, and wrote an event per element; now it runs in steps of at most
outcomes.BATCH elements, between which the worker's heartbeats are served. Watched from outside: the
long task's lease, as committed to the state file, must never lapse (a lapsed lease is one the next
expiry pass may take: the task lost), and nothing may be lost.
"""
from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from integration_cluster import Cluster

from gpulayer.server.scheduler import outcomes
from gpulayer.testing import wait_for

ARRAYS, SIZE = 4, 50_000
NOWHERE = {"labels": {"pool": "nowhere"}}  # no worker has it: its tasks stay queued


class LeaseWatch(threading.Thread):
    """Reads the running task's committed lease every 50 ms; `lapsed`: the times it was past already."""

    def __init__(self, state, job_id: int):
        super().__init__(daemon=True)
        self.state, self.job_id, self.stop, self.lapsed, self.reads = state, job_id, threading.Event(), [], 0

    def run(self) -> None:
        conn = sqlite3.connect(f"file:{self.state}?mode=ro", uri=True, timeout=10)
        try:
            while not self.stop.wait(0.05):
                found = conn.execute("SELECT lease_expires_at FROM tasks WHERE job_id = ? AND state = 'running'",
                                     (self.job_id,)).fetchone()
                self.reads += 1
                if found and found[0] < time.time():
                    self.lapsed.append(round(time.time() - found[0], 2))
        finally:
            conn.close()


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path).start_server(lease_ttl=3.0)
    try:
        c.start_worker("w1")
        yield c
    finally:
        c.close()


def test_a_big_cascade_and_cancel_keep_a_healthy_task_alive(cluster):
    long = cluster.submit({"command": ["sleep", "300"]})
    wait_for(lambda: cluster.job(long)["state"] == "running", 30, "the long job to run")
    root = cluster.submit({"command": ["true"], **NOWHERE})
    waiting = [cluster.submit({"command": ["true"], "array": f"0-{SIZE - 1}", "after": [root]})
               for _ in range(ARRAYS)]
    queued = cluster.submit({"command": ["true"], "array": f"0-{SIZE - 1}", **NOWHERE})
    assert all(cluster.job(j)["state"] == "waiting" for j in waiting)

    watch = LeaseWatch(cluster.state, long)
    watch.start()
    try:
        for job_id in (root, queued):
            answer = cluster.request("POST", f"/v1/jobs/{job_id}/cancel", json={}, timeout=120)
            assert answer.status_code == 200, answer.text
        assert cluster.job(queued)["state"] == "cancelled"  # the call ran its own job's steps to the end
        for job_id in waiting:  # the cascade goes on on the server's cascade thread
            done = cluster.wait_job(job_id, timeout=300)
            assert (done["state"], done["reason"]) == ("cancelled", "dependency_failed")
            assert done["array"]["counts"] == {"cancelled": SIZE}
    finally:
        watch.stop.set()
        watch.join()
    assert watch.reads > 0 and watch.lapsed == [], f"the lease lapsed by {watch.lapsed} s"

    # The healthy task lived through it all: never lost, its worker never offline.
    info = cluster.job(long)
    assert info["state"] == "running" and [t["state"] for t in info["tasks"]] == ["running"], info
    kinds = [e["kind"] for e in cluster.events(long)]
    assert "task_lost" not in kinds and "job_retried" not in kinds, kinds
    assert cluster.sql("SELECT count(*) FROM events WHERE kind IN ('worker_offline', 'task_lost')") == [(0,)]
    # One event per batch of elements, not one per element.
    per_array = -(-SIZE // outcomes.BATCH)
    assert cluster.sql("SELECT count(*) FROM events WHERE kind = 'elements_cancelled'") == \
        [((ARRAYS + 1) * per_array,)]
    assert cluster.sql("SELECT count(*) FROM events WHERE kind = 'task_cancelled'")[0][0] <= 1
    # Nothing is left half-cancelled: no active job has a reason (the mark of a cancel under way).
    assert cluster.sql("SELECT count(*) FROM jobs WHERE finished_at IS NULL AND reason IS NOT NULL") == [(0,)]
    answer = cluster.request("POST", f"/v1/jobs/{long}/cancel", json={})
    assert answer.status_code == 200, answer.text
    cluster.wait_job(long, timeout=30)
