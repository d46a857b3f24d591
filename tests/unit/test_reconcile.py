"""Reconciliation of heartbeats with a state file that may be behind the workers (scheduler/reconcile.py)."""
from __future__ import annotations

import pytest
from helpers import add_worker, events_of, job, state_of

from gpulayer.server.errors import TaskNotAssigned
from gpulayer.server.scheduler.reconcile import Restored


def entry(task_id: int, **echo) -> dict:
    return {"task_id": task_id, "state": "running", "endpoint": None, "restarts": 0, **echo}


def restored(sched, *, watermark: int, pause_s: float = 0.0, hold_s: float = 60.0, awaiting=(),
             rules_s: float = 600.0) -> Restored:
    now = sched.clock()
    sched.restored = Restored(watermark=watermark, started_at=now, pause_until=now + pause_s, hold_s=hold_s,
                              awaiting=set(awaiting), ends_at=now + rules_s, clock=sched.clock)
    return sched.restored


def task_row(sched, task_id: int) -> dict:
    return sched.store.read(lambda c: c.execute("SELECT * FROM tasks WHERE id = ?", (task_id,)).fetchall()[0])


def kinds(sched, job_id: int) -> list[tuple[str, dict]]:
    return [(e["kind"], e["data"]) for e in events_of(sched, job_id)]


def test_a_reported_task_assigned_to_its_worker_is_marked_running_after_a_restore(sched):
    w = add_worker(sched)
    sched.submit(job())
    task = sched.acquire(w)
    sched.heartbeat(w, [entry(task["task_id"])])
    assert task_row(sched, task["task_id"])["state"] == "assigned"  # not restored: only `start` marks it
    restored(sched, watermark=task["task_id"])
    answer = sched.heartbeat(w, [entry(task["task_id"])])
    assert answer["cancel_task_ids"] == []
    assert task_row(sched, task["task_id"])["state"] == "running"
    assert ("task_started", {"reported": True}) in kinds(sched, task["job_id"])
    sched.start(w, task["task_id"], 42)  # the start call arriving later is harmless
    assert task_row(sched, task["task_id"])["pid"] == 42


def test_after_a_restore_a_queued_task_the_worker_runs_is_adopted(sched):
    w = add_worker(sched)
    job_id = sched.submit(job())
    task_id = state_of(sched, job_id)["tasks"][0]["task_id"]
    restored(sched, watermark=task_id)
    answer = sched.heartbeat(w, [entry(task_id, job_id=job_id, attempt=1, gpus=[])])
    assert answer["cancel_task_ids"] == []
    row = task_row(sched, task_id)
    assert (row["state"], row["worker_id"]) == ("running", w)
    assert state_of(sched, job_id)["state"] == "running"
    assert ("task_assigned", {"attempt": 1, "reason": "reconciled"}) in kinds(sched, job_id)


def test_a_task_made_after_the_restore_is_not_adopted_and_holds_placement_while_reported(sched, clock):
    w, other = add_worker(sched, "w"), add_worker(sched, "other")
    job_id = sched.submit(job())
    task_id = state_of(sched, job_id)["tasks"][0]["task_id"]
    held = restored(sched, watermark=task_id - 1, hold_s=0.3)  # this id was reused after the restore
    answer = sched.heartbeat(w, [entry(task_id, job_id=job_id, attempt=1)])
    assert answer["cancel_task_ids"] == [task_id]
    assert task_row(sched, task_id)["state"] == "queued"
    assert sched.acquire(other) is None  # w still runs its copy: nobody gets anything meanwhile
    sched.heartbeat(w, [])               # w stopped it
    clock.advance(0.35)
    assert not held.paused()
    assert sched.acquire(other)["task_id"] == task_id


def test_a_mismatched_attempt_or_job_is_not_adopted(sched):
    w = add_worker(sched)
    job_id = sched.submit(job())
    task_id = state_of(sched, job_id)["tasks"][0]["task_id"]
    restored(sched, watermark=task_id)
    assert sched.heartbeat(w, [entry(task_id, job_id=job_id + 1, attempt=1)])["cancel_task_ids"] == [task_id]
    assert sched.heartbeat(w, [entry(task_id, job_id=job_id, attempt=2)])["cancel_task_ids"] == [task_id]
    assert task_row(sched, task_id)["state"] == "queued"


