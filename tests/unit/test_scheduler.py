"""Every scheduler transaction against a real state file, with a pinned clock."""
from __future__ import annotations

import json

import pytest

from gpulayer.server.scheduler import events as events_mod
from gpulayer.server.scheduler import views
from gpulayer.server.errors import InvalidRequest, NotFound, TaskNotAssigned
from gpulayer.server.scheduler.spec import MAX_ARG_BYTES, MAX_ARGS, MAX_PATHS
from helpers import add_worker, events_of, job, state_of


# -- small builders ----------------------------------------------------------

def finish(sched, w, task_id, outcome="succeeded", exit_code=0, reason=None, outputs=None):
    return sched.finish(w, task_id, exit_code=exit_code, outcome=outcome, outputs=outputs or {}, reason=reason)


def take(sched, w):
    """Acquire and start one task on worker w; returns the assignment."""
    a = sched.acquire(w)
    assert a is not None, f"worker {w} got nothing"
    sched.start(w, a["task_id"], 100)
    return a


def kinds(sched, job_id):
    return [e["kind"] for e in events_of(sched, job_id)]


def task_rows(sched, job_id):
    return sched.store.read(lambda c: c.execute(
        "SELECT * FROM tasks WHERE job_id = ? ORDER BY attempt, \"index\"", (job_id,)).fetchall())


def hb(sched, w, *task_ids):
    return sched.heartbeat(w, [{"task_id": t, "state": "running", "endpoint": None, "restarts": 0}
                               for t in task_ids])


def count(sched, table):
    return sched.store.read(lambda c: c.execute(f"SELECT count(*) AS n FROM {table}").fetchall()[0]["n"])


# -- submit validation -------------------------------------------------------

@pytest.mark.parametrize("spec, field", [
    ({"command": []}, "command"),
    ({"command": "echo hi"}, "command"),
    ({"command": [""]}, "command"),
    ({"command": ["x", 3]}, "command[1]"),
    ({"command": ["x"] * (MAX_ARGS + 1)}, "command"),
    ({"command": ["x" * (MAX_ARG_BYTES + 1)]}, "command[0]"),
    ({"command": ["x"], "name": "n" * 300}, "name"),
    ({"command": ["x"], "gpus": -1}, "gpus"),
    ({"command": ["x"], "cpus": -0.5}, "cpus"),
    ({"command": ["x"], "memory_mb": -1}, "memory_mb"),
    ({"command": ["x"], "gpus": 1.5}, "gpus"),
    ({"command": ["x"], "gpus": True}, "gpus"),
    ({"command": ["x"], "cpus": float("nan")}, "cpus"),
    ({"command": ["x"], "labels": {"a": 1}}, "labels.a"),
    ({"command": ["x"], "labels": {"a": None}}, "labels.a"),
    ({"command": ["x"], "labels": ["a"]}, "labels"),
    ({"command": ["x"], "labels": {"bad key!": "v"}}, "labels"),
    ({"command": ["x"], "labels": {f"k{i}": "v" for i in range(65)}}, "labels"),
    ({"command": ["x"], "env": {"A": 1}}, "env.A"),
    ({"command": ["x"], "env": {"1A": "v"}}, "env"),
    ({"command": ["x"], "bogus": 1}, "bogus"),
    ({"command": ["x"], "service": {"replicas": 2, "bogus": 1}}, "service.bogus"),
    ({"command": ["x"], "retry": {"max_attempts": 0}}, "retry.max_attempts"),
    ({"command": ["x"], "retry": {"retry_on": ["sunspots"]}}, "retry.retry_on"),
    ({"command": ["x"], "accelerator": "rocm"}, "accelerator"),
    ({"command": ["x"], "nodes": 0}, "nodes"),
    ({"command": ["x"], "source": "sha256:../../etc/passwd"}, "source"),
    ({"command": ["x"], "outputs": ["/etc/passwd"]}, "outputs[0]"),
    ({"command": ["x"], "outputs": ["a/../../b"]}, "outputs[0]"),
    ({"command": ["x"], "outputs": [f"o{i}" for i in range(MAX_PATHS + 5)]}, "outputs"),
    ({"command": ["x"], "priority": "urgent"}, "priority"),  # no such priority class
    ({"command": ["x"], "service": {"replicas": 2}, "nodes": 2}, "nodes"),
    ("not an object", "job"),
])
def test_submit_refuses_bad_specs_and_writes_nothing(sched, spec, field):
    before = (count(sched, "jobs"), count(sched, "tasks"), count(sched, "events"))
    with pytest.raises(InvalidRequest) as exc:
        sched.submit(spec)
    assert field in exc.value.message
    assert exc.value.code == "invalid_field"
    assert (count(sched, "jobs"), count(sched, "tasks"), count(sched, "events")) == before


