"""Cordon, drain and per-GPU health through the scheduler (real state file, pinned clock)."""
from __future__ import annotations

import pytest

from gpulayer.server.errors import Conflict, NotFound, TaskNotAssigned
from gpulayer.server.scheduler import gpu_health, workers

from helpers import add_worker, events_of, job, state_of


def beat(sched, worker_id, tasks=(), gpus=None):
    return sched.heartbeat(worker_id, [{"task_id": t, "state": "running", "endpoint": None, "restarts": 0}
                                       for t in tasks], gpus)


def healthy(*indices, bad=None):
    bad = bad or {}
    return [{"index": i, "uuid": f"GPU-{i}", "healthy": i not in bad, "reason": bad.get(i)} for i in indices]


def listed(sched, worker_id):
    return next(w for w in sched.store.read(workers.listing) if w["id"] == worker_id)


def reason(sched, job_id):
    return state_of(sched, job_id)["waiting_reason"]


def test_cordoned_worker_gets_no_task_and_says_why(sched):
    w = add_worker(sched, "w1")
    sched.cordon("w1", "bad fan")
    job_id = sched.submit(job())
    assert sched.acquire(w) is None
    assert reason(sched, job_id) == "only cordoned workers fit it: w1 (cordoned: bad fan)"
    assert listed(sched, w)["cordon"] == "cordoned" and listed(sched, w)["cordon_reason"] == "bad fan"
    sched.uncordon(str(w))
    assert listed(sched, w)["cordon"] is None
    assert sched.acquire(w)["job_id"] == job_id


def test_only_cordoned_workers_fit_a_gang(sched):
    add_worker(sched, "a", gpus=1)
    add_worker(sched, "b", gpus=1)
    sched.cordon("a", "psu")
    sched.cordon("b", "psu", drain=True)
    gang = sched.submit(job(nodes=2, gpus=1))
    assert reason(sched, gang) == "only cordoned workers fit it: a (cordoned: psu), b (drained: psu)"


def test_a_gang_too_few_uncordoned_workers_fit_names_the_cordons(sched):
    add_worker(sched, "a", gpus=1)
    add_worker(sched, "c", gpus=1)
    add_worker(sched, "b", gpus=1)
    add_worker(sched, "small", gpus=0)
    sched.cordon("c", "fan")
    sched.cordon("b", "psu", drain=True)
    gang = sched.submit(job(nodes=3, gpus=1))
    assert reason(sched, gang) == ("needs 3 workers, but of the 3 online that fit it, 2 are cordoned: "
                                   "b (drained: psu), c (cordoned: fan)")
    sched.uncordon("b")
    sched.uncordon("c")
    assert reason(sched, gang) is None
    wide = sched.submit(job(nodes=4, gpus=1))
    assert reason(sched, wide) == "needs 4 workers, but only 3 online fit it"  # not "busy": never, as things are


def test_cordon_skips_gangs_and_services(sched):
    a, b = add_worker(sched, "a"), add_worker(sched, "b")
    sched.cordon("b", "maintenance")
    gang = sched.submit(job(nodes=2))
    service = sched.submit(job(["sleep", "1"], service={"replicas": 2}))
    first = sched.acquire(a)
    assert first is not None and first["job_id"] == service  # one replica; the gang needs b too
    assert sched.acquire(b) is None
    # a is busy now, but the gang would wait with a idle too: b's cordon is what holds it.
    assert reason(sched, gang) == "needs 2 workers, but of the 2 online that fit it, 1 is cordoned: b (cordoned: maintenance)"
    sched.uncordon("b")
    assert sched.acquire(b) is not None


def test_running_tasks_go_on_when_cordoned(sched):
    w = add_worker(sched, "w1")
    job_id = sched.submit(job())
    task = sched.acquire(w)
    sched.start(w, task["task_id"], 1)
    sched.cordon("w1", "x")
    assert beat(sched, w, [task["task_id"]])["cancel_task_ids"] == []
    assert state_of(sched, job_id)["state"] == "running"


