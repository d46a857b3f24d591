"""Issue 27 through the API (falcon.testing, a real state file, a clock moved by hand): hold, release, --begin,
update and requeue; the assignment's signal and grace; a finish's `signals` as task_signalled events; and
every refusal a 4xx that changes nothing."""

from __future__ import annotations


def submit(api, h, **spec) -> int:
    r = api.simulate_post("/v1/jobs", headers=h, json={"command": ["true"], **spec})
    assert r.status_code == 201, r.text
    return r.json["id"]


def job(api, h, job_id: int) -> dict:
    return api.simulate_get(f"/v1/jobs/{job_id}", headers=h).json


def acquire(api, wh) -> dict | None:
    return api.simulate_post("/v1/worker/acquire", headers=wh, json={"wait_s": 0}).json["task"]


def kinds(api, h, job_id: int) -> list[str]:
    return [e["kind"] for e in api.simulate_get(f"/v1/jobs/{job_id}/events", headers=h).json["events"]]


def test_a_held_job_waits_out_of_the_queue_until_released(api, client_h, worker):
    _, wh = worker()
    job_id = submit(api, client_h, hold=True)
    found = job(api, client_h, job_id)
    assert found["state"] == "waiting" and found["waiting_reason"].startswith("held"), found
    assert acquire(api, wh) is None
    assert api.simulate_post(f"/v1/jobs/{job_id}/release", headers=client_h).status_code == 200
    assert job(api, client_h, job_id)["state"] == "queued"
    assert acquire(api, wh)["job_id"] == job_id


def test_hold_a_queued_job_then_release_it(api, client_h, worker):
    _, wh = worker()
    job_id = submit(api, client_h)
    r = api.simulate_post(f"/v1/jobs/{job_id}/hold", headers=client_h)
    assert r.status_code == 200 and r.json["state"] == "waiting", r.text
    assert acquire(api, wh) is None
    api.simulate_post(f"/v1/jobs/{job_id}/release", headers=client_h)
    assert acquire(api, wh)["job_id"] == job_id
    assert kinds(api, client_h, job_id)[:3] == ["job_submitted", "job_held", "job_released_hold"]


def test_a_held_array_keeps_its_running_elements_and_holds_the_rest(api, client_h, worker):
    _, wh = worker(slots=1)
    job_id = submit(api, client_h, array="0-3")
    first = acquire(api, wh)
    api.simulate_post(f"/v1/worker/tasks/{first['task_id']}/start", headers=wh, json={"pid": 10})
    api.simulate_post(f"/v1/jobs/{job_id}/hold", headers=client_h)
    api.simulate_post(f"/v1/worker/tasks/{first['task_id']}/finish", headers=wh, json={"exit_code": 0, "outcome": "succeeded"})
    assert acquire(api, wh) is None  # the next element is held, not released by the one that ended
    assert job(api, client_h, job_id)["waiting_reason"].startswith("held")
    api.simulate_post(f"/v1/jobs/{job_id}/release", headers=client_h)
    assert acquire(api, wh)["array_index"] == 1


def test_begin_later_waits_until_its_time(api, client_h, worker, deps, clock):
    _, wh = worker()
    job_id = submit(api, client_h, begin_at=clock.now + 3600)
    found = job(api, client_h, job_id)
    assert found["state"] == "waiting" and found["waiting_reason"].startswith("begin_time"), found
    assert deps.scheduler.begin_due() == 0 and acquire(api, wh) is None
    clock.advance(3601)
    assert deps.scheduler.begin_due() == 1
    assert acquire(api, wh)["job_id"] == job_id
    assert deps.scheduler.begin_due() == 0  # read once


def test_held_and_begin_later_waits_for_both(api, client_h, worker, deps, clock):
    _, wh = worker()
    job_id = submit(api, client_h, begin_at=clock.now + 10, hold=True)
    clock.advance(11)
    deps.scheduler.begin_due()
    assert job(api, client_h, job_id)["state"] == "waiting"
    api.simulate_post(f"/v1/jobs/{job_id}/release", headers=client_h)
    assert acquire(api, wh)["job_id"] == job_id


