"""Issue 25 item 3 (a, b): array elements leased ahead in chunks and finishes sent in batches, with a real
control plane and real worker processes: each element runs to its end once, an element leased ahead goes
back to the queue (same attempt) when its worker is killed, `%N` holds across workers, and a cancel stops
what is queued on an agent."""
from __future__ import annotations

import time

import pytest

from gpulayer.testing import wait_for
from integration_cluster import Cluster

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path).start_server()
    try:
        yield c
    finally:
        c.close()


def _ahead_held(cluster, job_id, worker=None) -> list[int]:
    query = "SELECT id FROM tasks WHERE job_id = ? AND state = 'assigned' AND ahead = 1"
    if worker is not None:
        query += " AND worker_id = ?"
    return [r[0] for r in cluster.sql(query, (job_id,) if worker is None else (job_id, worker))]


def test_five_hundred_elements_each_finish_once_through_chunks(cluster):
    cluster.start_worker("w1", parallel=2)
    cluster.start_worker("w2", parallel=2)
    job_id = cluster.submit({"command": ["true"], "array": "0-499"})
    assert cluster.wait_job(job_id, timeout=240)["state"] == "succeeded"
    tasks = cluster.sql("SELECT \"index\", attempt, state FROM tasks WHERE job_id = ? ORDER BY \"index\"", (job_id,))
    assert [t[0] for t in tasks] == list(range(500))  # one row (one attempt) per element
    assert {(t[1], t[2]) for t in tasks} == {(1, "succeeded")}
    finished = cluster.sql("SELECT task_id, count(*) FROM events WHERE job_id = ? AND kind = 'task_finished' "
                           "GROUP BY task_id", (job_id,))
    assert len(finished) == 500 and {n for _, n in finished} == {1}
    ahead = cluster.sql("SELECT count(*) FROM events WHERE job_id = ? AND kind = 'task_assigned' "
                        "AND json_extract(data, '$.ahead')", (job_id,))[0][0]
    assert ahead > 0  # elements were leased ahead, not one round trip each


def test_a_killed_worker_gives_its_elements_leased_ahead_back_without_spending_attempts(cluster):
    doomed = cluster.start_worker("w1", parallel=2)
    w1 = cluster.wait_online("w1")
    job_id = cluster.submit({"command": ["sh", "-c", "sleep 0.02"], "array": "0-399"})  # many left when w1 dies
    held = wait_for(lambda: len(h := _ahead_held(cluster, job_id, w1)) >= 5 and h, 120, "elements leased ahead")
    doomed.kill()
    killed_at = time.time()
    cluster.start_worker("w2", parallel=2)
    assert cluster.wait_job(job_id, timeout=240)["state"] in ("succeeded", "failed")
    rows = {r[0]: r[1:] for r in cluster.sql("SELECT id, state, attempt, worker_id FROM tasks WHERE job_id = ?",
                                             (job_id,))}
    lost = [i for i, (state, _, _) in rows.items() if state == "lost"]
    assert len(lost) <= 4, lost  # what ran on w1 when it was killed (2 slots), not what it held ahead
    requeued = [i for i in held if rows[i][2] != w1]
    assert len(requeued) >= len(held) - 4  # the rest ran on w2 after, at their first attempt
    assert all(rows[i][0] == "succeeded" and rows[i][1] == 1 for i in requeued)
    back = cluster.sql("SELECT count(*) FROM events WHERE job_id = ? AND kind = 'task_requeued' AND at >= ?",
                       (job_id, killed_at - 1))[0][0]
    assert back >= len(requeued)


def test_a_cap_holds_across_two_workers_with_elements_leased_ahead(cluster):
    cluster.start_worker("w1", parallel=4)
    cluster.start_worker("w2", parallel=4)
    job_id = cluster.submit({"command": ["true"], "array": "0-299%4"})
    most = 0
    while cluster.job(job_id)["state"] not in ("succeeded", "failed", "cancelled", "lost"):
        active = cluster.sql("SELECT count(*) FROM tasks WHERE job_id = ? AND state IN ('assigned', 'running')",
                             (job_id,))[0][0]
        most = max(most, active)
        assert active <= 4
    assert cluster.job(job_id)["state"] == "succeeded" and most >= 1


def test_a_cancel_starts_nothing_queued_on_the_agent(cluster):
    w1 = cluster.start_worker("w1", parallel=2)
    worker_id = cluster.wait_online("w1")
    job_id = cluster.submit({"command": ["sh", "-c", "sleep 0.05"], "array": "0-399"})
    held = wait_for(lambda: len(h := _ahead_held(cluster, job_id, worker_id)) >= 3 and h, 120,
                    "elements leased ahead")
    answer = cluster.request("POST", f"/v1/jobs/{job_id}/cancel")
    assert answer.status_code in (200, 202), answer.text
    after = cluster.sql("SELECT max(seq) FROM events")[0][0]
    assert cluster.wait_job(job_id, timeout=60)["state"] == "cancelled"
    started = cluster.sql("SELECT count(*) FROM events WHERE job_id = ? AND kind = 'task_started' AND seq > ?",
                          (job_id, after))[0][0]
    assert started == 0
    states = dict(cluster.sql("SELECT id, state FROM tasks WHERE job_id = ?", (job_id,)))
    assert all(states[i] in ("cancelled", "succeeded") for i in held)
    wait_for(lambda: not cluster.sql("SELECT 1 FROM tasks WHERE worker_id = ? AND state IN ('assigned', 'running')",
                                     (worker_id,)), 30, "the worker to hold nothing")
    assert w1.running
