"""The state machines in the schema: task_transitions (job_transitions) lists the allowed changes of
tasks.state (jobs.state) and the trigger tasks_transition (jobs_transition) refuses any other (issue 37)."""
from __future__ import annotations

import re

import apsw
import pytest

from gpulayer.server.store import db
from gpulayer.server.store.queries import QUERIES

STATES = ("queued", "assigned", "running", "succeeded", "failed", "cancelled", "lost")

# Which named query makes which allowed change (read from the queries' SET state and WHERE state; the
# `:state` ones from their callers: finish_task with lifecycle.OUTCOMES' states and `lost`,
# stop_attempt_tasks and detach_running_tasks with `cancelled`). A row no query makes fails the test.
MADE_BY = {
    ("queued", "assigned"): {"acquire_task", "acquire_one", "assign_task", "lease_ahead"},
    ("queued", "cancelled"): {"cancel_element", "cancel_queued_batch", "stop_attempt_tasks", "detach_running_tasks",
                           "drain_queued_task"},
    ("assigned", "queued"): {"requeue_never_started", "requeue_ahead", "requeue_ahead_expired", "requeue_preempted",
                             "requeue_drained_task", "release_attempt"},
    ("assigned", "running"): {"start_task"},
    ("assigned", "succeeded"): {"finish_task"},
    ("assigned", "failed"): {"finish_task"},
    ("assigned", "cancelled"): {"finish_task", "cancel_element", "cancel_queued_batch", "stop_attempt_tasks",
                                "detach_running_tasks"},
    ("assigned", "lost"): {"finish_task", "expire_task_leases", "worker_tasks_lost"},
    ("running", "queued"): {"requeue_preempted", "requeue_drained_task", "release_attempt"},
    ("running", "succeeded"): {"finish_task"},
    ("running", "failed"): {"finish_task"},
    ("running", "cancelled"): {"finish_task", "detach_running_tasks"},
    ("running", "lost"): {"finish_task", "lose_unreported_task", "expire_task_leases", "worker_tasks_lost"},
}

JOB_STATES = ("queued", "running", "succeeded", "failed", "cancelled", "lost", "waiting")
ENDS = ("succeeded", "failed", "cancelled", "lost")
# finish_job's rows: what its WHERE admits (queued, running or waiting to any end, by outcomes.finish).
JOB_MADE_BY = {
    ("queued", "waiting"): {"hold_job"},
    ("queued", "running"): {"mark_job_running", "mark_jobs_running"},
    ("running", "queued"): {"requeue_job_if_idle", "requeue_job", "next_attempt"},
    ("waiting", "queued"): {"release_job"},
    **{(old, end): {"finish_job"} for old in ("queued", "running", "waiting") for end in ENDS},
    **{(end, "queued"): {"reopen_job"} for end in ENDS},
}


@pytest.fixture
def conn(tmp_path):
    c = db.connect(tmp_path / "state.db")
    db.ensure_schema(c)
    c.execute("INSERT INTO workers (id, name, cpus, memory_mb, registered_at, last_seen_at, lease_expires_at) "
              "VALUES (1, 'w', 8, 16000, 1, 1, 100)")
    c.execute("INSERT INTO jobs (id, spec, created_at) VALUES (1, '{}', 1)")
    yield c
    c.close()


def _task(conn, state: str) -> int:
    active = state in ("assigned", "running")
    conn.execute("INSERT INTO tasks (job_id, state, worker_id, lease_expires_at, created_at, finished_at) "
                 "VALUES (1, ?, ?, ?, 1, ?)",
                 (state, 1 if active else None, 100 if active else None, None if active or state == "queued" else 2))
    return conn.last_insert_rowid()


def _set(conn, task_id: int, state: str) -> None:
    active = state in ("assigned", "running")
    conn.execute("UPDATE tasks SET state = ?, worker_id = ?, lease_expires_at = ?, finished_at = ? WHERE id = ?",
                 (state, 1 if active else None, 100 if active else None,
                  None if active or state == "queued" else 2, task_id))


def _allowed(conn) -> set[tuple[str, str]]:
    return {(r["from_state"], r["to_state"]) for r in conn.execute("SELECT from_state, to_state FROM task_transitions")}