def test_update_changes_name_priority_and_time(api, client_h, worker):
    _, wh = worker()
    job_id = submit(api, client_h, name="a")
    r = api.simulate_patch(f"/v1/jobs/{job_id}", headers=client_h, json={"name": "b", "priority": "high", "timeout_seconds": "1:00:00"})
    assert r.status_code == 200, r.text
    assert r.json["name"] == "b" and r.json["spec"]["priority"] == 10 and r.json["spec"]["timeout_seconds"] == 3600
    assert acquire(api, wh)["timeout_seconds"] == 3600


def test_refusals_are_4xx_and_change_nothing(api, client_h, worker):
    job_id = submit(api, client_h, name="a")
    before = job(api, client_h, job_id)
    for body in ({}, {"colour": 1}, {"priority": "nope"}, {"timeout_seconds": "25:99"}, {"name": 5}, {"priority": 10**9}):
        r = api.simulate_patch(f"/v1/jobs/{job_id}", headers=client_h, json=body)
        assert r.status_code == 400, (body, r.text)
    for path, body in (
        ("hold", {"x": 1}),
        ("release", {"x": 1}),
        ("requeue", {"index": -1}),
        ("requeue", {"hold": "yes"}),
        ("requeue", {"index": 3}),
    ):
        r = api.simulate_post(f"/v1/jobs/{job_id}/{path}", headers=client_h, json=body)
        assert r.status_code == 400, (path, body, r.text)
    r = api.simulate_post(f"/v1/jobs/{job_id}/requeue", headers=client_h)
    assert r.status_code == 409 and r.json["error"]["code"] == "job_not_started", r.text
    assert api.simulate_post("/v1/jobs/999/hold", headers=client_h).status_code == 404
    for spec in ({"signal": "FOO@x"}, {"signal": "USR1@-5"}, {"signal": "KILL"}, {"grace_seconds": -1}, {"grace_seconds": 700}):
        r = api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["true"], **spec})
        assert r.status_code == 400, (spec, r.text)
    after = job(api, client_h, job_id)
    assert {k: after[k] for k in ("name", "state", "attempt", "spec")} == {k: before[k] for k in ("name", "state", "attempt", "spec")}


def test_the_assignment_carries_the_signal_and_the_grace(api, client_h, worker, deps):
    _, wh = worker(slots=3)
    submit(api, client_h, signal="b:sigusr1@90")
    submit(api, client_h, grace_seconds=7)
    submit(api, client_h)
    got = []
    for _ in range(3):
        got.append(acquire(api, wh))
        api.simulate_post(f"/v1/worker/tasks/{got[-1]['task_id']}/start", headers=wh, json={"pid": 10})
    assert [(a["signal"], a["grace_seconds"]) for a in got] == [("B:USR1@90", 30), (None, 7), (None, None)]


def test_requeue_a_running_job_keeps_its_room_until_its_finish(api, client_h, worker):
    _, wh = worker(slots=1)
    job_id = submit(api, client_h, retry={"max_attempts": 1})
    task = acquire(api, wh)
    api.simulate_post(f"/v1/worker/tasks/{task['task_id']}/start", headers=wh, json={"pid": 10})
    r = api.simulate_post(f"/v1/jobs/{job_id}/requeue", headers=client_h)
    assert r.status_code == 200, r.text
    beat = api.simulate_post(
        "/v1/worker/heartbeat", headers=wh, json={"tasks": [{"task_id": task["task_id"], "state": "running", "endpoint": None, "restarts": 0}]}
    ).json
    assert beat["cancel_task_ids"] == [task["task_id"]]
    assert acquire(api, wh) is None  # its room is still its own
    r = api.simulate_post(
        f"/v1/worker/tasks/{task['task_id']}/finish",
        headers=wh,
        json={"exit_code": 143, "outcome": "cancelled", "signals": [{"signal": "SIGTERM", "why": "cancelled", "at": 1.0}]},
    )
    assert r.status_code == 200 and r.json["accepted"], r.text
    found = job(api, client_h, job_id)
    assert found["attempt"] == 2 and found["state"] == "queued", found
    again = acquire(api, wh)
    assert again["attempt"] == 2
    events = api.simulate_get(f"/v1/jobs/{job_id}/events", headers=client_h).json["events"]
    sent = [e["data"] for e in events if e["kind"] == "task_signalled"]
    assert [(s["signal"], s["why"]) for s in sent] == [("SIGTERM", "requeued")]
    # the requeue was not counted: a failure now ends the job (max_attempts 1), it is not retried
    api.simulate_post(f"/v1/worker/tasks/{again['task_id']}/finish", headers=wh, json={"exit_code": 1, "outcome": "failed", "pid": 11})
    assert job(api, client_h, job_id)["state"] == "failed"