def test_submit_normalises_defaults_and_writes_one_event(sched):
    j = sched.submit(job(accelerator="cuda"))
    info = state_of(sched, j)
    assert info["state"] == "queued" and info["attempt"] == 1
    assert info["spec"]["gpus"] == 1 and info["spec"]["retry"] == {"max_attempts": 1, "retry_on": ["worker_lost"]}
    assert [t["state"] for t in info["tasks"]] == ["queued"]
    assert kinds(sched, j) == ["job_submitted"]
    s = sched.submit(job(service={"replicas": 3}))
    assert state_of(sched, s)["spec"]["retry"]["max_attempts"] == 10
    assert len(state_of(sched, s)["tasks"]) == 3


def test_submit_unknown_secret_refused(sched):
    with pytest.raises(InvalidRequest) as exc:
        sched.submit(job(secrets=["NOPE"]))
    assert exc.value.code == "unknown_secret"
    assert count(sched, "jobs") == 0


# -- acquire / placement -----------------------------------------------------

def test_labels_must_all_be_on_the_worker(sched):
    plain = add_worker(sched, "plain")
    zone = add_worker(sched, "zone", labels={"zone": "a", "disk": "ssd"})
    j = sched.submit(job(labels={"zone": "a", "disk": "ssd"}))
    other = sched.submit(job(labels={"zone": "b"}))
    assert sched.acquire(plain) is None
    assert sched.acquire(zone)["job_id"] == j
    sched.start(zone, sched.acquire(zone)["task_id"], 1)
    assert sched.acquire(zone) is None  # slot busy; and zone=b never fits
    assert state_of(sched, other)["state"] == "queued"


def test_accelerator_needs_gpus(sched):
    cpu = add_worker(sched, "cpu")
    gpu = add_worker(sched, "gpu", gpus=2)
    j = sched.submit(job(accelerator="cuda"))
    assert sched.acquire(cpu) is None
    a = sched.acquire(gpu)
    assert a["job_id"] == j and a["gpus"] == [0]


def test_gpus_distinct_indices_and_no_sharing(sched):
    w = add_worker(sched, "g", gpus=4, slots=8)
    ids = [sched.submit(job(gpus=2)) for _ in range(3)]
    a = take(sched, w)
    b = take(sched, w)
    assert a["gpus"] == [0, 1] and b["gpus"] == [2, 3]
    assert sched.acquire(w) is None  # the third needs 2 GPUs, none are free
    assert finish(sched, w, a["task_id"])
    c = take(sched, w)
    assert c["job_id"] == ids[2] and c["gpus"] == [0, 1]
    # a one-GPU job fits nowhere now
    sched.submit(job(gpus=1))
    assert sched.acquire(w) is None
    assert finish(sched, w, b["task_id"])
    assert take(sched, w)["gpus"] == [2]


def test_cpus_memory_and_slots(sched):
    w = add_worker(sched, "w", cpus=4, memory_mb=1000, slots=3)
    big_cpu = sched.submit(job(cpus=3))
    sched.submit(job(cpus=2))
    mem = sched.submit(job(memory_mb=900))
    sched.submit(job(memory_mb=200))
    a = take(sched, w)
    assert a["job_id"] == big_cpu and a["cpus"] == 3
    b = take(sched, w)  # the cpus=2 job does not fit in 1 free cpu: skip to memory 900
    assert b["job_id"] == mem
    assert sched.acquire(w) is None  # cpus=2 does not fit; memory 200 does not fit in 100
    assert finish(sched, w, b["task_id"])
    assert take(sched, w)["memory_mb"] == 200
    assert sched.acquire(w) is None  # cpus=2 still does not fit


def test_slots_bound_the_tasks_held(sched):
    w = add_worker(sched, "w", slots=2)
    for _ in range(5):
        sched.submit(job())
    take(sched, w)
    take(sched, w)
    assert sched.acquire(w) is None