def test_gpus_are_adopted_as_reported_and_never_twice(sched):
    w = add_worker(sched, gpus=2, slots=2)
    first, second = sched.submit(job(gpus=1)), sched.submit(job(gpus=1))
    t1, t2 = (state_of(sched, j)["tasks"][0]["task_id"] for j in (first, second))
    restored(sched, watermark=t2)
    assert sched.heartbeat(w, [entry(t1, gpus=[1])])["cancel_task_ids"] == []
    assert task_row(sched, t1)["gpu_indices"] == "[1]"
    assert sched.heartbeat(w, [entry(t1, gpus=[1]), entry(t2, gpus=[1])])["cancel_task_ids"] == [t2]
    assert sched.heartbeat(w, [entry(t1, gpus=[1]), entry(t2)])["cancel_task_ids"] == [t2]  # no indices sent


def test_a_task_running_before_the_restore_that_the_worker_no_longer_reports_is_lost_and_retried(sched, clock):
    w = add_worker(sched)
    job_id = sched.submit(job(retry={"max_attempts": 2}))
    task = sched.acquire(w)
    sched.start(w, task["task_id"], 7)
    clock.advance(1)
    restored(sched, watermark=task["task_id"])
    sched.heartbeat(w, [])  # its finish went to the lost window
    assert task_row(sched, task["task_id"])["state"] == "lost"
    view = state_of(sched, job_id)
    assert view["state"] == "queued" and sorted(t["attempt"] for t in view["tasks"]) == [1, 2]


def test_a_task_started_after_the_restore_is_not_lost_for_a_heartbeat_sent_before_its_start(sched, clock):
    w = add_worker(sched)
    restored(sched, watermark=0)
    sched.submit(job())
    clock.advance(1)
    task = sched.acquire(w)
    sched.start(w, task["task_id"], 7)
    sched.heartbeat(w, [])
    assert task_row(sched, task["task_id"])["state"] == "running"


def test_nothing_is_assigned_until_every_worker_online_in_the_restored_state_reported(sched):
    early, late = add_worker(sched, "early"), add_worker(sched, "late")
    job_id = sched.submit(job())
    task_id = state_of(sched, job_id)["tasks"][0]["task_id"]  # `late` acquired it in the lost window
    held = restored(sched, watermark=task_id, pause_s=60, awaiting={early, late})
    sched.heartbeat(early, [])
    assert held.paused() and sched.acquire(early) is None  # `late` (its DNS cache, a hung connect) not yet heard
    answer = sched.heartbeat(late, [entry(task_id, job_id=job_id, attempt=1)])
    assert answer["cancel_task_ids"] == []
    assert not held.paused()
    row = task_row(sched, task_id)
    assert (row["state"], row["worker_id"]) == ("running", late)  # adopted, never handed to `early`
    assert sched.acquire(early) is None


def test_the_pause_for_a_worker_that_never_reports_ends_with_its_lease(sched, clock):
    w, silent = add_worker(sched, "w"), add_worker(sched, "silent")
    sched.submit(job())
    held = restored(sched, watermark=0, pause_s=0.3, awaiting={w, silent})
    sched.heartbeat(w, [])
    assert sched.acquire(w) is None
    clock.advance(0.35)
    assert not held.paused() and sched.acquire(w) is not None


