"""Issue 25 item 3 (a, b): array elements leased ahead (`prefetch`) and several finishes in one request.

The claim and give-back rules (an element leased ahead holds none of the worker's room, counts against
its array's %N cap, and goes back to the queue, same attempt, when its worker leaves, is lost, is
cordoned or gives it back; a cancel ends it), and finish-many's fencing and validation.
"""
from __future__ import annotations

import pytest

from gpulayer.server.runtime.pace import MAX_AHEAD


def post(api, path, wh, body=None, status=200):
    r = api.simulate_post(path, headers=wh, json=body)
    assert r.status_code == status, r.text
    return r.json


@pytest.fixture
def array(api, client_h):
    def make(spec):
        r = api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["true"], **spec})
        assert r.status_code == 201, r.text
        return r.json["id"]
    return make


def tasks(deps, job_id):
    return [dict(r) for r in deps.store.read(lambda c: c.execute(
        "SELECT id, \"index\", state, attempt, worker_id, ahead FROM tasks WHERE job_id = ? ORDER BY id",
        (job_id,)).fetchall())]


def done(task, **extra):
    return {"task_id": task["task_id"], "attempt": task["attempt"], "exit_code": 0, "outcome": "succeeded",
            "pid": 4242, **extra}


def primed(api, wh, n=2):
    """Acquire `n` elements and finish the first with a run time: the job's pace is known, so the answer
    leases elements ahead; returns (the assignments started, the answer)."""
    got = post(api, "/v1/worker/acquire", wh, {"max_tasks": n, "prefetch": True})
    first = [got["task"], *got["more"]]
    answer = post(api, "/v1/worker/finish-many", wh, {"finishes": [done(first[0], run_s=0.01)], "next": True,
                                                      "max_tasks": 1, "prefetch": True})
    return first, answer


def test_old_requests_get_no_ahead(api, worker, array):
    _, wh = worker(slots=2)
    array({"array": "0-9"})
    got = post(api, "/v1/worker/acquire", wh, {"max_tasks": 2})
    assert set(got) == {"task", "more"}
    assert set(post(api, "/v1/worker/acquire", wh, {})) == {"task"}


def test_elements_leased_ahead_hold_no_room_and_finish_in_one_request(api, deps, worker, array):
    wid, wh = worker(slots=2)
    job = array({"array": "0-199"})
    assert post(api, "/v1/worker/acquire", wh, {"max_tasks": 1, "prefetch": True})["ahead"] == []  # no pace yet
    first, answer = primed(api, wh)
    assert answer["results"] == [{"task_id": first[0]["task_id"], "accepted": True}]
    assert answer["task"] == first[1] and answer["more"] == []  # held, not started: handed out again
    ahead = answer["ahead"]
    assert len(ahead) == min(MAX_AHEAD, 50)  # 2 slots * AHEAD_WINDOW_S (0.25 s) / 0.01 s a run
    rows = {t["id"]: t for t in tasks(deps, job)}
    assert all(rows[a["task_id"]]["state"] == "assigned" and rows[a["task_id"]]["ahead"] == 1 for a in ahead)
    load = deps.store.read(lambda c: c.execute("SELECT free_slots FROM worker_load WHERE worker_id = ?",
                                                (wid,)).fetchall())
    assert load[0]["free_slots"] == 1  # one assigned element; those ahead hold no room
    # the agent finishes several at once: each started by its pid, in one transaction
    batch = [done(first[1]), *[done(a) for a in ahead[:5]]]
    more = post(api, "/v1/worker/finish-many", wh, {"finishes": batch, "prefetch": True,
                                                    "held": [a["task_id"] for a in ahead[5:]]})
    assert [r["accepted"] for r in more["results"]] == [True] * 6
    assert more["task"] is None and more["dropped"] == []
    assert len(more["ahead"]) == 5  # topped up again; those it holds are not sent again
    rows = {t["id"]: t for t in tasks(deps, job)}
    assert all(rows[b["task_id"]]["state"] == "succeeded" and rows[b["task_id"]]["attempt"] == 1 for b in batch)


def test_finish_many_fences_each_element(api, deps, worker, array):
    _, wh = worker(slots=2)
    _, other = worker(name="w2", slots=1)
    job = array({"array": "0-3"})
    got = post(api, "/v1/worker/acquire", wh, {"max_tasks": 2})
    a, b = got["task"], got["more"][0]
    theirs = post(api, "/v1/worker/acquire", other, {})["task"]
    answer = post(api, "/v1/worker/finish-many", wh, {"finishes": [
        done(a), {**done(b), "attempt": 2}, done(theirs), {**done(a), "task_id": 999999}]})
    results = answer["results"]
    assert results[0] == {"task_id": a["task_id"], "accepted": True}
    assert [r["accepted"] for r in results[1:]] == [False, False, False]
    assert all(r["error"]["code"] == "task_not_assigned" for r in results[1:])
    states = {t["id"]: t["state"] for t in tasks(deps, job)}
    assert states[b["task_id"]] == "assigned" and states[theirs["task_id"]] == "assigned"
    # a finish sent again is answered, not applied twice
    again = post(api, "/v1/worker/finish-many", wh, {"finishes": [done(a)]})
    assert again["results"] == [{"task_id": a["task_id"], "accepted": False}]