def test_replicas_of_one_job_on_distinct_workers(sched):
    w1 = add_worker(sched, "w1", slots=4)
    w2 = add_worker(sched, "w2", slots=4)
    s = sched.submit(job(service={"replicas": 2}))
    a = take(sched, w1)
    assert a["job_id"] == s
    assert sched.acquire(w1) is None  # the other replica may not land beside its sibling
    b = take(sched, w2)
    assert b["job_id"] == s and {a["index"], b["index"]} == {0, 1}


def test_priority_then_fifo(sched):
    w = add_worker(sched, "w", slots=10)
    low = sched.submit(job(priority=-5))
    first = sched.submit(job())
    high = sched.submit(job(priority=7))
    second = sched.submit(job())
    order = [take(sched, w)["job_id"] for _ in range(4)]
    assert order == [high, first, second, low]


def test_acquire_idempotent_until_start(sched):
    w = add_worker(sched, "w", slots=2)
    sched.submit(job())
    sched.submit(job())
    a = sched.acquire(w)
    assert sched.acquire(w) == a
    assert kinds(sched, a["job_id"]).count("task_assigned") == 1
    sched.start(w, a["task_id"], 5)
    b = sched.acquire(w)
    assert b["task_id"] != a["task_id"]


def test_offline_worker_gets_nothing(sched, clock):
    w = add_worker(sched, "w")
    clock.advance(10)
    sched.expire()
    sched.submit(job())
    assert sched.acquire(w) is None
    hb(sched, w)
    assert sched.acquire(w) is not None


# -- start / logs / finish ownership -----------------------------------------

def test_another_workers_task_is_not_assigned(sched):
    w1 = add_worker(sched, "w1")
    w2 = add_worker(sched, "w2")
    j = sched.submit(job())
    a = sched.acquire(w1)
    with pytest.raises(TaskNotAssigned):
        sched.start(w2, a["task_id"], 1)
    sched.start(w1, a["task_id"], 1)
    sched.start(w1, a["task_id"], 1)  # starting twice is harmless
    with pytest.raises(TaskNotAssigned):
        sched.logs(w2, a["task_id"], [{"n": 0, "stream": "stdout", "text": "x", "at": 1.0}])
    with pytest.raises(TaskNotAssigned):
        sched.rendezvous(w2, a["task_id"], "10.0.0.1", 1234)
    with pytest.raises(TaskNotAssigned):
        sched.start(w1, 999_999, 1)
    # finishing a task that was never this worker's is refused: nothing changes
    with pytest.raises(TaskNotAssigned):
        finish(sched, w2, a["task_id"])
    assert state_of(sched, j)["tasks"][0]["state"] == "running"
    assert finish(sched, w1, a["task_id"])
    assert state_of(sched, j)["state"] == "succeeded"


def test_logs_stored_once_per_line_number(sched):
    w = add_worker(sched)
    j = sched.submit(job())
    a = take(sched, w)
    lines = [{"n": i, "stream": "stdout", "text": f"l{i}", "at": 1.0} for i in range(3)]
    assert sched.logs(w, a["task_id"], lines) == 3
    assert sched.logs(w, a["task_id"], lines + [{"n": 3, "stream": "stderr", "text": "e", "at": 2.0}]) == 1
    got = sched.store.read(views.log_page, j, 0, 100)[0]
    assert [x["text"] for x in got] == ["l0", "l1", "l2", "e"]


# -- leases ------------------------------------------------------------------

def test_heartbeat_renews_leases(sched, clock):
    w = add_worker(sched)
    j = sched.submit(job())
    a = take(sched, w)
    for _ in range(5):
        clock.advance(2)
        out = hb(sched, w, a["task_id"])
        assert out == {"cancel_task_ids": [], "revoked": False, "lease_expires_at": clock.now + 3.0}
        assert sched.expire() == {"tasks_lost": 0, "workers_offline": 0, "gangs_released": 0}
    assert state_of(sched, j)["tasks"][0]["state"] == "running"


