"""A finish that carries its task's start (`pid`): the start's work, then the finish, in one transaction."""
from __future__ import annotations

import pytest

from gpulayer.server.errors import TaskNotAssigned
from helpers import add_worker, events_of, job, state_of


def finish(sched, w, task_id, outcome="succeeded", exit_code=0, pid=None):
    return sched.finish(w, task_id, exit_code=exit_code, outcome=outcome, outputs={}, reason=None, pid=pid)


def kinds(sched, job_id):
    return [e["kind"] for e in events_of(sched, job_id)]


def task_row(sched, task_id):
    return sched.store.read(lambda c: c.execute("SELECT * FROM tasks WHERE id = ?", (task_id,)).fetchall()[0])


def usage_rows(sched, task_id):
    return sched.store.read(lambda c: c.execute("SELECT * FROM usage WHERE task_id = ?", (task_id,)).fetchall())


def test_finish_of_an_assigned_task_with_pid_starts_it_first(sched, clock):
    w = add_worker(sched)
    j = sched.submit(job())
    a = sched.acquire(w)
    assert task_row(sched, a["task_id"])["state"] == "assigned"
    clock.advance(1)
    assert finish(sched, w, a["task_id"], pid=4711) is True
    k = kinds(sched, j)
    assert k[k.index("task_started"):] == ["task_started", "task_finished", "job_finished"]
    started = next(e for e in events_of(sched, j) if e["kind"] == "task_started")
    assert started["task_id"] == a["task_id"] and started["data"]["pid"] == 4711
    task = task_row(sched, a["task_id"])
    assert task["state"] == "succeeded" and task["pid"] == 4711
    assert task["started_at"] is not None and task["finished_at"] >= task["started_at"]
    used = usage_rows(sched, a["task_id"])
    assert len(used) == 1 and used[0]["outcome"] == "succeeded"
    assert state_of(sched, j)["state"] == "succeeded"
    assert sched.acquire(w) is None  # no longer handed out as assigned-not-started


def test_failed_finish_with_pid_is_judged_as_a_run(sched, clock):
    w = add_worker(sched)
    j = sched.submit(job(["false"]))
    a = sched.acquire(w)
    assert finish(sched, w, a["task_id"], outcome="failed", exit_code=1, pid=99) is True
    assert state_of(sched, j)["state"] == "failed"
    assert usage_rows(sched, a["task_id"])[0]["outcome"] == "failed"


def test_finish_without_pid_is_unchanged(sched, clock):
    w = add_worker(sched)
    j = sched.submit(job())
    a = sched.acquire(w)
    assert finish(sched, w, a["task_id"]) is True
    assert "task_started" not in kinds(sched, j)
    task = task_row(sched, a["task_id"])
    assert task["state"] == "succeeded" and task["started_at"] is None and task["pid"] is None
    assert usage_rows(sched, a["task_id"]) == []  # a task that never started ran nothing
    assert state_of(sched, j)["state"] == "succeeded"


def test_pid_on_a_started_task_changes_nothing_of_its_start(sched, clock):
    w = add_worker(sched)
    j = sched.submit(job())
    a = sched.acquire(w)
    sched.start(w, a["task_id"], 100)
    started_at = task_row(sched, a["task_id"])["started_at"]
    clock.advance(2)
    assert finish(sched, w, a["task_id"], pid=200) is True
    assert kinds(sched, j).count("task_started") == 1
    task = task_row(sched, a["task_id"])
    assert task["pid"] == 100 and task["started_at"] == started_at and task["state"] == "succeeded"


def test_finish_with_pid_of_a_task_cancelled_before_start_is_late(sched, clock):
    w = add_worker(sched)
    j = sched.submit(job())
    a = sched.acquire(w)
    sched.cancel(j)  # an assigned task ends cancelled at once
    assert finish(sched, w, a["task_id"], pid=5) is False
    k = kinds(sched, j)
    assert "task_started" not in k and k[-1] == "late_finish"
    assert task_row(sched, a["task_id"])["state"] == "cancelled"
    assert usage_rows(sched, a["task_id"]) == []


def test_finish_with_pid_of_a_task_asked_to_stop_before_start_is_refused_whole(sched, clock):
    """As its start would have been (409): nothing of the finish is written, its lines included."""
    w = add_worker(sched)
    j = sched.submit(job())
    a = sched.acquire(w)
    sched.store.write(lambda c: c.execute("UPDATE tasks SET cancel_requested = 1 WHERE id = ?", (a["task_id"],)))
    with pytest.raises(TaskNotAssigned):
        sched.finish(w, a["task_id"], exit_code=0, outcome="succeeded", outputs={}, reason=None, pid=5,
                     lines=[{"n": 0, "stream": "stdout", "at": 1.0, "text": "hi"}])
    assert "task_started" not in kinds(sched, j)
    task = task_row(sched, a["task_id"])
    assert task["state"] == "assigned" and task["started_at"] is None
    assert sched.store.read(lambda c: c.execute("SELECT count(*) AS n FROM logs").fetchall()[0]["n"]) == 0


def test_finish_with_pid_of_another_workers_task_is_refused(sched, clock):
    w = add_worker(sched, "a")
    other = add_worker(sched, "b")
    sched.submit(job())
    a = sched.acquire(w)
    with pytest.raises(TaskNotAssigned):
        finish(sched, other, a["task_id"], pid=5)
    assert task_row(sched, a["task_id"])["state"] == "assigned"