@pytest.mark.parametrize("body", [
    {"finishes": "no"}, {"finishes": [{"task_id": 1}]}, {"finishes": [{"task_id": 1, "outcome": "succeeded"}]},
    {"finishes": [{"task_id": 1, "attempt": 1, "outcome": "meh"}]},
    {"finishes": [{"task_id": 1, "attempt": 1, "outcome": "succeeded", "run_s": -1}]},
    {"finishes": [{"task_id": 1, "attempt": 1, "outcome": "succeeded"}] * 2},
    {"finishes": [], "prefetch": "yes"}, {"finishes": [], "held": [1, 1]}, {"finishes": [], "release": ["x"]},
    {"finishes": [], "bogus": 1}, {"finishes": [{"task_id": i + 1, "attempt": 1, "outcome": "succeeded"}
                                                for i in range(1025)]},
])
def test_malformed_finish_many_is_400_and_changes_nothing(api, deps, worker, array, body):
    _, wh = worker(slots=1)
    job = array({"array": "0-1"})
    task = post(api, "/v1/worker/acquire", wh, {})["task"]
    body = {**body}
    r = api.simulate_post("/v1/worker/finish-many", headers=wh, json=body)
    assert r.status_code == 400, r.text
    assert r.json["error"]["code"] in ("invalid_field", "invalid_json")
    assert [t["state"] for t in tasks(deps, job)] == ["assigned", "queued"]
    assert task["task_id"] == tasks(deps, job)[0]["id"]


def test_ahead_goes_back_same_attempt_when_given_back_cordoned_or_deregistered(api, deps, worker, array, client_h):
    _, wh = worker(slots=2)
    job = array({"array": "0-99"})
    _, answer = primed(api, wh)
    ahead = [a["task_id"] for a in answer["ahead"]]
    back = post(api, "/v1/worker/finish-many", wh, {"release": ahead[:3], "held": ahead[3:]})
    assert back["dropped"] == []
    rows = {t["id"]: t for t in tasks(deps, job)}
    assert all(rows[i]["state"] == "queued" and rows[i]["attempt"] == 1 and rows[i]["ahead"] == 0 for i in ahead[:3])
    assert api.simulate_post("/v1/workers/w1/cordon", headers=client_h, json={"reason": "t"}).status_code == 200
    rows = {t["id"]: t for t in tasks(deps, job)}
    assert all(rows[i]["state"] == "queued" and rows[i]["attempt"] == 1 for i in ahead)
    told = post(api, "/v1/worker/finish-many", wh, {"held": ahead[3:6]})
    assert told["dropped"] == ahead[3:6]  # the agent learns not to start them


def test_ahead_goes_back_when_the_worker_deregisters_or_is_lost(api, deps, worker, array, clock):
    _, wh = worker(slots=2)
    job = array({"array": "0-99"})
    _, answer = primed(api, wh)
    ahead = [a["task_id"] for a in answer["ahead"]]
    post(api, "/v1/worker/deregister", wh, {})
    rows = {t["id"]: t for t in tasks(deps, job)}
    assert all(rows[i]["state"] == "queued" and rows[i]["attempt"] == 1 for i in ahead)
    _, wh2 = worker(name="w2", slots=2)
    _, answer = primed(api, wh2)
    ahead = [a["task_id"] for a in answer["ahead"]]
    assert ahead
    clock.advance(60)
    deps.scheduler.expire()
    rows = {t["id"]: t for t in tasks(deps, job)}
    assert all(rows[i]["state"] == "queued" and rows[i]["attempt"] == 1 for i in ahead)  # no attempt spent
    lost = [t for t in rows.values() if t["state"] == "lost"]
    assert lost and all(t["ahead"] == 0 for t in lost)  # only what it had started is lost


def test_cancel_ends_elements_leased_ahead(api, deps, worker, array, client_h):
    _, wh = worker(slots=2)
    job = array({"array": "0-99"})
    _, answer = primed(api, wh)
    ahead = [a["task_id"] for a in answer["ahead"]]
    assert api.simulate_post(f"/v1/jobs/{job}/cancel", headers=client_h).status_code in (200, 202)
    told = post(api, "/v1/worker/finish-many", wh, {"finishes": [done(answer["ahead"][0])], "held": ahead[1:],
                                                    "prefetch": True})
    assert told["results"][0]["accepted"] is False  # its start rode on the finish: refused, never started
    assert told["dropped"] == ahead[1:] and told["ahead"] == []
    rows = {t["id"]: t for t in tasks(deps, job)}
    assert all(rows[i]["state"] == "cancelled" for i in ahead)
    events = deps.store.read(lambda c: c.execute(
        "SELECT count(*) AS n FROM events WHERE kind = 'task_started' AND task_id IN (%s)" % ",".join(map(str, ahead))
    ).fetchall()[0]["n"])
    assert events == 0


def test_cap_holds_with_elements_leased_ahead(api, deps, worker, array):
    _, w1 = worker(slots=4)
    _, w2 = worker(name="w2", slots=4)
    job = array({"array": "0-99%4"})
    for wh in (w1, w2):
        got = post(api, "/v1/worker/acquire", wh, {"max_tasks": 4, "prefetch": True})
        first = [t for t in [got["task"], *got["more"]] if t]
        if first:
            answer = post(api, "/v1/worker/finish-many", wh, {"finishes": [done(first[0], run_s=0.001)],
                                                              "next": True, "max_tasks": 4, "prefetch": True})
            assert len([t for t in [answer["task"], *answer["more"]] if t]) + len(answer["ahead"]) <= 4
        active = [t for t in tasks(deps, job) if t["state"] in ("assigned", "running")]
        assert len(active) <= 4