def test_requeue_an_ended_job_and_an_arrays_element(api, client_h, worker):
    _, wh = worker(slots=4)
    job_id = submit(api, client_h)
    task = acquire(api, wh)
    api.simulate_post(f"/v1/worker/tasks/{task['task_id']}/finish", headers=wh, json={"exit_code": 0, "outcome": "succeeded", "pid": 5})
    assert job(api, client_h, job_id)["state"] == "succeeded"
    r = api.simulate_post(f"/v1/jobs/{job_id}/requeue", headers=client_h)
    assert r.status_code == 200 and r.json["state"] == "queued" and r.json["attempt"] == 2, r.text
    second = acquire(api, wh)
    assert second["attempt"] == 2
    api.simulate_post(f"/v1/worker/tasks/{second['task_id']}/finish", headers=wh, json={"exit_code": 0, "outcome": "succeeded", "pid": 6})
    array = submit(api, client_h, array="0-2")
    for _ in range(3):
        t = acquire(api, wh)
        r = api.simulate_post(f"/v1/worker/tasks/{t['task_id']}/finish", headers=wh, json={"exit_code": 0, "outcome": "succeeded", "pid": 5})
        assert r.json["accepted"], (t, r.text)
    assert job(api, client_h, array)["state"] == "succeeded", job(api, client_h, array)
    r = api.simulate_post(f"/v1/jobs/{array}/requeue", headers=client_h, json={"index": 1})
    assert r.status_code == 200 and r.json["state"] == "queued", r.text
    again = acquire(api, wh)
    assert again["array_index"] == 1 and again["attempt"] == 2
    api.simulate_post(f"/v1/worker/tasks/{again['task_id']}/finish", headers=wh, json={"exit_code": 0, "outcome": "succeeded", "pid": 5})
    assert job(api, client_h, array)["state"] == "succeeded"


def test_requeue_waits_for_a_cancelled_jobs_task_still_on_its_worker(api, client_h, worker):
    """A cancel ends the job at once and asks its running task to stop; until the worker answers, a requeue
    is 409 `job_stopping` and changes nothing, so two attempts never run at once."""
    _, wh = worker()
    job_id = submit(api, client_h)
    task = acquire(api, wh)
    api.simulate_post(f"/v1/worker/tasks/{task['task_id']}/start", headers=wh, json={"pid": 10})
    api.simulate_post(f"/v1/jobs/{job_id}/cancel", headers=client_h)
    assert job(api, client_h, job_id)["state"] == "cancelled"
    before = job(api, client_h, job_id)
    r = api.simulate_post(f"/v1/jobs/{job_id}/requeue", headers=client_h, json={"hold": True})
    assert r.status_code == 409 and r.json["error"]["code"] == "job_stopping", r.text
    assert job(api, client_h, job_id) == before
    api.simulate_post(f"/v1/worker/tasks/{task['task_id']}/finish", headers=wh, json={"exit_code": 143, "outcome": "failed"})
    r = api.simulate_post(f"/v1/jobs/{job_id}/requeue", headers=client_h, json={"hold": True})
    assert r.status_code == 200, r.text
    found = job(api, client_h, job_id)
    assert found["attempt"] == 2 and found["state"] == "waiting" and found["waiting_reason"].startswith("held"), found