def test_drain_ends_drained_when_tasks_end(sched):
    w = add_worker(sched, "w1")
    job_id = sched.submit(job())
    task = sched.acquire(w)
    sched.start(w, task["task_id"], 1)
    assert sched.cordon("w1", "reboot", drain=True)["cordon"] == "draining"
    assert sched.advance_drains() == 0
    sched.finish(w, task["task_id"], exit_code=0, outcome="succeeded", outputs={}, reason=None)
    assert sched.advance_drains() == 1
    assert listed(sched, w)["cordon"] == "drained" and listed(sched, w)["state"] == "online"
    assert state_of(sched, job_id)["state"] == "succeeded"
    assert beat(sched, w)["revoked"] is False  # a drained worker stays registered and heartbeating


def test_drain_of_idle_worker_is_drained_at_once(sched):
    add_worker(sched, "w1")
    assert sched.cordon("w1", "idle", drain=True)["cordon"] == "drained"
    assert sched.cordon("w1", "now cordoned")["cordon"] == "drained"  # a cordon does not undo a drain
    again = sched.cordon("w1", "firmware", drain=True)  # a new drain: its reason, drained again at once
    assert again["cordon"] == "drained" and again["cordon_reason"] == "firmware"


def test_drain_timeout_stops_and_requeues(sched, clock):
    w, other = add_worker(sched, "w1"), add_worker(sched, "w2")
    sched.cordon("w2", "not yet")
    running = sched.submit(job())  # the default: one attempt, which the drain must not use up
    task = sched.acquire(w)
    sched.start(w, task["task_id"], 1)
    sched.cordon("w1", "reboot", drain=True, timeout_s=30)
    clock.advance(29)
    assert sched.advance_drains() == 0
    clock.advance(2)
    assert sched.advance_drains() == 1
    after = state_of(sched, running)
    assert after["state"] == "queued" and after["attempt"] == 1
    assert [(t["state"], t["reason"]) for t in after["tasks"]] == [("queued", "worker_drained")]
    events = events_of(sched, running)
    assert [e["data"]["reason"] for e in events if e["kind"] == "task_requeued"] == ["drain_timeout"]
    assert beat(sched, w, [task["task_id"]])["cancel_task_ids"] == [task["task_id"]]
    # The stopped run's late finish changes nothing; the task runs again elsewhere, same attempt.
    with pytest.raises(TaskNotAssigned):
        sched.finish(w, task["task_id"], exit_code=None, outcome="cancelled", outputs={}, reason=None)
    sched.uncordon("w2")
    again = sched.acquire(other)
    assert again["job_id"] == running and again["task_id"] == task["task_id"] and again["attempt"] == 1
    sched.start(other, again["task_id"], 2)
    sched.finish(other, again["task_id"], exit_code=0, outcome="succeeded", outputs={}, reason=None)
    assert state_of(sched, running)["state"] == "succeeded"


def test_drain_timeout_sends_a_gang_back_whole(sched):
    a, b = add_worker(sched, "a"), add_worker(sched, "b")
    gang = sched.submit(job(nodes=2))
    first = sched.acquire(a)
    second = sched.acquire(b)
    sched.start(a, first["task_id"], 1)
    sched.start(b, second["task_id"], 1)
    sched.cordon("a", "reboot", drain=True, timeout_s=0)
    after = state_of(sched, gang)
    assert after["state"] == "queued" and after["attempt"] == 1
    assert sorted(t["state"] for t in after["tasks"]) == ["queued", "queued"]
    assert beat(sched, b, [second["task_id"]])["cancel_task_ids"] == [second["task_id"]]
    assert listed(sched, a)["cordon"] == "drained"


def test_drain_timeout_zero_requeues_assigned_same_attempt(sched):
    w = add_worker(sched, "w1")
    job_id = sched.submit(job())
    task = sched.acquire(w)  # assigned, never started
    sched.cordon("w1", "now", drain=True, timeout_s=0)
    after = state_of(sched, job_id)
    assert after["state"] == "queued" and after["attempt"] == 1
    assert [t["state"] for t in after["tasks"]] == ["queued"] and task["attempt"] == 1
    assert listed(sched, w)["cordon"] == "drained"


