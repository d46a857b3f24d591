"""Every state change of a job, task or worker comes with its event, in the same call.

Events are written by the code that makes each change (not by triggers, see
docs/architecture.md). This test runs scenarios through the scheduler on a
real state file with a pinned clock, snapshots the state columns around every
call, and fails on a row whose state changed with no event of an allowed kind
naming it among the events that call appended.
"""
from __future__ import annotations

import pytest

from helpers import SERVER_JOIN, job

# (table, new state): the event kinds that may record it. A job-level kind names a task by its job.
ALLOWED = {
    ("tasks", "assigned"): {"task_assigned"},
    ("tasks", "running"): {"task_started"},
    ("tasks", "succeeded"): {"task_finished"},
    ("tasks", "failed"): {"task_finished", "task_stopped"},
    ("tasks", "cancelled"): {"task_cancelled", "task_finished", "task_stopped", "elements_cancelled",
                             "replica_drained"},
    ("tasks", "lost"): {"task_lost", "task_stopped"},
    ("tasks", "queued"): {"job_submitted", "job_retried", "replica_replaced", "task_requeued", "gang_released",
                          "element_retried", "replica_surged"},
    ("jobs", "running"): {"task_assigned"},
    ("jobs", "queued"): {"job_submitted", "job_retried", "gang_released", "task_requeued", "job_released"},
    ("jobs", "waiting"): {"job_submitted"},
    ("jobs", "succeeded"): {"job_finished"},
    ("jobs", "failed"): {"job_finished"},
    ("jobs", "cancelled"): {"job_finished"},
    ("jobs", "lost"): {"job_finished"},
    ("workers", "online"): {"worker_registered", "worker_online"},
    ("workers", "offline"): {"worker_offline"},
    ("workers", "gone"): {"worker_gone"},
}
# (elements_cancelled: one event for a batch of an array's elements, issue 22)
JOB_LEVEL = {"job_submitted", "job_retried", "replica_replaced", "gang_released", "element_retried",
             "elements_cancelled"}


def _states(store) -> dict:
    def read(conn):
        found = {}
        for table, cols in (("jobs", "id, state, NULL AS job_id"), ("tasks", "id, state, job_id"),
                            ("workers", "id, state, NULL AS job_id")):
            for r in conn.execute(f"SELECT {cols} FROM {table}").fetchall():
                found[(table, r["id"])] = (r["state"], r["job_id"])
        return found
    return store.read(read)


def _events_after(store, seq: int) -> list[dict]:
    return store.read(lambda conn: conn.execute("SELECT * FROM events WHERE seq > ? ORDER BY seq", (seq,)).fetchall())


def _names(event: dict, table: str, row_id: int, job_id: int | None) -> bool:
    if table == "jobs":
        return event["job_id"] == row_id
    if table == "workers":
        return event["worker_id"] == row_id
    return event["task_id"] == row_id or (event["kind"] in JOB_LEVEL and event["job_id"] == job_id)


class Checked:
    """The scheduler, with every call checked: each state change has its event."""

    def __init__(self, sched):
        self.sched, self.changes = sched, set()

    def __getattr__(self, name):
        method = getattr(self.sched, name)

        def call(*args, **kwargs):
            before = _states(self.sched.store)
            seq = self.sched.store.read(lambda c: c.execute("SELECT coalesce(max(seq), 0) AS s FROM events")
                                        .fetchall()[0]["s"])
            result = method(*args, **kwargs)
            appended = _events_after(self.sched.store, seq)
            for key, (state, job_id) in _states(self.sched.store).items():
                if before.get(key, (None,))[0] == state:
                    continue
                table, row_id = key
                kinds = ALLOWED.get((table, state), set())
                assert any(e["kind"] in kinds and _names(e, table, row_id, job_id) for e in appended), (
                    f"{name}: {table} {row_id} became {state} with no event of {sorted(kinds)}; "
                    f"events: {[(e['kind'], e['job_id'], e['task_id'], e['worker_id']) for e in appended]}")
                self.changes.add((table, state))
            return result
        return call


@pytest.fixture
def checked(sched):
    return Checked(sched)


def _worker(checked, name, **kw):
    return checked.register(body={"name": name, "labels": {}, "slots": kw.pop("slots", 1), "version": "test",
                                  "resources": {"cpus": 8, "gpus": kw.pop("gpus", 0), "memory_mb": 16000,
                                                "gpu_models": []}},
                            token=SERVER_JOIN, session_hash=f"hash-{name}",
                            peer_address="127.0.0.1")["worker_id"]


def _finish(checked, w, task_id, code):
    return checked.finish(w, task_id, exit_code=code, outcome="succeeded" if code == 0 else "failed",
                          outputs={}, reason=None)


