"""A project's priority ceiling and the aging of waiting work (issue 22, item 6), through the scheduler
against a real state file with a pinned clock."""
from __future__ import annotations

import pytest

from gpulayer.server.errors import Forbidden, NotFound
from gpulayer.server.scheduler import aging, teams
from gpulayer.server.security.auth import Principal
from helpers import add_worker, job, state_of

HOUR = aging.AGING_STEP_S


def project(sched, name, **settings):
    sched.change_teams(teams.add_project, {"name": name, **settings})


def user(sched, name, *projects, role="member") -> Principal:
    user_id = sched.change_teams(teams.add_user, name, False, [(p, role) for p in projects], None)
    return Principal(kind="client", jti=f"jti-{name}", name=name, user_id=user_id, user=name, admin=False)


def count_jobs(sched) -> int:
    return sched.store.read(lambda c: c.execute("SELECT count(*) AS n FROM jobs").fetchall())[0]["n"]


def take(sched, w):
    a = sched.acquire(w)
    if a is not None:
        sched.start(w, a["task_id"], 100)
    return a


def finish(sched, w, task_id):
    sched.finish(w, task_id, exit_code=0, outcome="succeeded", outputs={}, reason=None)


@pytest.fixture
def ml(sched):
    project(sched, "ml")
    project(sched, "cv")
    return {"bob": user(sched, "bob", "ml"), "ann": user(sched, "ann", "cv"),
            "meg": user(sched, "meg", "ml", role="manager")}


# -- the ceiling ---------------------------------------------------------------------

def test_a_member_may_lower_its_priority_not_raise_it_above_the_ceiling(sched, ml):
    before = count_jobs(sched)
    for priority in (1, 1_000_000, "high"):
        with pytest.raises(Forbidden, match=r"above the ceiling of project ml \(max_priority 0\)") as refused:
            sched.submit(job(priority=priority), ml["bob"], "ml")
        assert refused.value.code == "priority_above_ceiling" and refused.value.extra == {"max_priority": 0}
    assert count_jobs(sched) == before   # nothing submitted
    for priority in (0, -5, "low"):
        assert state_of(sched, sched.submit(job(priority=priority), ml["bob"], "ml"))["state"] == "queued"


def test_the_ceiling_is_the_projects_and_admins_are_not_bound(sched, ml):
    sched.change_teams(teams.set_project, "ml", {"max_priority": 10})
    assert sched.submit(job(priority=10), ml["bob"], "ml")
    with pytest.raises(Forbidden, match="max_priority 10"):
        sched.submit(job(priority=11), ml["bob"], "ml")
    with pytest.raises(Forbidden, match="project cv"):   # another project keeps its own (0)
        sched.submit(job(priority=1), ml["ann"], "cv")
    admin_job = sched.submit(job(priority=1_000_000))       # the single-user default: the admin submits
    assert state_of(sched, admin_job)["spec"]["priority"] == 1_000_000
    assert sched.submit(job(priority=500), teams_admin(), "ml")


def teams_admin() -> Principal:
    return Principal(kind="client", jti="server-client", name="server", user_id=1, user="admin", admin=True)


def test_managers_are_bound_too_and_may_raise_their_projects_ceiling_only(sched, ml):
    meg, bob = ml["meg"], ml["bob"]
    with pytest.raises(Forbidden):
        sched.submit(job(priority=5), meg, "ml")
    sched.store.read(teams.may_change_project, meg, "ml", {"max_priority": 5})   # allowed
    sched.change_teams(teams.set_project, "ml", {"max_priority": 5})
    assert sched.submit(job(priority=5), meg, "ml")
    with pytest.raises(Forbidden, match="only an admin"):        # a manager changes nothing else
        sched.store.read(teams.may_change_project, meg, "ml", {"max_priority": 5, "gpus": 8})
    with pytest.raises(Forbidden, match="managers of project ml"):   # a member may not
        sched.store.read(teams.may_change_project, bob, "ml", {"max_priority": 9})
    with pytest.raises(NotFound):                                   # nor one outside it
        sched.store.read(teams.may_change_project, ml["ann"], "ml", {"max_priority": 9})
    assert sched.store.read(teams.get_project, meg, "ml")["max_priority"] == 5


# -- aging ---------------------------------------------------------------------------