def test_a_name_means_its_online_worker_not_an_offline_namesake(sched, clock, config):
    """Issue 22 item 23: a machine that rejoined after a crash left its old registration offline under the
    same name; `worker cordon NAME` answered `2 live workers are named ...` (409) as if both were live."""
    old = add_worker(sched, "w1")
    clock.advance(config.lease_ttl_s + 1)
    sched.expire()                              # the crashed agent's lease ran out: offline
    assert listed(sched, old)["state"] == "offline"
    new = add_worker(sched, "w1")               # the machine rejoins under its name
    assert sched.cordon("w1", "bad fan")["id"] == new
    assert listed(sched, new)["cordon"] == "cordoned" and listed(sched, old)["cordon"] is None
    assert sched.uncordon("w1")["id"] == new
    sched.deregister(new)                       # no online one left: the newest registration not gone
    assert sched.cordon("w1", "rma")["id"] == old


def test_names_ids_and_refusals(sched):
    add_worker(sched, "dup")
    add_worker(sched, "dup")
    with pytest.raises(Conflict) as err:
        sched.cordon("dup", "x")
    assert err.value.code == "ambiguous_worker"
    with pytest.raises(NotFound):
        sched.cordon("nobody", "x")
    with pytest.raises(NotFound):
        sched.uncordon("999")
    gone = add_worker(sched, "gone")
    sched.deregister(gone)
    with pytest.raises(Conflict):
        sched.cordon("gone", "x")
    with pytest.raises(Conflict):
        sched.gpu_reset(str(gone), 0)


def test_unhealthy_gpu_is_never_reserved(sched):
    w = add_worker(sched, "g", gpus=4, slots=4)
    beat(sched, w, gpus=healthy(0, 1, 2, 3, bad={1: "Xid 79"}))
    assert listed(sched, w)["free"]["gpus"] == 3
    ids = [sched.submit(job(gpus=1)) for _ in range(4)]
    got = [sched.acquire_many(w, 0, 4)]
    indices = sorted(i for a in got[0] for i in a["gpus"])
    assert indices == [0, 2, 3]
    assert reason(sched, ids[3]).startswith("waiting for capacity")


def test_eight_gpus_one_bad_offers_seven(sched):
    w = add_worker(sched, "g8", gpus=8)
    beat(sched, w, gpus=healthy(*range(8), bad={5: "Xid 48"}))
    job_id = sched.submit(job(gpus=7))
    task = sched.acquire(w)
    assert task["job_id"] == job_id and 5 not in task["gpus"] and len(task["gpus"]) == 7
    assert sched.submit(job(gpus=8)) and listed(sched, w)["free"]["gpus"] == 0


def test_a_job_only_unhealthy_gpus_would_fit_says_so(sched):
    w = add_worker(sched, "g8", gpus=8)
    small = add_worker(sched, "g2", gpus=2)
    beat(sched, w, gpus=healthy(*range(8), bad={6: "ECC", 5: "Xid 48"}))
    job_id = sched.submit(job(gpus=8))
    assert reason(sched, job_id) == "only workers with unhealthy GPUs would fit: g8 (GPU 5: Xid 48, GPU 6: ECC)"
    assert sched.acquire(w) is None and sched.acquire(small) is None
    six = sched.submit(job(gpus=6))
    assert reason(sched, six) is None  # the six healthy GPUs do
    sched.gpu_reset("g8", 5)
    sched.gpu_reset("g8", 6)
    assert sched.acquire(w)["job_id"] == job_id


