"""acquire and finish with `next` hand out several assignments (`max_tasks`), in one transaction.

Old-style requests (no `max_tasks`) get exactly the answers of protocol v1.
"""
from __future__ import annotations

import pytest

from gpulayer.server.scheduler.placement import MAX_TASKS_PER_ACQUIRE


@pytest.fixture
def submit(api, client_h):
    def make(n):
        return [api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["true"]}).json["id"]
                for _ in range(n)]
    return make


@pytest.fixture
def writes(deps, monkeypatch):
    """Counts the write transactions the store runs (each Store.write call is one)."""
    calls = []
    inner = deps.store.write

    def counted(fn, *args, **kwargs):
        calls.append(getattr(fn, "__name__", repr(fn)))
        return inner(fn, *args, **kwargs)
    monkeypatch.setattr(deps.store, "write", counted)
    return calls


def post(api, path, wh, body=None):
    r = api.simulate_post(path, headers=wh, json=body)
    assert r.status_code == 200, r.text
    return r.json


def started(api, wh, task):
    return post(api, f"/v1/worker/tasks/{task['task_id']}/start", wh, {"pid": 1})


def test_old_style_requests_answer_as_before(api, worker, submit):
    _, wh = worker(slots=4)
    first, second, third = submit(3)
    a = post(api, "/v1/worker/acquire", wh, {})
    assert set(a) == {"task"} and a["task"]["job_id"] == first
    assert post(api, "/v1/worker/acquire", wh, {"wait_s": 0}) == a  # idempotent until start, one at a time
    assert post(api, "/v1/worker/acquire", wh) == a  # an empty body too
    started(api, wh, a["task"])
    b = post(api, "/v1/worker/acquire", wh, {})
    assert set(b) == {"task"} and b["task"]["job_id"] == second
    started(api, wh, b["task"])
    done = post(api, f"/v1/worker/tasks/{b['task']['task_id']}/finish", wh, {"exit_code": 0, "outcome": "succeeded"})
    assert done == {"accepted": True}
    nxt = post(api, f"/v1/worker/tasks/{a['task']['task_id']}/finish", wh,
               {"exit_code": 0, "outcome": "succeeded", "next": True})
    assert set(nxt) == {"accepted", "task"} and nxt["task"]["job_id"] == third
    assert post(api, "/v1/worker/acquire", wh, {}) == {"task": nxt["task"]}
    started(api, wh, nxt["task"])
    assert post(api, "/v1/worker/acquire", wh, {}) == {"task": None}


def test_several_in_one_transaction_then_handed_out_again_until_start(api, worker, submit, writes):
    _, wh = worker(slots=3)
    jobs = submit(5)
    writes.clear()
    got = post(api, "/v1/worker/acquire", wh, {"max_tasks": 8})
    assert writes == ["_acquire_once"]  # one transaction for all of them
    assigned = [got["task"], *got["more"]]
    assert [t["job_id"] for t in assigned] == jobs[:3]  # capped by the worker's free slots
    assert post(api, "/v1/worker/acquire", wh, {"max_tasks": 8}) == got  # the same ones, same order
    assert post(api, "/v1/worker/acquire", wh, {}) == {"task": got["task"]}  # old style: the oldest held one
    assert post(api, "/v1/worker/acquire", wh, {"max_tasks": 1}) == {"task": got["task"], "more": []}
    started(api, wh, assigned[0])
    started(api, wh, assigned[1])
    again = post(api, "/v1/worker/acquire", wh, {"max_tasks": 8})
    assert again == {"task": assigned[2], "more": []}  # started ones are not handed out again; no room
    writes.clear()
    done = post(api, f"/v1/worker/tasks/{assigned[0]['task_id']}/finish", wh,
                {"exit_code": 0, "outcome": "succeeded", "next": True, "max_tasks": 8})
    assert writes == ["_finish_next"]  # the finish and the next claim in one transaction (issue 41)
    assert done["accepted"] is True and done["task"] == assigned[2]  # held first, then the freed slot's
    assert [t["job_id"] for t in done["more"]] == [jobs[3]]


def test_max_tasks_is_capped_by_the_server(api, worker, submit):
    _, wh = worker(slots=64)
    submit(MAX_TASKS_PER_ACQUIRE + 4)
    got = post(api, "/v1/worker/acquire", wh, {"max_tasks": 1024})
    assert len(got["more"]) == MAX_TASKS_PER_ACQUIRE - 1
    assert len({t["task_id"] for t in [got["task"], *got["more"]]}) == MAX_TASKS_PER_ACQUIRE


def test_max_tasks_with_nothing_queued(api, worker):
    _, wh = worker(slots=2)
    assert post(api, "/v1/worker/acquire", wh, {"max_tasks": 2}) == {"task": None, "more": []}


@pytest.mark.parametrize("bad", [0, -1, 1025, "2", True, 1.5])
def test_bad_max_tasks_is_refused(api, worker, submit, bad):
    _, wh = worker(slots=2)
    submit(1)
    r = api.simulate_post("/v1/worker/acquire", headers=wh, json={"max_tasks": bad})
    assert r.status_code == 400 and r.json["error"]["code"] == "invalid_field" and "max_tasks" in r.text
    assert post(api, "/v1/worker/acquire", wh, {})["task"] is not None  # nothing was assigned by the refusal


def test_openapi_describes_max_tasks_and_more(api, client_h):
    doc = api.simulate_get("/v1/openapi.json", headers=client_h).json
    for path in ("/v1/worker/acquire", "/v1/worker/tasks/{task_id}/finish"):
        op = doc["paths"][path]["post"]
        assert "max_tasks" in op["requestBody"]["content"]["application/json"]["schema"]["properties"]
        answer = op["responses"]["200"]["content"]["application/json"]["schema"]
        assert {"task", "more"} <= set(answer["properties"])


def test_several_get_distinct_gpus(api, client_h, worker):
    _, wh = worker(slots=4, gpus=4)
    for _ in range(3):
        api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["true"], "gpus": 2})
    got = post(api, "/v1/worker/acquire", wh, {"max_tasks": 4})
    assert [t["gpus"] for t in [got["task"], *got["more"]]] == [[0, 1], [2, 3]]  # the third does not fit
