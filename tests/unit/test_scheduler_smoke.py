from helpers import add_worker, job, state_of


def test_submit_acquire_start_finish(sched):
    w = add_worker(sched)
    j = sched.submit(job(["echo", "hi"]))
    a = sched.acquire(w)
    assert a["job_id"] == j and a["command"] == ["echo", "hi"] and a["attempt"] == 1
    assert sched.acquire(w)["task_id"] == a["task_id"]  # idempotent until start
    sched.start(w, a["task_id"], 123)
    assert sched.acquire(w) is None  # one slot
    assert sched.logs(w, a["task_id"], [{"n": 0, "stream": "stdout", "text": "hi", "at": 1.0}]) == 1
    assert sched.logs(w, a["task_id"], [{"n": 0, "stream": "stdout", "text": "hi", "at": 1.0}]) == 0
    assert sched.finish(w, a["task_id"], exit_code=0, outcome="succeeded", outputs={}, reason=None)
    assert state_of(sched, j)["state"] == "succeeded"


def test_lease_expiry_and_retry(sched, clock):
    w = add_worker(sched)
    j = sched.submit(job(retry={"max_attempts": 2}))
    a = sched.acquire(w)
    sched.start(w, a["task_id"], None)
    clock.advance(10)
    assert sched.expire()["tasks_lost"] == 1
    info = state_of(sched, j)
    assert info["state"] == "queued" and info["attempt"] == 2
    hb = sched.heartbeat(w, [{"task_id": a["task_id"], "state": "running", "endpoint": None, "restarts": 0}])
    assert hb["cancel_task_ids"] == [a["task_id"]]
    assert not sched.finish(w, a["task_id"], exit_code=0, outcome="succeeded", outputs={}, reason=None)
    b = sched.acquire(w)
    assert b["attempt"] == 2