def test_gpu_turning_bad_loses_its_task_and_retries_elsewhere(sched):
    w = add_worker(sched, "g", gpus=2, slots=2)
    beat(sched, w, gpus=healthy(0, 1))
    on_bad = sched.submit(job(gpus=1, retry={"max_attempts": 3}))
    other = sched.submit(job(gpus=1))
    a = sched.acquire(w)
    sched.start(w, a["task_id"], 1)  # acquire hands the same task out again until it starts
    b = sched.acquire(w)
    sched.start(w, b["task_id"], 1)
    bad_task = a if a["job_id"] == on_bad else b
    bad_index = bad_task["gpus"][0]
    answer = beat(sched, w, [a["task_id"], b["task_id"]], healthy(0, 1, bad={bad_index: "Xid 79"}))
    assert answer["cancel_task_ids"] == [bad_task["task_id"]]
    assert state_of(sched, on_bad)["attempt"] == 1  # settled once its worker reports it ended
    sched.finish(w, bad_task["task_id"], exit_code=None, outcome="cancelled", outputs={}, reason=None)
    after = state_of(sched, on_bad)
    assert after["state"] == "queued" and after["attempt"] == 2
    assert [t["reason"] for t in after["tasks"] if t["attempt"] == 1] == ["gpu_unhealthy"]
    assert state_of(sched, other)["state"] == "running"
    events = [e["kind"] for e in events_of(sched, on_bad)]
    assert "task_stop_requested" in events and "job_retried" in events
    # The worker's other GPU is busy and the bad one is out: the retry waits, and later healthy reports change nothing.
    beat(sched, w, [t for t in (a["task_id"], b["task_id"]) if t != bad_task["task_id"]], healthy(0, 1))
    assert listed(sched, w)["free"]["gpus"] == 0
    assert [g["healthy"] for g in listed(sched, w)["gpus"]] == [i != bad_index for i in (0, 1)]


def test_a_task_keeps_its_healthy_gpus_until_it_has_ended(sched):
    w = add_worker(sched, "g", gpus=4, slots=4)
    beat(sched, w, gpus=healthy(0, 1, 2, 3))
    wide = sched.submit(job(gpus=2))  # one attempt: a crash of the process on the bad GPU ends it lost
    task = sched.acquire(w)
    sched.start(w, task["task_id"], 1)
    assert task["gpus"] == [0, 1]
    answer = beat(sched, w, [task["task_id"]], healthy(0, 1, 2, 3, bad={1: "Xid 79"}))
    assert answer["cancel_task_ids"] == [task["task_id"]]
    # GPUs 0 and 1 stay the stopping task's (1 is also out: counted twice meanwhile, so one fewer is offered).
    assert listed(sched, w)["free"]["gpus"] == 1
    sched.submit(job(gpus=1))
    second = sched.acquire(w)
    assert second["gpus"] == [2]  # not GPU 0, which the old process may still use
    sched.start(w, second["task_id"], 2)
    # The process died of the fault: the task is lost as gpu_unhealthy, not failed, and GPU 0 is free again.
    sched.finish(w, task["task_id"], exit_code=1, outcome="failed", outputs={}, reason=None)
    after = state_of(sched, wide)
    assert after["state"] == "lost" and after["tasks"][0]["reason"] == "gpu_unhealthy"
    assert listed(sched, w)["free"]["gpus"] == 2
    sched.submit(job(gpus=1))
    assert sched.acquire(w)["gpus"] == [0]


def test_gpu_reset_marks_healthy_and_is_told_until_the_agent_echoes_it(sched):
    w = add_worker(sched, "g", gpus=2)
    beat(sched, w, gpus=healthy(0, 1, bad={0: "Xid 79"}))
    with pytest.raises(NotFound):
        sched.gpu_reset("g", 5)
    answer = sched.gpu_reset("g", 0)
    assert answer["gpus"][0]["healthy"] is True
    # The report in flight was made before the agent heard: ignored, and the reset is told.
    hb = beat(sched, w, gpus=healthy(0, 1, bad={0: "Xid 79"}))
    assert hb["reset_gpus"] == [0]
    assert listed(sched, w)["free"]["gpus"] == 2
    # That answer was lost: the agent still reports the fault, which is ignored, and the reset is told again.
    hb = beat(sched, w, gpus=healthy(0, 1, bad={0: "Xid 79"}))
    assert hb["reset_gpus"] == [0] and listed(sched, w)["gpus"][0]["healthy"] is True
    assert sched.store.read(lambda conn: conn.execute(
        "SELECT count(*) AS n FROM events WHERE kind = 'gpu_unhealthy' AND worker_id = ?", (w,)).fetchone()["n"]) == 1
    # The agent applied it and echoes it: heard, told no more.
    echo = healthy(0, 1)
    echo[0]["reset_applied"] = True
    hb = beat(sched, w, gpus=echo)
    assert "reset_gpus" not in hb
    assert sched.store.read(lambda conn: gpu_health.listing(conn, w))[0]["healthy"] is True
    # A new fault after that counts again; an echo repeated (its answer lost) changes nothing.
    again = healthy(0, 1, bad={0: "Xid 94"})
    again[0]["reset_applied"] = True
    hb = beat(sched, w, gpus=again)
    assert "reset_gpus" not in hb
    assert listed(sched, w)["gpus"][0] == {"index": 0, "uuid": "GPU-0", "healthy": False, "reason": "Xid 94"}