def test_lease_expiry_loses_task_and_worker_comes_back(sched, clock):
    w = add_worker(sched)
    j = sched.submit(job())
    a = take(sched, w)
    clock.advance(3.0)
    assert sched.expire()["tasks_lost"] == 0  # not past the lease yet (strictly before now)
    clock.advance(0.5)
    assert sched.expire() == {"tasks_lost": 1, "workers_offline": 1, "gangs_released": 0}
    info = state_of(sched, j)
    assert info["state"] == "lost" and info["reason"] == "worker_lost"
    assert info["tasks"][0]["state"] == "lost"
    workers = sched.store.read(lambda c: c.execute("SELECT state FROM workers").fetchall())
    assert workers == [{"state": "offline"}]
    out = hb(sched, w, a["task_id"])
    assert out["cancel_task_ids"] == [a["task_id"]] and not out["revoked"]
    assert sched.store.read(lambda c: c.execute("SELECT state FROM workers").fetchall()) == [{"state": "online"}]
    k = kinds(sched, j)
    assert k[-2:] == ["task_lost", "job_finished"]
    all_kinds = sched.store.read(lambda c: [r["kind"] for r in c.execute("SELECT kind FROM events ORDER BY seq").fetchall()])
    assert "worker_offline" in all_kinds and all_kinds[-1] == "worker_online"


def test_late_finish_ignored(sched, clock):
    w = add_worker(sched)
    j = sched.submit(job())
    a = take(sched, w)
    clock.advance(10)
    sched.expire()
    before = state_of(sched, j)
    assert finish(sched, w, a["task_id"], exit_code=0) is False
    after = state_of(sched, j)
    assert after == before
    late = [e for e in events_of(sched, j) if e["kind"] == "late_finish"]
    assert len(late) == 1 and late[0]["task_id"] == a["task_id"] and late[0]["data"]["outcome"] == "succeeded"


# -- retry accounting --------------------------------------------------------

def test_retry_on_worker_lost_until_max_attempts(sched, clock):
    w = add_worker(sched)
    j = sched.submit(job(retry={"max_attempts": 3}))
    for attempt in (1, 2, 3):
        hb(sched, w)
        a = take(sched, w)
        assert a["attempt"] == attempt
        clock.advance(10)
        sched.expire()
    info = state_of(sched, j)
    assert info["state"] == "lost" and info["attempt"] == 3
    assert [t["state"] for t in info["tasks"]] == ["lost"] * 3
    assert kinds(sched, j).count("job_retried") == 2


def test_failure_not_retried_unless_in_retry_on(sched):
    w = add_worker(sched)
    j = sched.submit(job(retry={"max_attempts": 5}))
    a = take(sched, w)
    assert finish(sched, w, a["task_id"], outcome="failed", exit_code=3)
    info = state_of(sched, j)
    assert info["state"] == "failed" and info["exit_code"] == 3 and info["attempt"] == 1

    k = sched.submit(job(retry={"max_attempts": 2, "retry_on": ["failed", "timed_out"]}))
    a = take(sched, w)
    assert finish(sched, w, a["task_id"], outcome="timed_out", exit_code=None)
    assert state_of(sched, k)["state"] == "queued" and state_of(sched, k)["attempt"] == 2
    b = take(sched, w)
    assert b["attempt"] == 2
    assert finish(sched, w, b["task_id"], outcome="failed", exit_code=1)
    info = state_of(sched, k)
    assert info["state"] == "failed" and info["reason"] == "failed"


def test_lost_not_retried_when_reason_not_listed(sched, clock):
    w = add_worker(sched)
    j = sched.submit(job(retry={"max_attempts": 3, "retry_on": ["failed"]}))
    take(sched, w)
    clock.advance(10)
    sched.expire()
    assert state_of(sched, j)["state"] == "lost"


def test_unrequested_cancelled_outcome_counts_as_worker_lost(sched):
    w = add_worker(sched)
    j = sched.submit(job(retry={"max_attempts": 2}))
    a = take(sched, w)
    assert finish(sched, w, a["task_id"], outcome="cancelled", exit_code=None)
    info = state_of(sched, j)
    assert info["state"] == "queued" and info["attempt"] == 2


# -- cancel ------------------------------------------------------------------

def test_cancel_queued_ends_at_once(sched):
    j = sched.submit(job(service={"replicas": 2}))
    assert sched.cancel(j) is True
    info = state_of(sched, j)
    assert info["state"] == "cancelled" and info["finished_at"] is not None
    assert {t["state"] for t in info["tasks"]} == {"cancelled"}
    assert sched.cancel(j) is False
    with pytest.raises(NotFound):
        sched.cancel(12345)
    assert sched.acquire(add_worker(sched)) is None


