"""Issue 22 item 2: big cancels, cascades, releases and retention run in bounded writes, and a stop between
two of them leaves a state file that the next control plane finishes.

Real state files, a pinned clock; the bound is counted in rows changed per write (SQLite's own count,
triggers included), never in time.
"""
from __future__ import annotations

import pytest

from gpulayer.server.scheduler import cascades, jobs, lifecycle, outcomes, retention
from gpulayer.server.scheduler.core import Scheduler
from gpulayer.server.scheduler.spec import validate_job

from helpers import add_worker, job, state_of

# The steps here are a tenth of the server's (outcomes.BATCH task rows, outcomes.FANOUT jobs), and so are
# the arrays (20,000 elements at the server's sizes): each test takes as many steps of each kind as at full
# size, for a tenth of the rows written (the fast loop: docs/architecture.md, "Tests").
BATCH, FANOUT, PRUNE_BATCH = outcomes.BATCH // 10, outcomes.FANOUT // 10, retention.PRUNE_BATCH // 10
SIZE = 80 * BATCH
# One step ends or releases at most BATCH task rows; each such row changes a few more (task_queue, the
# shapes and queue_groups counters, the usage ledger) and the step writes a few events.
MOST_CHANGES_PER_WRITE = 6 * BATCH + 2 * FANOUT


@pytest.fixture(autouse=True)
def smaller_steps(monkeypatch):
    monkeypatch.setattr(outcomes, "BATCH", BATCH)
    monkeypatch.setattr(outcomes, "FANOUT", FANOUT)
    monkeypatch.setattr(retention, "PRUNE_BATCH", PRUNE_BATCH)


@pytest.fixture
def changes(store, monkeypatch):
    """The rows each write changed, in order (every write: the scheduler's, its cascade steps')."""
    found: list[int] = []
    real = store.write

    def counting(fn, *args, **kwargs):
        def counted(conn, *a, **kw):
            before = conn.total_changes()
            try:
                return fn(conn, *a, **kw)
            finally:
                found.append(conn.total_changes() - before)
        return real(counted, *args, **kwargs)

    monkeypatch.setattr(store, "write", counting)
    return found


def _count(store, sql: str, *params) -> int:
    return store.read(lambda conn: conn.execute(sql, params).fetchall()[0]["n"])


def _nowhere(**spec):
    return job(labels={"pool": "nowhere"}, **spec)  # no worker has the label: its tasks stay queued


def test_a_big_cancel_and_its_cascade_run_in_bounded_writes(sched, store, changes):
    root = sched.submit(_nowhere())
    waiting = [sched.submit(job(array=f"0-{SIZE - 1}", after=[root])) for _ in range(3)]
    queued = sched.submit(_nowhere(array=f"0-{SIZE - 1}"))
    changes.clear()
    assert sched.cancel(root) and sched.cancel(queued)
    assert state_of(sched, queued)["state"] == "cancelled"  # the cancel ran its own job's steps to the end
    sched.cascades.join(120)
    for job_id in waiting:
        view = state_of(sched, job_id)
        assert (view["state"], view["reason"]) == ("cancelled", "dependency_failed")
        assert view["array"]["counts"] == {"cancelled": SIZE}
    # 80,000 task rows changed, none of the writes more than a batch's worth (before: one write of all).
    assert sum(changes) >= 4 * SIZE and max(changes) <= MOST_CHANGES_PER_WRITE, max(changes)
    assert len(changes) >= 4 * SIZE // outcomes.BATCH
    # One event per batch of elements, not one per element.
    assert _count(store, "SELECT count(*) AS n FROM events WHERE kind = 'elements_cancelled'") == \
        4 * SIZE // outcomes.BATCH
    assert _count(store, "SELECT count(*) AS n FROM events WHERE kind = 'task_cancelled'") == 1  # the root's


