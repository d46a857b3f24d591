"""finish with `pid`: the task's start rides on its finish (one write transaction instead of two)."""
from __future__ import annotations

import pytest
from test_several_assignments import writes  # noqa: F401  (the fixture: write transactions counted)


def acquired(api, wh):
    r = api.simulate_post("/v1/worker/acquire", headers=wh, json={})
    assert r.status_code == 200, r.text
    return r.json["task"]


def test_finish_with_pid_starts_and_finishes_in_one_transaction(api, worker, client_h, writes):  # noqa: F811
    _, wh = worker()
    job_id = api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["true"]}).json["id"]
    task = acquired(api, wh)
    writes.clear()
    r = api.simulate_post(f"/v1/worker/tasks/{task['task_id']}/finish", headers=wh,
                          json={"exit_code": 0, "outcome": "succeeded", "pid": 4242})
    assert r.status_code == 200 and r.json == {"accepted": True}
    assert len(writes) == 1
    kinds = [e["kind"] for e in api.simulate_get(f"/v1/jobs/{job_id}/events", headers=client_h).json["events"]]
    assert kinds[kinds.index("task_started"):] == ["task_started", "task_finished", "job_finished"]
    job = api.simulate_get(f"/v1/jobs/{job_id}", headers=client_h).json
    assert job["state"] == "succeeded" and job["tasks"][0]["started_at"] is not None


@pytest.mark.parametrize("pid", [0, -1, "12", 1.5, True, 1 << 40])
def test_a_bad_pid_is_400_and_changes_nothing(api, worker, client_h, pid):
    _, wh = worker()
    job_id = api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["true"]}).json["id"]
    task = acquired(api, wh)
    r = api.simulate_post(f"/v1/worker/tasks/{task['task_id']}/finish", headers=wh,
                          json={"exit_code": 0, "outcome": "succeeded", "pid": pid})
    assert r.status_code == 400, r.text
    assert "pid" in r.json["error"]["message"]
    assert api.simulate_get(f"/v1/jobs/{job_id}", headers=client_h).json["tasks"][0]["state"] == "assigned"


def test_a_null_pid_is_a_finish_as_before(api, worker, client_h):
    _, wh = worker()
    job_id = api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["true"]}).json["id"]
    task = acquired(api, wh)
    r = api.simulate_post(f"/v1/worker/tasks/{task['task_id']}/finish", headers=wh,
                          json={"exit_code": 0, "outcome": "succeeded", "pid": None})
    assert r.status_code == 200 and r.json == {"accepted": True}
    job = api.simulate_get(f"/v1/jobs/{job_id}", headers=client_h).json
    assert job["state"] == "succeeded" and job["tasks"][0]["started_at"] is None