def test_cancel_running_through_heartbeat(sched):
    w = add_worker(sched)
    j = sched.submit(job())
    a = take(sched, w)
    assert hb(sched, w, a["task_id"])["cancel_task_ids"] == []
    sched.cancel(j)
    assert state_of(sched, j)["state"] == "cancelled"
    assert hb(sched, w, a["task_id"])["cancel_task_ids"] == [a["task_id"]]
    assert finish(sched, w, a["task_id"], outcome="cancelled", exit_code=-15)
    info = state_of(sched, j)
    assert info["state"] == "cancelled" and info["tasks"][0]["state"] == "cancelled"
    assert hb(sched, w)["cancel_task_ids"] == []
    assert "task_cancel_requested" in kinds(sched, j)


def test_cancel_assigned_task_then_start_refused(sched):
    w = add_worker(sched)
    j = sched.submit(job())
    a = sched.acquire(w)
    sched.cancel(j)
    with pytest.raises(TaskNotAssigned):
        sched.start(w, a["task_id"], 1)
    assert sched.acquire(w) is None


# -- deregister --------------------------------------------------------------

def test_deregister_requeues_or_loses(sched):
    w = add_worker(sched, "w", slots=2)
    retried = sched.submit(job(retry={"max_attempts": 2}))
    once = sched.submit(job())
    take(sched, w)
    take(sched, w)
    assert sched.deregister(w) == 2
    assert state_of(sched, retried)["state"] == "queued" and state_of(sched, retried)["attempt"] == 2
    assert state_of(sched, once)["state"] == "lost"
    w2 = add_worker(sched, "w2")
    assert sched.acquire(w2)["job_id"] == retried
    assert sched.acquire(w) is None  # gone for good
    assert sched.deregister(w) == 0


# -- services ----------------------------------------------------------------

def test_service_replica_end_stops_siblings_and_job_takes_outcome(sched):
    w1, w2 = add_worker(sched, "w1"), add_worker(sched, "w2")
    s = sched.submit(job(service={"replicas": 2}))
    a, b = take(sched, w1), take(sched, w2)
    assert finish(sched, w1, a["task_id"], outcome="failed", exit_code=2)
    info = state_of(sched, s)
    assert info["state"] == "failed" and info["exit_code"] == 2
    assert hb(sched, w2, b["task_id"])["cancel_task_ids"] == [b["task_id"]]

    s2 = sched.submit(job(service={"replicas": 2}))
    hb(sched, w1)
    assert finish(sched, w2, b["task_id"], outcome="cancelled")
    a, b = take(sched, w1), take(sched, w2)
    assert finish(sched, w2, b["task_id"], outcome="succeeded", exit_code=0)
    assert state_of(sched, s2)["state"] == "succeeded"
    assert hb(sched, w1, a["task_id"])["cancel_task_ids"] == [a["task_id"]]


def test_service_worker_loss_replaces_only_the_lost_replica(sched, clock):
    w1, w2, w3 = (add_worker(sched, f"w{i}") for i in (1, 2, 3))
    s = sched.submit(job(service={"replicas": 2}))
    a, b = take(sched, w1), take(sched, w2)
    clock.advance(2)
    hb(sched, w1, a["task_id"])
    hb(sched, w3)
    clock.advance(2)
    assert sched.expire()["tasks_lost"] == 1  # w2 stopped heartbeating
    info = state_of(sched, s)
    assert info["state"] == "running" and info["attempt"] == 1
    states = {t["task_id"]: t["state"] for t in info["tasks"]}
    assert states[a["task_id"]] == "running" and states[b["task_id"]] == "lost"
    assert hb(sched, w1, a["task_id"])["cancel_task_ids"] == []
    c = take(sched, w3)
    assert c["attempt"] == 1 and c["index"] == b["index"]