def test_old_work_is_not_starved_by_a_stream_of_new_work_fair_share_prefers(sched, ml, clock):
    """cv used nothing, ml a lot: fair share puts cv's new jobs first; after an hour of waiting ml's job
    gains a step and goes before them."""
    w = add_worker(sched, "w", gpus=1, slots=1)
    heavy = sched.submit(job(gpus=1), ml["bob"], "ml")
    t = take(sched, w)
    clock.advance(100 * HOUR)   # ml used 100 GPU-hours; cv's stream below uses less than one
    finish(sched, w, t["task_id"])
    assert t["job_id"] == heavy
    starved = sched.submit(job(gpus=1), ml["bob"], "ml")
    for _ in range(3):   # a stream of cv's work, each taken before ml's older job
        fresh = sched.submit(job(gpus=1), ml["ann"], "cv")
        t = take(sched, w)
        assert t["job_id"] == fresh
        clock.advance(HOUR / 4 - 1)
        finish(sched, w, t["task_id"])
        assert sched.age_queue() == 0
    clock.advance(HOUR / 4 + 3)                  # ml's job has waited an hour
    fresh = sched.submit(job(gpus=1), ml["ann"], "cv")
    assert sched.age_queue() == 1
    assert take(sched, w)["job_id"] == starved   # before the fresher cv job, whatever fair share says
    assert state_of(sched, fresh)["state"] == "queued"


def test_aging_is_capped_and_orders_a_users_own_queue(sched, ml, clock):
    w = add_worker(sched, "w", slots=1)
    old = sched.submit(job(priority=-10), ml["bob"], "ml")   # low
    clock.advance(100 * HOUR)
    sched.age_queue()
    assert sched.store.read(lambda c: c.execute("SELECT aged FROM task_queue").fetchall()) == [{"aged": 10}]
    newer = sched.submit(job(priority=-1), ml["bob"], "ml")
    assert take(sched, w)["job_id"] == old            # -10 + 10 over -1: aged first, in the same group
    assert state_of(sched, newer)["state"] == "queued"
    sched.change_teams(teams.set_project, "ml", {"max_priority": 1})
    w2 = add_worker(sched, "w2", slots=1)
    clock.advance(100 * HOUR)
    sched.age_queue()
    above = sched.submit(job(priority=1), ml["bob"], "ml")
    # -1 + 10 = 9 over a fresh 1: but a gap wider than the cap stays strict
    assert take(sched, w2)["job_id"] == newer
    assert state_of(sched, above)["state"] == "queued"


def test_a_gap_wider_than_the_cap_stays_strict(sched, clock):
    w = add_worker(sched, "w", slots=1)
    old = sched.submit(job(priority=0))
    clock.advance(1000 * HOUR)
    sched.age_queue()
    urgent = sched.submit(job(priority=11))
    assert take(sched, w)["job_id"] == urgent and state_of(sched, old)["state"] == "queued"


def test_aging_gives_no_right_to_preempt(sched, ml, clock):
    """A waiting job aged to +10 does not preempt preemptible work of a priority its own is below."""
    w = add_worker(sched, "w", gpus=1, slots=1)
    low = sched.submit(job(gpus=1, priority=5, preemptible=True))
    assert take(sched, w)["job_id"] == low
    waiting = sched.submit(job(gpus=1, priority=0), ml["bob"], "ml")
    clock.advance(20 * HOUR)
    assert sched.age_queue() == 1
    assert sched.preempt() == []
    sched.change_teams(teams.set_project, "cv", {"max_priority": 6})
    higher = sched.submit(job(gpus=1, priority=6), ml["ann"], "cv")   # its own priority is above: it may
    asked = sched.preempt()
    assert len(asked) == 1
    events = sched.store.read(lambda c: c.execute(
        "SELECT json_extract(data, '$.for_job_id') AS f FROM events WHERE kind = 'task_preempt_requested'").fetchall())
    assert events == [{"f": higher}] and state_of(sched, waiting)["state"] == "queued"


def test_a_released_task_ages_from_its_release_not_its_submit(sched, clock):
    w = add_worker(sched, "w", slots=1)
    first = sched.submit(job())
    after = sched.submit(job(after=[first]))
    clock.advance(5 * HOUR)
    t = take(sched, w)
    assert t["job_id"] == first
    finish(sched, w, t["task_id"])               # `after` is released now, 5 hours after its submit
    sched.age_queue()
    assert sched.store.read(lambda c: c.execute("SELECT aged, since FROM task_queue").fetchall()) == [
        {"aged": 0, "since": clock.now}]
    clock.advance(HOUR)
    assert sched.age_queue() == 1
    assert state_of(sched, after)["state"] == "queued"


def test_aging_runs_in_bounded_batches(sched, clock):
    sched.submit(job(array="0-2499"))
    clock.advance(3 * HOUR)
    assert sched.store.write(aging.age, clock.now, 1000) == 1000   # one batch: at most its limit
    assert sched.age_queue() == 1500                                # the rest, a batch a transaction
    found = sched.store.read(lambda c: c.execute("SELECT aged, count(*) AS n FROM task_queue GROUP BY aged")
                             .fetchall())
    assert found == [{"aged": 3, "n": 2500}]
    assert sched.age_queue() == 0