def test_a_fault_reported_with_the_echo_counts(sched):
    w = add_worker(sched, "g", gpus=1)
    beat(sched, w, gpus=healthy(0, bad={0: "Xid 79"}))
    sched.gpu_reset("g", 0)
    # The agent applied the reset, and then NVML showed the fault again (a remap failure is not cleared by words).
    report = healthy(0, bad={0: "row remap failure"})
    report[0]["reset_applied"] = True
    hb = beat(sched, w, gpus=report)
    assert "reset_gpus" not in hb
    assert listed(sched, w)["gpus"][0]["reason"] == "row remap failure"


def test_a_healthy_report_hears_the_reset_and_no_report_is_told_once(sched):
    w = add_worker(sched, "g", gpus=2)
    beat(sched, w, gpus=healthy(0, 1, bad={0: "Xid 79", 1: "Xid 48"}))
    sched.gpu_reset("g", 0)
    sched.gpu_reset("g", 1)
    # An agent that applies resets but echoes nothing (an older one) reports GPU 0 healthy: heard.
    hb = beat(sched, w, gpus=healthy(0, 1, bad={1: "Xid 48"}))
    assert hb["reset_gpus"] == [1]
    # A heartbeat without `gpus` cannot mark a GPU again: the reset is told once.
    assert beat(sched, w)["reset_gpus"] == [1]
    assert "reset_gpus" not in beat(sched, w)
    assert [g["healthy"] for g in listed(sched, w)["gpus"]] == [True, True]


def test_reset_applied_must_be_a_flag():
    from gpulayer.server.errors import InvalidRequest
    from gpulayer.server.http import wire
    assert wire.gpu_health({"gpus": [{"index": 0}]})[0]["reset_applied"] is False
    with pytest.raises(InvalidRequest, match=r"gpus\[0\].reset_applied"):
        wire.gpu_health({"gpus": [{"index": 0, "reset_applied": "yes"}]})


def test_register_reports_gpus_and_ignores_unknown_indices(sched):
    body = {"name": "r", "labels": {}, "slots": 1, "version": "t", "gpus": healthy(0, 1, 7, bad={1: "Xid 79"}),
            "resources": {"cpus": 4, "gpus": 2, "memory_mb": 1000, "gpu_models": []}}
    from helpers import SERVER_JOIN
    w = sched.register(body=body, token=SERVER_JOIN, session_hash="h-r", peer_address="127.0.0.1")["worker_id"]
    assert [(g["index"], g["healthy"]) for g in listed(sched, w)["gpus"]] == [(0, True), (1, False)]
    sched.submit(job(gpus=2))
    assert sched.acquire(w) is None


def test_metrics_queries_count_cordons_and_bad_gpus(sched):
    from gpulayer.server.store.queries import rows
    w = add_worker(sched, "g", gpus=2)
    add_worker(sched, "c")
    sched.cordon("c", "x")
    beat(sched, w, gpus=healthy(0, 1, bad={1: "ECC"}))
    counts = sched.store.read(lambda conn: {r["state"]: r["n"] for r in rows(conn, "metrics_workers_cordoned")})
    assert counts == {"cordoned": 1}
    assert sched.store.read(lambda conn: rows(conn, "metrics_gpus_unhealthy"))[0]["n"] == 1