def test_every_state_change_has_its_event(checked, clock, config):
    w = _worker(checked, "a")
    # a job that succeeds; one that fails, is retried, then succeeds
    ok = checked.submit(job())
    t = checked.acquire(w)
    checked.start(w, t["task_id"], 1)
    _finish(checked, w, t["task_id"], 0)
    retried = checked.submit(job(retry={"max_attempts": 2, "retry_on": ["failed"]}))
    t = checked.acquire(w)
    checked.start(w, t["task_id"], 1)
    _finish(checked, w, t["task_id"], 3)
    t = checked.acquire(w)
    checked.start(w, t["task_id"], 1)
    _finish(checked, w, t["task_id"], 1)
    # cancelled while queued, and while running
    checked.cancel(checked.submit(job()))
    running = checked.submit(job())
    t = checked.acquire(w)
    checked.start(w, t["task_id"], 1)
    checked.cancel(running)
    checked.finish(w, t["task_id"], exit_code=-15, outcome="cancelled", outputs={}, reason="cancelled")
    # a lease that runs out: the task is lost, the worker offline, then back
    lost = checked.submit(job())
    t = checked.acquire(w)
    checked.start(w, t["task_id"], 1)
    clock.advance(config.lease_ttl_s + 1)
    checked.expire()
    checked.heartbeat(w, [])
    # a gang whose second rank is never started goes back to the queue
    b = _worker(checked, "b")
    checked.heartbeat(w, [])
    gang = checked.submit(job(nodes=2))
    first = checked.acquire(w)
    checked.start(w, first["task_id"], 1)
    clock.advance(config.start_timeout_s + 0.5)
    checked.heartbeat(w, [{"task_id": first["task_id"], "state": "running", "endpoint": None, "restarts": 0}])
    checked.heartbeat(b, [])
    checked.expire()
    # a worker that leaves with an assigned task: the task goes back, the worker is gone
    left = checked.submit(job())
    checked.acquire(b)
    checked.deregister(b)
    assert {ok, retried, lost, gang, left}
    assert checked.changes >= {("tasks", s) for s in ("assigned", "running", "succeeded", "failed", "cancelled",
                                                       "lost", "queued")}
    assert checked.changes >= {("jobs", s) for s in ("running", "queued", "succeeded", "failed", "cancelled", "lost")}
    assert checked.changes >= {("workers", s) for s in ("online", "offline", "gone")}


def test_arrays_and_dependencies_have_their_events(checked):
    w = _worker(checked, "arrays", slots=2)
    first = checked.submit(job())
    # an array that waits for `first`, capped at 1, one element retried once
    array = checked.submit(job(array="0-2%1", after=[first], retry={"max_attempts": 2, "retry_on": ["failed"]}))
    chained = checked.submit(job(after=[array]))
    doomed = checked.submit(job(after=[f"{first}:notok"]))
    t = checked.acquire(w)
    checked.start(w, t["task_id"], 1)
    _finish(checked, w, t["task_id"], 0)  # first succeeds: the array is released, `doomed` cancelled
    codes = iter([4, 0, 0, 0, 0])
    while (t := checked.acquire(w)) is not None:
        checked.start(w, t["task_id"], 1)
        _finish(checked, w, t["task_id"], next(codes))
    cancelled = checked.submit(job(array="0-3%2"))
    checked.cancel(cancelled, 3)
    checked.cancel(cancelled)
    assert {doomed, chained}
    assert checked.changes >= {("jobs", "waiting"), ("jobs", "queued"), ("jobs", "succeeded"), ("jobs", "cancelled"),
                               ("tasks", "queued"), ("tasks", "cancelled")}


def test_a_rolling_update_and_its_rollback_have_their_events(checked):
    from gpulayer.server.scheduler.rollout import Update
    a, b = _worker(checked, "roll-a"), _worker(checked, "roll-b")
    service = checked.submit(job(service={"replicas": 1}))
    t = checked.acquire(a)
    checked.start(a, t["task_id"], 1)
    checked.heartbeat(a, [{"task_id": t["task_id"], "state": "running", "endpoint": "h:1", "restarts": 0}])
    checked.update_service(service, Update(changes={"env": {"V": "2"}}))   # a replica of revision 2 queued
    checked.rollback_service(service)                                      # and drained while queued
    checked.update_service(service, Update(changes={"env": {"V": "3"}}))
    new = checked.acquire(b)
    checked.start(b, new["task_id"], 1)
    checked.heartbeat(b, [{"task_id": new["task_id"], "state": "running", "endpoint": "h:1", "restarts": 0}])
    checked.advance_rollouts()                                             # the old replica drains
    assert ("tasks", "queued") in checked.changes and ("tasks", "cancelled") in checked.changes