def test_a_forbidden_transition_fails_loudly_and_changes_nothing(conn):
    task_id = _task(conn, "succeeded")
    with pytest.raises(apsw.ConstraintError, match=r"task_transition: succeeded -> running"):
        _set(conn, task_id, "running")
    assert conn.execute("SELECT state, worker_id, finished_at FROM tasks WHERE id = ?", (task_id,)).fetchall() == \
        [{"state": "succeeded", "worker_id": None, "finished_at": 2.0}]


def test_every_pair_passes_exactly_when_listed(conn):
    allowed = _allowed(conn)
    for old in STATES:
        for new in STATES:
            task_id = _task(conn, old)
            if old == new or (old, new) in allowed:
                _set(conn, task_id, new)
                assert conn.execute("SELECT state FROM tasks WHERE id = ?", (task_id,)).fetchall() == [{"state": new}]
            else:
                with pytest.raises(apsw.ConstraintError, match=f"task_transition: {old} -> {new}$"):
                    _set(conn, task_id, new)
                assert conn.execute("SELECT state FROM tasks WHERE id = ?", (task_id,)).fetchall() == [{"state": old}]


def _sets_state(name: str) -> bool:
    return bool(re.search(r"UPDATE tasks\s+SET\s+(?:[^;]*?,\s*)?state\s*=", QUERIES[name], re.S))


def test_every_allowed_row_is_made_by_a_named_query(conn):
    """Each row of task_transitions has an operation that makes it; each query that sets tasks.state
    makes some row. A row no query makes (or a query missing here) fails, so the table stays true."""
    rows = conn.execute("SELECT from_state, to_state, made_by FROM task_transitions").fetchall()
    assert {(r["from_state"], r["to_state"]) for r in rows} == set(MADE_BY)
    for old, new, made_by in ((r["from_state"], r["to_state"], r["made_by"]) for r in rows):
        named = set(re.findall(r"[a-z_]+(?= |,|$)", re.sub(r"\([^)]*\)", "", made_by)))
        assert named == MADE_BY[(old, new)], (old, new)
        for name in named:
            assert name in QUERIES and _sets_state(name), name
    setters = {name for name in QUERIES if "UPDATE tasks" in QUERIES[name] and _sets_state(name)}
    assert setters == set().union(*MADE_BY.values())


def _job(conn, state: str) -> int:
    conn.execute("INSERT INTO jobs (spec, state, created_at, finished_at) VALUES ('{}', ?, 1, ?)",
                 (state, 2 if state in ENDS else None))
    return conn.last_insert_rowid()


def _set_job(conn, job_id: int, state: str) -> None:
    conn.execute("UPDATE jobs SET state = ?, finished_at = ? WHERE id = ?", (state, 2 if state in ENDS else None, job_id))


def test_a_forbidden_job_transition_fails_loudly_and_changes_nothing(conn):
    job_id = _job(conn, "waiting")
    with pytest.raises(apsw.ConstraintError, match=r"job_transition: waiting -> running$"):
        _set_job(conn, job_id, "running")
    assert conn.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchall() == [{"state": "waiting"}]


def test_every_job_pair_passes_exactly_when_listed(conn):
    allowed = {(r["from_state"], r["to_state"]) for r in conn.execute("SELECT from_state, to_state FROM job_transitions")}
    assert allowed == set(JOB_MADE_BY)
    for old in JOB_STATES:
        for new in JOB_STATES:
            job_id = _job(conn, old)
            if old == new or (old, new) in allowed:
                _set_job(conn, job_id, new)
            else:
                with pytest.raises(apsw.ConstraintError, match=f"job_transition: {old} -> {new}$"):
                    _set_job(conn, job_id, new)
            expected = new if old == new or (old, new) in allowed else old
            assert conn.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchall() == [{"state": expected}]


def test_every_allowed_job_row_is_made_by_a_named_query(conn):
    rows = conn.execute("SELECT from_state, to_state, made_by FROM job_transitions").fetchall()
    for r in rows:
        named = set(re.findall(r"[a-z_]+(?= |,|$)", re.sub(r"\([^)]*\)", "", r["made_by"])))
        assert named == JOB_MADE_BY[(r["from_state"], r["to_state"])], r
        for name in named:
            assert name in QUERIES and _sets_job_state(name), name
    setters = {name for name in QUERIES if _sets_job_state(name)}
    assert setters == set().union(*JOB_MADE_BY.values())


def _sets_job_state(name: str) -> bool:
    return bool(re.search(r"UPDATE jobs\s+SET\s+(?:[^;]*?,\s*)?state\s*=", QUERIES[name], re.S))