def test_a_time_limit_updated_while_running_is_told_in_the_heartbeat(api, client_h, worker):
    _, wh = worker()
    job_id = submit(api, client_h, timeout_seconds=600)
    task = acquire(api, wh)
    assert task["timeout_seconds"] == 600
    api.simulate_post(f"/v1/worker/tasks/{task['task_id']}/start", headers=wh, json={"pid": 10})

    def beat(**echo) -> dict:
        r = api.simulate_post("/v1/worker/heartbeat", headers=wh, json={"tasks": [
            {"task_id": task["task_id"], "state": "running", "job_id": job_id, "attempt": 1, **echo}]})
        assert r.status_code == 200, r.text
        return r.json

    assert "time_limits" not in beat(timeout_seconds=600)  # the limit it enforces is the job's
    assert api.simulate_patch(f"/v1/jobs/{job_id}", headers=client_h, json={"timeout_seconds": 30}).status_code == 200
    expected = [{"task_id": task["task_id"], "timeout_seconds": 30}]
    assert beat(timeout_seconds=600)["time_limits"] == expected  # told until the agent echoes the new one
    assert beat(timeout_seconds=600, endpoint="127.0.0.1:9")["time_limits"] == expected  # the write path too
    assert "time_limits" not in beat(timeout_seconds=30)
    assert "time_limits" not in beat()  # an older agent, which echoes no limit, is told none
    api.simulate_patch(f"/v1/jobs/{job_id}", headers=client_h, json={"timeout_seconds": None})
    assert beat(timeout_seconds=30)["time_limits"] == [{"task_id": task["task_id"], "timeout_seconds": None}]
    assert "time_limits" not in beat(timeout_seconds=None)
    bad = api.simulate_post("/v1/worker/heartbeat", headers=wh, json={"tasks": [
        {"task_id": task["task_id"], "state": "running", "timeout_seconds": "soon"}]})
    assert bad.status_code == 400 and "timeout_seconds" in bad.json["error"]["message"], bad.text


def test_a_requeue_neither_consumes_nor_inflates_the_retry_budget(api, client_h, worker, deps):
    """Slurm's requeue restarts a job without touching a retry count: the requeued element's new attempt is not
    one of its retries, and the other elements gain none (max_attempts stays as submitted)."""
    _, wh = worker(slots=4)
    array = submit(api, client_h, array="0-1", retry={"max_attempts": 2, "retry_on": ["failed"]})
    first = {}
    for _ in range(2):  # an acquire answers the same task until its start
        t = acquire(api, wh)
        api.simulate_post(f"/v1/worker/tasks/{t['task_id']}/start", headers=wh, json={"pid": 10})
        first[t["array_index"]] = t
    assert api.simulate_post(f"/v1/jobs/{array}/requeue", headers=client_h, json={"index": 0}).status_code == 200
    api.simulate_post(f"/v1/worker/tasks/{first[0]['task_id']}/finish", headers=wh, json={"exit_code": 143, "outcome": "cancelled"})

    def fails(task) -> None:
        api.simulate_post(f"/v1/worker/tasks/{task['task_id']}/start", headers=wh, json={"pid": 11})
        r = api.simulate_post(f"/v1/worker/tasks/{task['task_id']}/finish", headers=wh, json={"exit_code": 1, "outcome": "failed"})
        assert r.status_code == 200 and r.json["accepted"], r.text

    # element 0: attempt 1 requeued (not counted), attempts 2 and 3 fail: its two runs of --retry's budget
    for attempt in (2, 3):
        task = acquire(api, wh)
        assert (task["array_index"], task["attempt"]) == (0, attempt), task
        fails(task)
    # element 1 was not requeued: attempts 1 and 2, no spare one from element 0's requeue
    api.simulate_post(f"/v1/worker/tasks/{first[1]['task_id']}/finish", headers=wh, json={"exit_code": 1, "outcome": "failed"})
    task = acquire(api, wh)
    assert (task["array_index"], task["attempt"]) == (1, 2), task
    fails(task)
    assert acquire(api, wh) is None
    assert job(api, client_h, array)["state"] == "failed"
    assert deps.store.read(lambda conn: conn.execute("SELECT max_attempts FROM jobs WHERE id = ?", (array,)).fetchall()) == [{"max_attempts": 2}]
    # a whole job requeued twice keeps its max_attempts and its one retry
    single = submit(api, client_h, retry={"max_attempts": 2, "retry_on": ["failed"]})
    for attempt in (1, 2):
        t = acquire(api, wh)
        api.simulate_post(f"/v1/worker/tasks/{t['task_id']}/finish", headers=wh, json={"exit_code": 0, "outcome": "succeeded", "pid": 5})
        assert api.simulate_post(f"/v1/jobs/{single}/requeue", headers=client_h).status_code == 200
    for attempt in (3, 4):
        t = acquire(api, wh)
        assert t["attempt"] == attempt, t
        fails(t)
    assert acquire(api, wh) is None and job(api, client_h, single)["state"] == "failed"
    kinds = [e["kind"] for e in api.simulate_get(f"/v1/jobs/{single}/events", headers=client_h).json["events"]]
    assert kinds.count("attempt_requeued") == 2 and kinds.count("job_retried") == 1, kinds