def test_a_big_release_runs_in_bounded_writes(sched, store, changes):
    w = add_worker(sched, "w")
    root = sched.submit(job())
    held = [sched.submit(job(array=f"0-{SIZE - 1}", after=[root])) for _ in range(2)]
    capped = sched.submit(job(array=f"0-{SIZE - 1}%{SIZE // 2}", after=[root]))
    changes.clear()
    task = sched.acquire(w)
    sched.start(w, task["task_id"], 1)
    assert sched.finish(w, task["task_id"], exit_code=0, outcome="succeeded", outputs={}, reason=None)
    sched.cascades.join(120)
    assert max(changes) <= MOST_CHANGES_PER_WRITE, max(changes)
    released = "SELECT count(*) AS n FROM tasks WHERE job_id = ? AND state = 'queued' AND held = 0"
    assert [_count(store, released, j) for j in held] == [SIZE, SIZE]
    assert _count(store, released, capped) == SIZE // 2  # its %N cap holds


def _stopped_after_first_step(sched, fn, *args):
    """fn in one write whose follow-up steps are dropped: the state a stop between two steps leaves."""
    def write(conn):
        with cascades.collecting():
            return fn(conn, *args)
    return sched.store.write(write)


def test_a_restart_finishes_what_a_stop_between_steps_left(store, config, clock):
    first = Scheduler(store, config, clock)
    root = first.submit(_nowhere())
    waiting = [first.submit(job(array="0-999", after=[root])) for _ in range(2)]
    chain = first.submit(job(after=[waiting[0]]))
    big = first.submit(_nowhere(array=f"0-{SIZE - 1}"))
    _stopped_after_first_step(first, jobs.cancel, root, clock())
    _stopped_after_first_step(first, jobs.cancel, big, clock())
    # Consistent meanwhile: the big array is still running its cancel (its reason set), nothing is lost.
    assert state_of(first, root)["state"] == "cancelled"
    assert (state_of(first, big)["state"], state_of(first, big)["reason"]) == ("queued", "cancelled")
    assert [state_of(first, j)["state"] for j in waiting] == ["waiting", "waiting"]

    restarted = Scheduler(store, config, clock)  # a new control plane on the same state file
    assert restarted.resume_cascades() >= 2
    restarted.cascades.join(60)
    assert [state_of(restarted, j)["reason"] for j in (*waiting, chain)] == ["dependency_failed"] * 3
    assert state_of(restarted, big)["state"] == "cancelled"
    assert _count(store, "SELECT count(*) AS n FROM jobs WHERE finished_at IS NULL") == 0
    assert _count(store, "SELECT count(*) AS n FROM tasks WHERE finished_at IS NULL") == 0
    assert Scheduler(store, config, clock).resume_cascades() == 0  # nothing is left


def test_a_restart_finishes_a_release_a_stop_left(store, config, clock):
    first = Scheduler(store, config, clock)
    w = add_worker(first, "w")
    root = first.submit(job())
    big = first.submit(job(array=f"0-{SIZE - 1}", after=[root]))
    task = first.acquire(w)
    first.start(w, task["task_id"], 1)
    # The worker's finish of the root, its follow-up steps dropped.
    _stopped_after_first_step(first, lifecycle.finish, w, task["task_id"], 0, "succeeded", {}, None, clock())
    assert state_of(first, big)["state"] == "queued"
    held = "SELECT count(*) AS n FROM tasks WHERE job_id = ? AND held = 1"
    assert _count(store, held, big) == SIZE  # released, its elements not yet

    restarted = Scheduler(store, config, clock)
    assert restarted.resume_cascades() == 1
    restarted.cascades.join(60)
    assert _count(store, held, big) == 0