def test_a_lost_replica_is_replaced_at_most_max_attempts_times_then_the_attempt_retries(sched, clock):
    w1, w2 = add_worker(sched, "w1"), add_worker(sched, "w2")
    s = sched.submit(job(service={"replicas": 2}, retry={"max_attempts": 2}))
    a = take(sched, w1)
    for placed in range(2):  # w2's replica is placed twice, lost twice
        spare = add_worker(sched, f"spare{placed}")
        b = take(sched, spare)
        clock.advance(2)
        hb(sched, w1, a["task_id"])
        hb(sched, w2)
        clock.advance(2)
        assert sched.expire()["tasks_lost"] == 1
    info = state_of(sched, s)
    assert info["attempt"] == 2 and b["index"] == 1  # out of replacements: the attempt was retried whole


# -- gangs (multi-node) ------------------------------------------------------

def test_gang_all_or_nothing(sched):
    w1 = add_worker(sched, "w1", gpus=1)
    j = sched.submit(job(nodes=3, gpus=1))
    single = sched.submit(job())
    w2 = add_worker(sched, "w2", gpus=1)
    # two workers for three ranks: nothing of the gang is assigned, the single job still runs
    assert sched.acquire(w1)["job_id"] == single
    assert [t["state"] for t in state_of(sched, j)["tasks"]] == ["queued"] * 3
    assert sched.acquire(w2) is None
    w3 = add_worker(sched, "w3", gpus=1)
    a3 = sched.acquire(w3)
    assert a3 is None or a3["job_id"] != j  # w1 is busy: still two free workers
    assert [t["state"] for t in state_of(sched, j)["tasks"]] == ["queued"] * 3
    hb_single = sched.acquire(w1)
    sched.start(w1, hb_single["task_id"], 1)
    finish(sched, w1, hb_single["task_id"])
    ranks = sched.acquire(w3)
    assert ranks["job_id"] == j and ranks["world_size"] == 3 and ranks["rank"] == 0
    assert {t["state"] for t in state_of(sched, j)["tasks"]} == {"assigned"}
    got = {ranks["rank"]} | {sched.acquire(w)["rank"] for w in (w1, w2)}
    assert got == {0, 1, 2}
    assert "gang_placed" in kinds(sched, j)


def test_competing_gangs_do_not_deadlock(sched):
    ws = [add_worker(sched, f"w{i}") for i in range(2)]
    g1 = sched.submit(job(nodes=2))
    g2 = sched.submit(job(nodes=2))
    a = [sched.acquire(w) for w in reversed(ws)]
    assert {x["job_id"] for x in a} == {g1}
    for w, x in zip(reversed(ws), a):
        sched.start(w, x["task_id"], 1)
    assert all(sched.acquire(w) is None for w in ws)
    for w, x in zip(reversed(ws), a):
        finish(sched, w, x["task_id"])
    assert state_of(sched, g1)["state"] == "succeeded"
    b = [sched.acquire(w) for w in ws]
    assert {x["job_id"] for x in b} == {g2}


def test_gang_that_cannot_fit_does_not_block_a_smaller_one(sched):
    ws = [add_worker(sched, f"w{i}") for i in range(2)]
    big = sched.submit(job(nodes=3))
    small = sched.submit(job(nodes=2))
    got = {sched.acquire(w)["job_id"] for w in ws}
    assert got == {small}
    assert state_of(sched, big)["state"] == "queued"


def test_gang_rank_failure_stops_all(sched):
    ws = [add_worker(sched, f"w{i}") for i in range(3)]
    g = sched.submit(job(nodes=3))
    held = {w: take(sched, w) for w in ws}
    w0 = ws[0]
    assert finish(sched, w0, held[w0]["task_id"], outcome="failed", exit_code=1)
    assert state_of(sched, g)["state"] == "failed"
    for w in ws[1:]:
        assert hb(sched, w, held[w]["task_id"])["cancel_task_ids"] == [held[w]["task_id"]]


def test_stale_gang_released_after_start_timeout(sched, clock, config):
    ws = [add_worker(sched, f"w{i}") for i in range(2)]
    g = sched.submit(job(nodes=2))
    a = take(sched, ws[0])  # rank placed on both; only one starts
    clock.advance(config.start_timeout_s / 2)
    for w in ws:
        hb(sched, w)
    assert sched.expire()["gangs_released"] == 0
    clock.advance(config.start_timeout_s / 2 + 1)
    for w in ws:
        hb(sched, w)
    assert sched.expire()["gangs_released"] == 1
    info = state_of(sched, g)
    assert info["state"] == "queued"
    assert all(t["state"] == "queued" and t["worker_id"] is None for t in info["tasks"])
    assert hb(sched, ws[0], a["task_id"])["cancel_task_ids"] == [a["task_id"]]
    with pytest.raises(TaskNotAssigned):
        sched.start(ws[0], a["task_id"], 1)
    assert "gang_released" in kinds(sched, g)
    assert {sched.acquire(w)["job_id"] for w in ws} == {g}


