"""A queued job says why it waits, down to "the workers that fit are busy"."""
from __future__ import annotations

from helpers import add_worker, job, state_of


def test_a_job_waiting_for_a_busy_worker_says_so(sched):
    w = add_worker(sched, gpus=1)
    first = sched.submit(job(gpus=1))
    sched.start(w, sched.acquire(w)["task_id"], 1)
    second = sched.submit(job(gpus=1))
    assert state_of(sched, first)["waiting_reason"] is None
    assert state_of(sched, second)["waiting_reason"].startswith("waiting for capacity")
    assert state_of(sched, second)["waiting_reason"] == (  # what it asks for alone: no "0 CPUs, 0 MB"
        "waiting for capacity: the online workers that fit are busy (it needs one worker with a free slot and 1 GPU "
        "free at once)")


def test_a_running_service_with_a_replica_not_placed_says_why(sched):
    w = add_worker(sched, "only")
    service = sched.submit(job(["sleep", "60"], service={"replicas": 2}))
    sched.start(w, sched.acquire(w)["task_id"], 1)
    info = state_of(sched, service)
    assert info["state"] == "running"
    assert info["waiting_reason"] == "needs 2 workers, one per replica, but only 1 online fit it"  # not "busy"
    second = add_worker(sched, "second")
    assert state_of(sched, service)["waiting_reason"] is None
    sched.start(second, sched.acquire(second)["task_id"], 2)
    assert state_of(sched, service)["waiting_reason"] is None


def test_a_service_whose_replicas_outnumber_the_workers_says_so_before_it_runs(sched):
    service = sched.submit(job(["sleep", "60"], service={"replicas": 3}))
    for pid, name in enumerate(["a", "b"], 1):
        w = add_worker(sched, name, slots=4)
        sched.start(w, sched.acquire(w)["task_id"], pid)
    assert state_of(sched, service)["state"] == "running"
    assert state_of(sched, service)["waiting_reason"] == "needs 3 workers, one per replica, but only 2 online fit it"


def test_a_reason_names_only_what_the_job_asked_for(sched):
    add_worker(sched, "small", gpus=0)
    assert state_of(sched, sched.submit(job(gpus=1)))["waiting_reason"] == (
        "no online worker has the accelerator and size it asks for (1 GPU)")
    assert state_of(sched, sched.submit(job(cpus=64, memory_mb=512, labels={})))["waiting_reason"] == (
        "no online worker has the accelerator and size it asks for (64 CPUs and 512 MB)")
    add_worker(sched, "pooled", gpus=0, labels={"pool": "a"})
    assert state_of(sched, sched.submit(job(gpus=2, cpus=1, labels={"pool": "a"})))["waiting_reason"] == (
        "no online worker with its labels has the accelerator and size it asks for (2 GPUs and 1 CPU)")


def test_a_running_batch_job_waits_for_nothing(sched):
    w = add_worker(sched)
    running = sched.submit(job(["sleep", "60"]))
    sched.start(w, sched.acquire(w)["task_id"], 1)
    assert state_of(sched, running)["waiting_reason"] is None


def test_a_restarting_replica_shows_its_last_restart_line(sched):
    w = add_worker(sched)
    service = sched.submit(job(["false"], service={"replicas": 1}))
    task_id = sched.acquire(w)["task_id"]
    sched.start(w, task_id, 1)
    assert state_of(sched, service)["tasks"][0]["restart_message"] is None
    sched.logs(w, task_id, [{"n": 0, "stream": "system", "text": "restart 1: exited with code 1; next run in 1 s", "at": 1.0},
                            {"n": 1, "stream": "stdout", "text": "restart 9: not from the agent", "at": 2.0},
                            {"n": 2, "stream": "system", "text": "restart 2: exited with code 1; next run in 2 s", "at": 3.0}])
    sched.heartbeat(w, [{"task_id": task_id, "state": "restarting", "endpoint": None, "restarts": 2}])
    task = state_of(sched, service)["tasks"][0]
    assert task["restarts"] == 2
    assert task["restart_message"] == "restart 2: exited with code 1; next run in 2 s"



def test_a_running_array_with_an_element_not_placed_says_why(sched):
    w = add_worker(sched, "only", slots=1)
    array = sched.submit(job(["sleep", "60"], array="0-2"))
    first = sched.acquire(w)
    sched.start(w, first["task_id"], 1)
    info = state_of(sched, array)
    assert info["state"] == "running"
    assert info["waiting_reason"].startswith("waiting for capacity")  # elements 1 and 2: the one slot is taken


def test_a_running_array_at_its_cap_waits_for_nothing_to_be_told(sched):
    w = add_worker(sched, "only", slots=2)
    array = sched.submit(job(["sleep", "60"], array="0-99%2", retry={"max_attempts": 2, "retry_on": ["failed"]}))
    taken = sched.acquire_many(w, 0, 2)
    for a in taken:
        sched.start(w, a["task_id"], 1)
    assert state_of(sched, array)["waiting_reason"] is None  # the held ones wait for the cap, by design
    # Element 0 fails: its retry (a new task, after every held one) is released, and a job of higher
    # priority takes the slot it freed
    sched.finish(w, taken[0]["task_id"], exit_code=1, outcome="failed", outputs={}, reason=None)
    other = sched.submit(job(["sleep", "60"], priority=5))
    sched.start(w, sched.acquire(w)["task_id"], 1)
    assert state_of(sched, other)["state"] == "running"
    info = state_of(sched, array)
    assert info["state"] == "running" and info["waiting_reason"].startswith("waiting for capacity")