def test_a_new_uuid_is_learnt_and_the_health_kept(sched):
    w = add_worker(sched, "g", gpus=1)
    beat(sched, w, gpus=[{"index": 0, "uuid": None, "healthy": False, "reason": "Xid 79"}])
    beat(sched, w, gpus=[{"index": 0, "uuid": "GPU-new", "healthy": True, "reason": None}])
    assert listed(sched, w)["gpus"] == [{"index": 0, "uuid": "GPU-new", "healthy": False, "reason": "Xid 79"}]


def test_gpu_model_is_met_by_a_worker_whose_every_gpu_is_that_model(sched):
    from helpers import SERVER_JOIN

    def mig_worker(name, models):
        body = {"name": name, "labels": {}, "slots": 1, "version": "t",
                "resources": {"cpus": 4, "gpus": len(models), "memory_mb": 1000, "gpu_models": models}}
        return sched.register(body=body, token=SERVER_JOIN, session_hash=f"h-{name}",
                              peer_address="127.0.0.1")["worker_id"]
    same = mig_worker("same", ["1g.10gb"] * 7)
    job_id = sched.submit(job(gpus=1, labels={"gpu_model": "1g.10gb"}))
    assert sched.acquire(same)["job_id"] == job_id
    other = sched.submit(job(gpus=1, labels={"gpu_model": "2g.20gb"}))
    assert reason(sched, other) == 'no online worker has the labels {"gpu_model": "2g.20gb"}'
    labelled = add_worker(sched, "labelled", gpus=1, labels={"gpu_model": "2g.20gb"})
    assert sched.acquire(labelled)["job_id"] == other


def test_gpu_model_on_a_mixed_worker_takes_the_gpus_of_that_model(sched):
    w = register_mig(sched, "mixed", ["MIG-0-a", "MIG-0-b", "GPU-1", "MIG-2-a", "GPU-3"],
                     ["3g.40gb", "1g.10gb", "NVIDIA H100", "1g.10gb", "NVIDIA H100"])
    small = [sched.submit(job(gpus=1, labels={"gpu_model": "1g.10gb"})) for _ in range(3)]
    first = sched.acquire(w)
    assert first["job_id"] == small[0] and first["gpus"] == [1]  # not index 0, a 3g.40gb
    sched.start(w, first["task_id"], 1)
    second = sched.acquire(w)
    assert second["job_id"] == small[1] and second["gpus"] == [3]
    sched.start(w, second["task_id"], 2)
    assert sched.acquire(w) is None  # both 1g.10gb are taken; the free 3g.40gb and H100s are not that model
    assert reason(sched, small[2]).startswith("waiting for capacity")
    pair = sched.submit(job(gpus=2, labels={"gpu_model": "NVIDIA H100"}))
    got = sched.acquire(w)
    assert got["job_id"] == pair and got["gpus"] == [2, 4]
    sched.start(w, got["task_id"], 3)
    wide = sched.submit(job(gpus=2, labels={"gpu_model": "1g.10gb"}))
    assert reason(sched, wide) == ("no online worker with its labels has 2 GPUs of model 1g.10gb "
                                   "(whole GPUs: a task of more than one GPU is given no MIG instances)")
    three = sched.submit(job(gpus=3, labels={"gpu_model": "NVIDIA H100"}))
    assert reason(sched, three).startswith("no online worker with its labels has 3 GPUs of model NVIDIA H100")
    # An unhealthy GPU of that model is never given: the last 1g.10gb job waits once GPU 1 is free but bad.
    beat(sched, w, [first["task_id"], second["task_id"], got["task_id"]],
         mig_gpus("MIG-0-a", "MIG-0-b", "GPU-1", "MIG-2-a", "GPU-3")[:1]
         + [{"index": 1, "uuid": "MIG-0-b", "healthy": False, "reason": "Xid 79"}])
    sched.finish(w, first["task_id"], exit_code=None, outcome="cancelled", outputs={}, reason=None)
    assert sched.acquire(w) is None
    assert reason(sched, small[2]).startswith("waiting for capacity")