def test_retention_removes_a_big_array_in_bounded_writes(sched, store, clock, monkeypatch):
    big = sched.submit(_nowhere(array=f"0-{SIZE - 1}"))
    sched.cancel(big)
    clock.advance(40 * 86400.0)
    removed: list[int] = []
    real = store.write

    def counting(fn, *args, **kwargs):
        result = real(fn, *args, **kwargs)
        removed.append(len(result) if isinstance(result, list) else 0)
        return result

    monkeypatch.setattr(store, "write", counting)
    result = {"done": False}
    while not result["done"]:
        result = retention.prune(store, now=clock.now, log_retention_s=86400.0, job_retention_s=30 * 86400.0)
    assert _count(store, "SELECT count(*) AS n FROM jobs WHERE id = ?", big) == 0
    assert _count(store, "SELECT count(*) AS n FROM tasks WHERE job_id = ?", big) == 0
    assert max(removed) <= retention.PRUNE_BATCH and sum(removed) >= SIZE


def test_a_big_array_is_made_in_bounded_writes(sched, store, changes):
    changes.clear()
    big = sched.submit(_nowhere(array=f"0-{SIZE - 1}"))
    capped = sched.submit(_nowhere(array=f"0-{SIZE - 1}%100"))
    assert max(changes) <= MOST_CHANGES_PER_WRITE and len(changes) >= 2 * SIZE // outcomes.BATCH, max(changes)
    released = "SELECT count(*) AS n FROM tasks WHERE job_id = ? AND state = 'queued' AND held = 0"
    made = "SELECT count(*) AS n FROM tasks WHERE job_id = ?"
    assert [_count(store, made, j) for j in (big, capped)] == [SIZE, SIZE]  # all made before submit answered
    assert [_count(store, released, j) for j in (big, capped)] == [SIZE, 100]
    assert state_of(sched, big)["array"]["counts"] == {"queued": SIZE}


def test_a_restart_makes_the_rest_of_a_big_array(store, config, clock):
    first = Scheduler(store, config, clock)
    root = first.submit(_nowhere())
    big_spec = validate_job(_nowhere(array=f"0-{SIZE - 1}"))
    waiting_spec = validate_job(job(array=f"0-{SIZE - 1}", after=[root]))
    big = _stopped_after_first_step(first, jobs.submit, big_spec, clock())
    waiting = _stopped_after_first_step(first, jobs.submit, waiting_spec, clock())
    made = "SELECT count(*) AS n FROM tasks WHERE job_id = ?"
    assert _count(store, made, big) == outcomes.BATCH and state_of(first, big)["state"] == "queued"
    assert _count(store, "SELECT count(*) AS n FROM task_queue WHERE job_id = ?", big) == 0  # none runs yet
    first.cancel(root)  # the waiting array's dependency fails while its elements are being made
    restarted = Scheduler(store, config, clock)
    assert restarted.resume_cascades() >= 1
    restarted.cascades.join(60)
    assert _count(store, made, big) == SIZE
    assert _count(store, "SELECT count(*) AS n FROM task_queue WHERE job_id = ?", big) == SIZE
    assert (state_of(restarted, waiting)["state"], state_of(restarted, waiting)["reason"]) == \
        ("cancelled", "dependency_failed")


def test_an_array_released_while_its_elements_are_made_is_released_whole(store, config, clock):
    first = Scheduler(store, config, clock)
    w = add_worker(first, "w")
    root = first.submit(job())
    big = _stopped_after_first_step(first, jobs.submit, validate_job(job(array=f"0-{SIZE - 1}", after=[root])),
                                    clock())
    task = first.acquire(w)
    first.start(w, task["task_id"], 1)
    assert first.finish(w, task["task_id"], exit_code=0, outcome="succeeded", outputs={}, reason=None)
    assert state_of(first, big)["state"] == "waiting"  # not released with most of its elements not made
    restarted = Scheduler(store, config, clock)
    restarted.resume_cascades()
    restarted.cascades.join(60)
    assert state_of(restarted, big)["state"] == "queued"
    assert _count(store, "SELECT count(*) AS n FROM task_queue WHERE job_id = ?", big) == SIZE