def test_the_first_start_waits_at_most_one_lease_ttl_and_the_rules_end_two_ttls_after_it(clock):
    marker = {"max_task_id": 7}
    started = clock.now
    first = Restored.after_restore(marker, clock, heartbeat_interval_s=2, lease_ttl_s=20, online_workers={1, 2})
    assert first.awaiting == {1, 2} and first.watermark == 7 and first.started_at == started
    assert (first.pause_until, first.ends_at) == (started + 20, started + 40)
    clock.advance(19.9)
    assert first.paused() and first.describe()["pause_ends_in_s"] == 0.1
    clock.advance(0.2)
    assert not first.paused() and first.active()   # workers still awaited: the pause ended all the same
    clock.advance(20)
    assert not first.active()
    clock.now = started + 30
    again = Restored.after_restore({**marker, "first_started_at": started}, clock, heartbeat_interval_s=2,
                                   lease_ttl_s=20, online_workers={1, 2})
    assert again.awaiting == set() and not again.paused()   # a restart has no pause
    assert again.ends_at == started + 40                      # only what is left of the rules' time
    clock.now = started + 41
    assert Restored.after_restore({**marker, "first_started_at": started}, clock, heartbeat_interval_s=2,
                                  lease_ttl_s=20, online_workers={1}) is None


def test_once_the_rules_time_is_over_a_report_neither_adopts_nor_holds(sched, clock):
    w, other = add_worker(sched, "w"), add_worker(sched, "other")
    job_id = sched.submit(job())
    task_id = state_of(sched, job_id)["tasks"][0]["task_id"]
    held = restored(sched, watermark=task_id - 1, rules_s=0.3)  # a reused id: held while reported...
    assert sched.heartbeat(w, [entry(task_id)])["cancel_task_ids"] == [task_id]
    assert held.paused()
    clock.advance(0.35)
    assert sched.heartbeat(w, [entry(task_id)])["cancel_task_ids"] == [task_id]  # ...but not past the cap
    assert not held.paused() and not held.active()
    assert sched.acquire(other)["task_id"] == task_id


def test_a_finish_or_start_before_the_first_heartbeat_adopts_the_queued_task(sched):
    w = add_worker(sched, slots=2)
    done_job, started_job = sched.submit(job()), sched.submit(job())
    done_task, started_task = (state_of(sched, j)["tasks"][0]["task_id"] for j in (done_job, started_job))
    restored(sched, watermark=started_task)
    # its finish was retried through the outage and arrives first: the result is kept, not refused
    assert sched.finish(w, done_task, exit_code=0, outcome="succeeded", outputs={}, reason=None) is True
    assert state_of(sched, done_job)["state"] == "succeeded"
    sched.start(w, started_task, 11)  # a start retried through the outage: accepted, the task runs on
    row = task_row(sched, started_task)
    assert (row["state"], row["worker_id"], row["pid"]) == ("running", w, 11)


def test_a_call_for_a_task_made_after_the_restore_is_still_refused(sched):
    w = add_worker(sched)
    job_id = sched.submit(job())
    task_id = state_of(sched, job_id)["tasks"][0]["task_id"]
    restored(sched, watermark=task_id - 1)
    with pytest.raises(TaskNotAssigned):
        sched.start(w, task_id, 5)
    assert task_row(sched, task_id)["state"] == "queued"


def test_health_shows_the_pause_the_workers_it_awaits_and_the_held_tasks(sched):
    from gpulayer.server.http.resources import Health

    class Answer:
        status, media = "200 OK", None

    def health() -> dict:
        answer = Answer()
        Health(type("Deps", (), {"store": sched.store, "scheduler": sched, "replication": None})()).on_get(None,
                                                                                                           answer)
        return answer.media

    assert "reconcile" not in health()   # not restored
    early, late = add_worker(sched, "early"), add_worker(sched, "late")
    held = restored(sched, watermark=5, pause_s=60, awaiting={early, late})
    sched.heartbeat(early, [])
    shown = health()["reconcile"]
    assert shown["paused"] and shown["awaiting_workers"] == [late] and shown["held_task_ids"] == []
    assert shown["pause_ends_in_s"] == 60 and shown["watermark_task_id"] == 5   # the clock is pinned
    sched.heartbeat(late, [entry(999)])   # a task of the lost window this state never heard of: held
    shown = health()["reconcile"]
    assert shown["paused"] and shown["awaiting_workers"] == [] and shown["held_task_ids"] == [999]
    held.held.clear()
    assert health()["reconcile"]["paused"] is False
    held.ends_at = sched.clock() - 1   # the rules' time is over: health says nothing of them
    assert "reconcile" not in health()