def test_rendezvous_ready_only_when_all_ranks_arrived(sched):
    ws = [add_worker(sched, f"w{i}") for i in range(3)]
    sched.submit(job(nodes=3))
    held = sorted((take(sched, w) | {"w": w} for w in ws), key=lambda a: a["rank"])
    r0 = sched.rendezvous(held[0]["w"], held[0]["task_id"], "10.0.0.1", 29500)
    assert r0["ready"] is False
    r2 = sched.rendezvous(held[2]["w"], held[2]["task_id"], "10.0.0.3", 29502)
    assert r2["ready"] is False
    r1 = sched.rendezvous(held[1]["w"], held[1]["task_id"], "10.0.0.2", 29501)
    assert r1["ready"] is True and r1["rank"] == 1 and r1["world_size"] == 3
    assert r1["master_addr"] == "10.0.0.1" and r1["master_port"] == 29500
    assert r1["peers"] == ["10.0.0.1:29500", "10.0.0.2:29501", "10.0.0.3:29502"]
    again = sched.rendezvous(held[0]["w"], held[0]["task_id"], "10.0.0.1", 29500)
    assert again["ready"] is True and again["rank"] == 0


# -- events ------------------------------------------------------------------

def test_every_state_change_has_its_event(sched, clock):
    w1, w2 = add_worker(sched, "w1", slots=3), add_worker(sched, "w2", slots=3)
    ok = sched.submit(job())
    lost = sched.submit(job(retry={"max_attempts": 2}))
    cancelled = sched.submit(job())
    take(sched, w1)
    b = take(sched, w2)
    assert finish(sched, w1, state_of(sched, ok)["tasks"][0]["task_id"])
    sched.cancel(cancelled)
    hb(sched, w1)
    clock.advance(10)
    hb(sched, w1)
    sched.expire()  # w2's task is lost, retried
    assert b["job_id"] == lost
    for t in task_rows(sched, ok) + task_rows(sched, lost) + task_rows(sched, cancelled):
        evs = sched.store.read(lambda c: c.execute("SELECT kind FROM events WHERE task_id = ?", (t["id"],)).fetchall())
        kinds_for = {e["kind"] for e in evs}
        if t["assigned_at"] is not None:
            assert "task_assigned" in kinds_for, t
        if t["started_at"] is not None:
            assert "task_started" in kinds_for, t
        if t["state"] in ("succeeded", "failed"):
            assert "task_finished" in kinds_for, t
        if t["state"] == "lost":
            assert "task_lost" in kinds_for, t
        if t["state"] == "cancelled":
            assert kinds_for & {"task_cancelled", "task_stopped", "task_finished"}, t
    for j in (ok, lost, cancelled):
        info = state_of(sched, j)
        finished = [e for e in events_of(sched, j) if e["kind"] == "job_finished"]
        assert len(finished) == (1 if info["finished_at"] else 0)
        if finished:
            assert finished[0]["at"] == info["finished_at"] and finished[0]["data"]["state"] == info["state"]


def test_event_and_change_share_one_transaction(sched, clock):
    """A transaction that fails after writing its event leaves neither the change nor the event."""
    j = sched.submit(job())
    before = count(sched, "events")

    def half(conn):
        conn.execute("UPDATE jobs SET state = 'running' WHERE id = ?", (j,))
        events_mod.record(conn, clock(), "job_poked", job_id=j)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        sched.store.write(half)
    assert count(sched, "events") == before
    assert state_of(sched, j)["state"] == "queued"
    # the writer keeps serving after a failed function
    assert sched.submit(job()) == j + 1


def test_event_data_is_json(sched):
    w = add_worker(sched)
    sched.submit(job(name="named"))
    take(sched, w)
    for e in sched.store.read(lambda c: c.execute("SELECT data FROM events").fetchall()):
        assert isinstance(json.loads(e["data"]), dict)
