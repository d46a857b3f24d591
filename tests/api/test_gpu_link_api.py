"""`gpu_link` and `same` over plain HTTP (issue 40, point 3; docs/workers.md, "Topology"): simulated workers
that register a topology or a rack label, the job's view, and bad input refused with the error shape, changing
nothing."""
from __future__ import annotations

import pytest

from apihelpers import bearer
from test_endpoints import assert_error, counts

NVLINK_BOX = [{"index": i, "nvlink_peers": [p for p in range(i - i % 4, i - i % 4 + 4) if p != i]} for i in range(8)]


def register(api, tokens, name, *, gpus=0, labels=None, topology=None) -> dict:
    body = {"name": name, "labels": labels or {}, "version": "t", "slots": 4,
            "resources": {"cpus": 8, "gpus": gpus, "memory_mb": 1000, "gpu_models": []}}
    if topology is not None:
        body["gpu_topology"] = topology
    r = api.simulate_post("/v1/workers/register", headers=bearer(tokens["join_token"]), json=body)
    assert r.status_code == 200, r.text
    return bearer(r.json["session_token"])


def submit(api, client_h, spec) -> dict:
    r = api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["train"], **spec})
    assert r.status_code == 201, r.text
    return r.json


def acquire(api, h) -> dict | None:
    """The worker's next task, started (acquire hands a task out again until it starts)."""
    r = api.simulate_post("/v1/worker/acquire", headers=h, json={})
    assert r.status_code == 200, r.text
    task = r.json["task"]
    if task is not None:
        started = api.simulate_post(f"/v1/worker/tasks/{task['task_id']}/start", headers=h, json={"pid": 1})
        assert started.status_code == 200, started.text
    return task


def test_a_job_that_requires_nvlink_over_http(api, tokens, client_h):
    pcie = register(api, tokens, "pcie", gpus=8, topology=[{"index": i} for i in range(8)])
    nv = register(api, tokens, "nv", gpus=8, topology=NVLINK_BOX)
    made = submit(api, client_h, {"gpus": 4, "gpu_link": "nvlink"})
    assert made["spec"]["gpu_link"] == "nvlink"
    assert acquire(api, pcie) is None
    task = acquire(api, nv)
    assert task["job_id"] == made["id"] and task["gpus"] == [0, 1, 2, 3]
    too_big = submit(api, client_h, {"gpus": 8, "gpu_link": "nvlink"})
    assert acquire(api, nv) is None
    view = api.simulate_get(f"/v1/jobs/{too_big['id']}", headers=client_h).json
    assert view["waiting_reason"].startswith("no online worker has 8 GPUs joined by NVLink"), view["waiting_reason"]


def test_a_gang_with_same_over_http(api, tokens, client_h):
    r1 = [register(api, tokens, f"a{i}", labels={"rack": "r1"}) for i in range(2)]
    r2 = [register(api, tokens, f"b{i}", labels={"rack": "r2"}) for i in range(3)]
    made = submit(api, client_h, {"nodes": 3, "same": ["rack"]})
    assert made["spec"]["same"] == ["rack"]
    assert all(acquire(api, h) is None for h in r1)
    ranks = sorted(acquire(api, h)["rank"] for h in r2)
    assert ranks == [0, 1, 2]


@pytest.mark.parametrize("bad, says", [
    ({"gpus": 2, "gpu_link": "pcie"}, "gpu_link"),
    ({"gpus": 1, "gpu_link": "nvlink"}, "gpu_link"),
    ({"nodes": 2, "same": [""]}, "same"),
    ({"nodes": 2, "same": ["rack=r1"]}, "same"),
    ({"same": ["rack"]}, "same"),
])
def test_bad_wiring_is_a_400_and_changes_nothing(api, deps, client_h, bad, says):
    before = counts(deps)
    r = api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["train"], **bad})
    body = assert_error(r, 400, "invalid_field")
    assert body["error"]["message"].startswith(says), body
    assert counts(deps) == before
