"""Start-time estimates on the wire (issue 38 points 2, 3): the Job's `estimated_start_at` and
`estimate_reason` from the latest forecast, and `POST /v1/jobs/estimate`, the what-if that submits nothing."""
from __future__ import annotations

import pytest


def _submit(api, h, **spec):
    r = api.simulate_post("/v1/jobs", headers=h, json={"command": ["true"], **spec})
    assert r.status_code == 201, r.text
    return r.json


def _running_8(api, client_h, worker, clock):
    wid, wh = worker("gpu-01", gpus=8, slots=8)
    _submit(api, client_h, gpus=8, timeout_seconds=600)
    task = api.simulate_post("/v1/worker/acquire", headers=wh, json={"worker_id": wid}).json["task"]
    api.simulate_post(f"/v1/worker/tasks/{task['task_id']}/start", headers=wh, json={"pid": 1})
    return clock.now


def test_a_waiting_job_carries_its_estimate(api, deps, client_h, worker, clock):
    t0 = _running_8(api, client_h, worker, clock)
    waiting = _submit(api, client_h, gpus=8, timeout_seconds=60)
    assert waiting["estimated_start_at"] is None and waiting["estimate_reason"].startswith("not estimated yet")
    deps.scheduler.estimates.refresh()
    got = api.simulate_get(f"/v1/jobs/{waiting['id']}", headers=client_h).json
    assert got["estimated_start_at"] == t0 + 600 and got["estimate_reason"] is None
    listed = {j["id"]: j for j in api.simulate_get("/v1/jobs", headers=client_h).json["jobs"]}
    assert listed[waiting["id"]]["estimated_start_at"] == t0 + 600
    running = [j for j in listed.values() if j["state"] == "running"][0]
    assert running["estimated_start_at"] is None and running["estimate_reason"] is None


def test_what_if_answers_without_submitting(api, client_h, worker, clock):
    t0 = _running_8(api, client_h, worker, clock)
    before = api.simulate_get("/v1/jobs", headers=client_h).json["jobs"]
    eight = api.simulate_post("/v1/jobs/estimate", headers=client_h, json={"command": ["x"], "gpus": 8})
    assert eight.status_code == 200, eight.text
    assert eight.json["estimated_start_at"] == t0 + 600 and eight.json["workers"] == ["gpu-01"]
    assert eight.json["runnable"] is True
    never = api.simulate_post("/v1/jobs/estimate", headers=client_h, json={"command": ["x"], "gpus": 16}).json
    assert never["estimated_start_at"] is None and never["runnable"] is False
    assert never["estimate_reason"].startswith("no worker could ever run it")
    assert api.simulate_get("/v1/jobs", headers=client_h).json["jobs"] == before


@pytest.mark.parametrize("body,status", [({"command": []}, 400), ({"command": ["x"], "gpus": -1}, 400),
                                         ({"command": ["x"], "bogus": 1}, 400),
                                         ({"command": ["x"], "project": "nope"}, 400)])
def test_what_if_refuses_what_submit_refuses(api, client_h, body, status):
    r = api.simulate_post("/v1/jobs/estimate", headers=client_h, json=body)
    assert r.status_code == status and "error" in r.json
    submitted = api.simulate_post("/v1/jobs", headers=client_h, json=body)
    assert submitted.status_code == status and submitted.json["error"]["code"] == r.json["error"]["code"]
    assert api.simulate_get("/v1/jobs", headers=client_h).json["jobs"] == []