def test_a_drain_outlives_the_agents_restart(sched):
    old = add_worker(sched, "node7")
    sched.cordon("node7", "reboot", drain=True)
    sched.deregister(old)
    new = add_worker(sched, "node7")  # the agent started again: a new registration
    assert listed(sched, new)["cordon"] == "drained" and listed(sched, new)["cordon_reason"] == "reboot"
    sched.submit(job())
    assert sched.acquire(new) is None
    sched.uncordon("node7")
    newer = add_worker(sched, "node7")
    assert listed(sched, newer)["cordon"] is None  # the newest registration before it was in service
    cordoned = add_worker(sched, "other")
    sched.cordon(str(cordoned), "fan")
    assert listed(sched, add_worker(sched, "other"))["cordon"] == "cordoned"


def test_drain_timeout_replaces_a_service_replica_and_keeps_the_other(sched):
    a, b, c = add_worker(sched, "a"), add_worker(sched, "b"), add_worker(sched, "c")
    sched.cordon("c", "spare, later")
    service = sched.submit(job(["sleep", "1000"], service={"replicas": 2}))
    ta, tb = sched.acquire(a), sched.acquire(b)
    sched.start(a, ta["task_id"], 1)
    sched.start(b, tb["task_id"], 1)
    sched.cordon("a", "reboot", drain=True, timeout_s=0)
    info = state_of(sched, service)
    assert info["state"] == "running" and info["attempt"] == 1
    states = {t["task_id"]: t["state"] for t in info["tasks"]}
    assert states[ta["task_id"]] == "queued" and states[tb["task_id"]] == "running"
    sched.uncordon("c")
    assert sched.acquire(c)["task_id"] == ta["task_id"]  # the replica placed again, elsewhere


def mig_gpus(*uuids):
    return [{"index": i, "uuid": u, "healthy": True, "reason": None} for i, u in enumerate(uuids)]


def register_mig(sched, name, uuids, models):
    from helpers import SERVER_JOIN
    body = {"name": name, "labels": {}, "slots": 4, "version": "t", "gpus": mig_gpus(*uuids),
            "resources": {"cpus": 8, "gpus": len(uuids), "memory_mb": 1000, "gpu_models": models}}
    return sched.register(body=body, token=SERVER_JOIN, session_hash=f"h-{name}",
                          peer_address="127.0.0.1")["worker_id"]


def test_a_task_of_several_gpus_gets_no_mig_instances(sched):
    m = register_mig(sched, "m", ["MIG-0-a", "MIG-0-b", "GPU-1"], ["1g.10gb", "3g.40gb", "H100"])
    two = sched.submit(job(gpus=2))
    assert reason(sched, two) == ("no online worker has 2 whole GPUs: a task of more than "  # it has no labels
                                  "one GPU is given no MIG instances (a CUDA process uses only one)")
    assert sched.acquire(m) is None
    one = sched.submit(job(gpus=1))
    got = sched.acquire(m)
    assert got["job_id"] == one and got["gpus"] == [0]  # one MIG instance is fine


def test_on_a_mixed_worker_several_gpus_are_whole_ones(sched):
    w = register_mig(sched, "mixed", ["MIG-0-a", "MIG-0-b", "GPU-1", "GPU-2"], ["1g.10gb", "1g.10gb", "H100", "H100"])
    small = sched.submit(job(gpus=1))
    first = sched.acquire(w)
    assert first["job_id"] == small and first["gpus"] == [0]
    sched.start(w, first["task_id"], 1)
    wide = sched.submit(job(gpus=2))
    second = sched.acquire(w)  # a MIG instance busy does not hide the two free whole GPUs
    assert second["job_id"] == wide and second["gpus"] == [2, 3]
    sched.start(w, second["task_id"], 2)
    again = sched.submit(job(gpus=2))
    assert sched.acquire(w) is None  # MIG-0-b and nothing whole is free
    assert reason(sched, again).startswith("waiting for capacity")
