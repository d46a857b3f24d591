"""Quotas, borrowing, fair share, priority classes, preemption and the usage ledger (issue 15, part B),
through the scheduler against a real state file with a pinned clock."""
from __future__ import annotations

import json

import pytest

from gpulayer.server.errors import InvalidRequest
from gpulayer.server.scheduler import teams
from gpulayer.server.security.auth import Principal
from gpulayer.server.store.queries import row
from helpers import add_worker, events_of, job, state_of


def project(sched, name, **settings):
    sched.change_teams(teams.add_project, {"name": name, **settings})


def user(sched, name, *projects, max_running_jobs=None) -> Principal:
    """A user in `projects` (member), as the principal its client token authenticates as."""
    user_id = sched.change_teams(teams.add_user, name, False, [(p, "member") for p in projects], max_running_jobs)
    return Principal(kind="client", jti=f"jti-{name}", name=name, user_id=user_id, user=name, admin=False)


def submit(sched, who, proj, **spec):
    return sched.submit(job(**spec), who, proj)


def take(sched, w, pid=100):
    """Acquire and start one task on worker w; its assignment, or None."""
    a = sched.acquire(w)
    if a is not None:
        sched.start(w, a["task_id"], pid)
    return a


def finish(sched, w, task_id, outcome="succeeded", exit_code=0):
    return sched.finish(w, task_id, exit_code=exit_code, outcome=outcome, outputs={}, reason=None)


def hb(sched, w, *task_ids):
    return sched.heartbeat(w, [{"task_id": t, "state": "running", "endpoint": None, "restarts": 0} for t in task_ids])


def sql(sched, query, *params):
    return sched.store.read(lambda c: c.execute(query, params).fetchall())


def kinds(sched, job_id):
    return [e["kind"] for e in events_of(sched, job_id)]


@pytest.fixture
def ml(sched):
    """Projects ml (2 GPUs nominal) and cv (2 GPUs nominal), users bob (ml) and ann (cv)."""
    project(sched, "ml", gpus=2)
    project(sched, "cv", gpus=2)
    return {"bob": user(sched, "bob", "ml"), "ann": user(sched, "ann", "cv")}


# -- quotas ------------------------------------------------------------------

def test_a_project_at_its_quota_waits_and_says_so(sched, ml):
    w = add_worker(sched, "big", gpus=8, slots=8)
    ids = [submit(sched, ml["bob"], "ml", gpus=1) for _ in range(3)]
    assert take(sched, w) and take(sched, w)
    assert take(sched, w) is None  # 2 GPUs in use: the third would pass ml's quota of 2
    assert state_of(sched, ids[2])["waiting_reason"] == "project ml at its quota (2 GPUs in use)"
    # another project is not held back by ml's quota
    other = submit(sched, ml["ann"], "cv", gpus=1)
    assert take(sched, w)["job_id"] == other


def test_borrowing_up_to_nominal_plus_borrow_while_nobody_waits(sched, ml):
    sched.change_teams(teams.set_project, "ml", {"gpus": 1, "borrow": 2})
    w = add_worker(sched, "big", gpus=8, slots=8)
    ids = [submit(sched, ml["bob"], "ml", gpus=1) for _ in range(4)]
    assert [take(sched, w)["job_id"] for _ in range(3)] == ids[:3]
    assert take(sched, w) is None
    assert state_of(sched, ids[3])["waiting_reason"] == "project ml at its quota (3 GPUs in use, 2 borrowed)"


def test_borrowed_gpus_go_to_a_project_within_its_quota_first(sched, ml):
    sched.change_teams(teams.set_project, "ml", {"gpus": 1, "borrow": 4})
    w = add_worker(sched, "w", gpus=2, slots=2)
    first = submit(sched, ml["bob"], "ml", gpus=1)
    assert take(sched, w)["job_id"] == first      # within ml's nominal quota
    borrower = submit(sched, ml["bob"], "ml", gpus=1)
    lender = submit(sched, ml["ann"], "cv", gpus=1)
    # ml would borrow the last GPU, but cv waits within its own quota: cv gets it, although it came later
    assert take(sched, w)["job_id"] == lender
    assert state_of(sched, borrower)["state"] == "queued"


def test_a_borrower_is_told_it_waits_for_a_lender(sched, ml):
    sched.change_teams(teams.set_project, "ml", {"gpus": 1, "borrow": 4})
    w = add_worker(sched, "w", gpus=1, slots=1)
    submit(sched, ml["bob"], "ml", gpus=1)
    take(sched, w)
    borrower = submit(sched, ml["bob"], "ml", gpus=1)
    submit(sched, ml["ann"], "cv", gpus=1)
    assert state_of(sched, borrower)["waiting_reason"] == (
        "project ml may borrow beyond its quota (1 GPU) only what no other project waits for within its own")


def test_a_gang_borrows_only_while_no_lender_waits(sched, ml):
    sched.change_teams(teams.set_project, "ml", {"gpus": 1, "borrow": 4})
    w1, w2 = add_worker(sched, "w1", gpus=1), add_worker(sched, "w2", gpus=1)
    gang = submit(sched, ml["bob"], "ml", gpus=1, nodes=2)      # 2 GPUs: one of them borrowed
    lender = submit(sched, ml["ann"], "cv", gpus=1)
    assert take(sched, w1)["job_id"] == lender
    assert state_of(sched, gang)["state"] == "queued"
    sched.cancel(lender)
    finish(sched, w1, state_of(sched, lender)["tasks"][0]["task_id"], outcome="cancelled")
    assert take(sched, w1)["job_id"] == gang and take(sched, w2)["job_id"] == gang


def test_max_running_jobs_per_user(sched, ml):
    carl = user(sched, "carl", "ml", max_running_jobs=1)
    w = add_worker(sched, "w", gpus=0, slots=4)
    first = submit(sched, carl, "ml")
    second = submit(sched, carl, "ml")
    assert take(sched, w)["job_id"] == first
    assert take(sched, w) is None
    assert state_of(sched, second)["waiting_reason"] == "user carl at 1 running job"
    other = submit(sched, ml["bob"], "ml")
    assert take(sched, w)["job_id"] == other


def test_a_running_jobs_second_replica_is_not_held_by_the_users_limit(sched, ml):
    carl = user(sched, "carl", "ml", max_running_jobs=1)
    w1, w2 = add_worker(sched, "w1"), add_worker(sched, "w2")
    service = submit(sched, carl, "ml", service={"replicas": 2})
    assert take(sched, w1)["job_id"] == service
    assert take(sched, w2)["job_id"] == service


def test_each_running_array_element_counts_against_the_users_limit(sched, ml):
    # Slurm's MaxJobs counts array tasks: a user held to 2 runs an array 2 elements at a time
    carl = user(sched, "carl", "ml", max_running_jobs=2)
    w = add_worker(sched, "w", gpus=0, slots=8)
    array = submit(sched, carl, "ml", array="0-9")
    first, second = take(sched, w), take(sched, w)
    assert first["job_id"] == second["job_id"] == array
    assert take(sched, w) is None
    facts = sched.store.read(lambda c: row(c, "job_quota_reason", job_id=array))
    assert (facts["why"], facts["user"], facts["max_running_jobs"]) == ("user_limit", "carl", 2)
    plain = submit(sched, carl, "ml")
    assert take(sched, w) is None and state_of(sched, plain)["waiting_reason"] == "user carl at 2 running jobs"
    gang = submit(sched, carl, "ml", nodes=2)   # the gang placement judges the limit the same way
    w2 = add_worker(sched, "w2", gpus=0, slots=8)
    assert take(sched, w2) is None and state_of(sched, gang)["state"] == "queued"
    finish(sched, w, first["task_id"])          # an element ends: one more job may run (the gang, best first)
    assert take(sched, w)["job_id"] == gang and take(sched, w2)["job_id"] == gang
    assert take(sched, w) is None               # the array's element and the gang: 2
    other = submit(sched, ml["bob"], "ml")      # another user's work is not held back
    assert take(sched, w)["job_id"] == other


# -- fair share ----------------------------------------------------------------

def test_same_priority_work_goes_to_the_project_that_used_least(sched, ml, clock):
    w = add_worker(sched, "w", gpus=1, slots=1)
    a = submit(sched, ml["bob"], "ml", gpus=1)
    t = take(sched, w)
    clock.advance(100)
    finish(sched, w, t["task_id"])   # ml used 100 GPU-seconds
    ml_next = submit(sched, ml["bob"], "ml", gpus=1)
    cv_next = submit(sched, ml["ann"], "cv", gpus=1)
    assert take(sched, w)["job_id"] == cv_next   # cv came later, but used nothing yet
    assert a < ml_next < cv_next
    # a higher priority still goes first, whatever the usage (within the ceiling ml's admin gives it)
    sched.change_teams(teams.set_project, "ml", {"max_priority": 10})
    urgent = submit(sched, ml["bob"], "ml", gpus=1, priority="high")
    finish(sched, w, sched.store.read(lambda c: c.execute(
        "SELECT id FROM tasks WHERE job_id = ?", (cv_next,)).fetchall())[0]["id"])
    assert take(sched, w)["job_id"] == urgent


def test_fair_share_between_users_of_a_project_and_by_quota_between_projects(sched, ml, clock):
    carl = user(sched, "carl", "ml")
    w = add_worker(sched, "w", gpus=1, slots=1)

    def run(who, proj, seconds):
        submit(sched, who, proj, gpus=1)
        t = take(sched, w)
        clock.advance(seconds)
        finish(sched, w, t["task_id"])

    run(ml["bob"], "ml", 100)                     # bob used 100 GPU-seconds of ml's
    bobs = submit(sched, ml["bob"], "ml", gpus=1)
    carls = submit(sched, carl, "ml", gpus=1)
    t = take(sched, w)
    assert t["job_id"] == carls and bobs < carls  # within ml, the user that used least goes first
    clock.advance(30)
    finish(sched, w, t["task_id"])                # carl: 30, bob: 100; ml: 130 over its quota of 2
    run(ml["ann"], "cv", 40)                      # cv: 40 over its quota of 2
    anns = submit(sched, ml["ann"], "cv", gpus=1)
    t = take(sched, w)
    assert t["job_id"] == anns and anns > bobs    # 40 / 2 < 130 / 2: cv first, though bob came first
    finish(sched, w, t["task_id"])
    # ml's quota, its share, grows to 8: 130 / 8 < 40 / 2, so ml goes first, though it used more;
    # within ml, carl (30) before bob (100): carl's task, the latest of the three
    anns = submit(sched, ml["ann"], "cv", gpus=1)
    sched.change_teams(teams.set_project, "ml", {"gpus": 8})
    carls = submit(sched, carl, "ml", gpus=1)
    assert take(sched, w)["job_id"] == carls and bobs < anns < carls
    usage = sql(sched, "SELECT u.name, f.usage FROM fairshare f JOIN users u ON u.id = f.user_id ORDER BY u.name")
    assert [(r["name"], round(r["usage"])) for r in usage] == [("ann", 40), ("bob", 100), ("carl", 30)]


def test_running_work_counts_for_fair_share_once_refreshed(sched, ml, clock):
    w1, w2 = add_worker(sched, "w1", gpus=1), add_worker(sched, "w2", gpus=1)
    submit(sched, ml["bob"], "ml", gpus=1)
    take(sched, w1)                      # ml runs a long task: nothing has ended yet
    clock.advance(600)
    ml_next = submit(sched, ml["bob"], "ml", gpus=1)
    cv_next = submit(sched, ml["ann"], "cv", gpus=1)
    sched.refresh_fairshare()            # upkeep: ml has 600 GPU-seconds running
    assert take(sched, w2)["job_id"] == cv_next
    assert ml_next < cv_next


def test_fair_share_decays_with_the_half_life(sched, ml, clock):
    sched.config.fairshare_half_life_s = 3600
    sched.restarted()  # writes the settings the SQL reads
    w = add_worker(sched, "w", gpus=1, slots=1)
    submit(sched, ml["bob"], "ml", gpus=1)
    t = take(sched, w)
    clock.advance(1000)
    finish(sched, w, t["task_id"])
    clock.advance(3600)
    found = sql(sched, "SELECT usage * pow(0.5, (? - updated_at) / 3600.0) AS now FROM fairshare", clock.now)
    assert found[0]["now"] == pytest.approx(500)


# -- priority classes ------------------------------------------------------------

def test_priority_classes_and_numbers(sched):
    assert state_of(sched, sched.submit(job(priority="high")))["spec"]["priority"] == 10
    assert state_of(sched, sched.submit(job(priority="low")))["spec"]["priority"] == -10
    assert state_of(sched, sched.submit(job(priority=7)))["spec"]["priority"] == 7
    with pytest.raises(InvalidRequest, match="no priority class"):
        sched.submit(job(priority="urgent"))
    with pytest.raises(InvalidRequest, match="preemptible"):
        sched.submit(job(preemptible="yes"))


# -- preemption -------------------------------------------------------------------

def preempted_once(sched, clock, ran_s):
    """A 1-GPU worker whose one-attempt preemptible low task, run `ran_s`, is asked to stop for a high one:
    (worker, low job, victim's assignment, high job)."""
    w = add_worker(sched, "w", gpus=1, slots=1)
    low = sched.submit(job(gpus=1, priority="low", preemptible=True, retry={"max_attempts": 1}))
    victim = take(sched, w)
    clock.advance(ran_s)
    high = sched.submit(job(gpus=1, priority="high"))
    assert sched.preempt() == [victim["task_id"]]
    return w, low, victim, high


def test_high_priority_preempts_a_preemptible_task_which_is_requeued_same_attempt(sched, clock):
    w, low, victim, high = preempted_once(sched, clock, 50)
    assert sched.preempt() == []   # asked once: not again while it stops
    answer = hb(sched, w, victim["task_id"])
    assert answer["cancel_task_ids"] == [victim["task_id"]]
    assert answer["preempted_task_ids"] == [victim["task_id"]] and answer["preempt_grace_s"] == 30
    clock.advance(5)
    assert finish(sched, w, victim["task_id"], outcome="cancelled", exit_code=143)
    info = state_of(sched, low)
    assert info["state"] == "queued" and info["attempt"] == 1
    assert [(t["state"], t["attempt"], t["reason"]) for t in info["tasks"]] == [("queued", 1, "preempted")]
    assert info["preemptions"][0]["for_job_id"] == high and info["preemptions"][0]["done_at"] == clock.now
    events = events_of(sched, low)
    preempted = [e for e in events if e["kind"] == "task_preempted"]
    assert preempted and preempted[0]["data"]["for_job_id"] == high
    # the room goes to the high-priority job; the victim runs again after it, told it was preempted
    room = take(sched, w)
    assert room["job_id"] == high and "GPULAYER_PREEMPTED" not in room["env"]
    finish(sched, w, room["task_id"])
    again = take(sched, w)
    assert again["job_id"] == low and again["attempt"] == 1 and again["env"]["GPULAYER_PREEMPTED"] == "1"
    finish(sched, w, again["task_id"])
    assert state_of(sched, low)["state"] == "succeeded"
    # retention forgets the preemption with the job; the ledger keeps who preempted whom
    from gpulayer.server.scheduler import retention
    retention.prune(sched.store, now=clock.now + 86400, log_retention_s=3600, job_retention_s=3600)
    assert sql(sched, "SELECT count(*) AS n FROM preemptions")[0]["n"] == 0
    ledger = sql(sched, "SELECT job_id, outcome, gpu_seconds, preempted_by FROM usage ORDER BY id")
    assert [(r["job_id"], r["outcome"]) for r in ledger] == [(low, "preempted"), (high, "succeeded"), (low, "succeeded")]
    assert ledger[0]["gpu_seconds"] == pytest.approx(55) and ledger[0]["preempted_by"] == room["task_id"]


def test_no_preemption_of_work_not_preemptible_or_not_lower(sched):
    w = add_worker(sched, "w", gpus=1, slots=1)
    sched.submit(job(gpus=1, priority="low"))                       # not preemptible
    take(sched, w)
    sched.submit(job(gpus=1, priority="high"))
    assert sched.preempt() == []
    w2 = add_worker(sched, "w2", gpus=1, slots=1)
    sched.submit(job(gpus=1, priority=10, preemptible=True))
    assert take(sched, w2)
    sched.submit(job(gpus=1, priority=10))                          # the same priority: no
    assert sched.preempt() == []


def test_the_victims_are_the_lowest_priority_then_the_latest_started(sched, clock):
    w = add_worker(sched, "w", gpus=3, slots=3)
    old_low = sched.submit(job(gpus=1, priority=-5, preemptible=True))
    take(sched, w)
    clock.advance(10)
    mid = sched.submit(job(gpus=1, priority=-1, preemptible=True))
    take(sched, w)
    clock.advance(10)
    new_low = sched.submit(job(gpus=1, priority=-5, preemptible=True))
    take(sched, w)
    sched.submit(job(gpus=2, priority=5))
    asked = sched.preempt()
    victims = {r["job_id"] for r in sql(sched, "SELECT job_id FROM tasks WHERE id IN (%s)" % ",".join(map(str, asked)))}
    assert victims == {new_low, old_low} and mid not in victims


def test_a_gang_is_preempted_whole(sched):
    w1, w2 = add_worker(sched, "w1", gpus=1), add_worker(sched, "w2", gpus=1)
    gang = sched.submit(job(gpus=1, nodes=2, priority="low", preemptible=True))
    a1, a2 = take(sched, w1), take(sched, w2)
    assert {a1["job_id"], a2["job_id"]} == {gang}
    sched.submit(job(gpus=1, priority="high"))
    assert sorted(sched.preempt()) == sorted([a1["task_id"], a2["task_id"]])
    for w, a in ((w1, a1), (w2, a2)):
        finish(sched, w, a["task_id"], outcome="cancelled", exit_code=143)
    info = state_of(sched, gang)
    assert info["state"] == "queued" and info["attempt"] == 1
    assert {t["state"] for t in info["tasks"]} == {"queued"}


def test_borrowed_gpus_are_reclaimed_for_the_lender(sched, ml, clock):
    sched.change_teams(teams.set_project, "ml", {"gpus": 1, "borrow": 3})
    w = add_worker(sched, "w", gpus=2, slots=2)
    for _ in range(2):
        submit(sched, ml["bob"], "ml", gpus=1)
    first, second = take(sched, w), take(sched, w)   # ml holds 2: one of them borrowed (nobody waited)
    clock.advance(5)
    lender = submit(sched, ml["ann"], "cv", gpus=1)
    assert take(sched, w) is None
    asked = sched.preempt()
    assert asked == [second["task_id"]]   # the borrowed one, most recently started; never ml's nominal one
    finish(sched, w, second["task_id"], outcome="cancelled", exit_code=143)
    assert take(sched, w)["job_id"] == lender
    assert sched.preempt() == []   # ml is within its quota now: nothing more to reclaim
    assert first


def test_a_task_never_preempts_the_one_it_was_preempted_for(sched, ml):
    sched.change_teams(teams.set_project, "ml", {"gpus": 1, "borrow": 1})
    sched.change_teams(teams.set_project, "cv", {"gpus": 1, "borrow": 1})
    w = add_worker(sched, "w", gpus=2, slots=2)
    submit(sched, ml["bob"], "ml", gpus=1)
    submit(sched, ml["bob"], "ml", gpus=1)
    take(sched, w)
    borrowed = take(sched, w)
    submit(sched, ml["ann"], "cv", gpus=1)
    assert sched.preempt() == [borrowed["task_id"]]
    finish(sched, w, borrowed["task_id"], outcome="cancelled", exit_code=143)
    lender = take(sched, w)
    # the quotas turn round: cv now borrows, and ml's requeued task is within ml's quota; it could
    # reclaim cv's GPU, but that task is the one it was preempted for: no ping-pong
    sched.change_teams(teams.set_project, "ml", {"gpus": 2})
    sched.change_teams(teams.set_project, "cv", {"gpus": 0})
    assert lender and sched.preempt() == []


def test_waiting_tasks_that_find_no_victims_hold_back_no_later_one(sched):
    a = add_worker(sched, "a", gpus=1, cpus=64, labels={"pool": "a"})
    b = add_worker(sched, "b", gpus=1, cpus=64)
    sched.submit(job(gpus=1, labels={"pool": "a"}))                     # a: work that is not preemptible
    assert take(sched, a)
    low = sched.submit(job(gpus=1, priority="low", preemptible=True))    # b: work that is
    victim = take(sched, b)
    assert victim["job_id"] == low
    # ahead of the task that could preempt, better ones that cannot: 20 groups (shapes) that fit no
    # worker at all (skipped without a plan), then 12 that fit only a, where nothing may be taken
    for cpus in range(1, 21):
        sched.submit(job(gpus=4, cpus=cpus, priority=10))
    for cpus in range(1, 13):
        sched.submit(job(gpus=1, cpus=cpus, priority=9, labels={"pool": "a"}))
    waiting = sched.submit(job(gpus=1, priority=5))
    assert sched.preempt() == [victim["task_id"]]
    assert sql(sched, "SELECT for_job_id FROM preemptions")[0]["for_job_id"] == waiting


def test_a_cancel_during_the_grace_ends_the_job_cancelled(sched):
    w = add_worker(sched, "w", gpus=1, slots=1)
    low = sched.submit(job(gpus=1, priority="low", preemptible=True))
    victim = take(sched, w)
    sched.submit(job(gpus=1, priority="high"))
    assert sched.preempt()
    sched.cancel(low)
    finish(sched, w, victim["task_id"], outcome="cancelled", exit_code=143)
    assert state_of(sched, low)["state"] == "cancelled"


def test_a_victim_whose_worker_is_lost_in_the_grace_is_requeued_same_attempt(sched, clock):
    _, low, victim, high = preempted_once(sched, clock, 10)
    clock.advance(sched.config.lease_ttl_s + 1)   # no heartbeat: the worker is lost during the grace
    assert sched.expire()["tasks_lost"] == 0
    info = state_of(sched, low)
    # not `lost` (its one attempt would be spent): queued again, as a preemption that completed
    assert info["state"] == "queued" and info["attempt"] == 1
    assert [(t["state"], t["attempt"], t["reason"]) for t in info["tasks"]] == [("queued", 1, "preempted")]
    assert info["preemptions"][0]["done_at"] == clock.now
    preempted = [e for e in events_of(sched, low) if e["kind"] == "task_preempted"]
    assert preempted[0]["data"]["worker_lost"] is True and preempted[0]["data"]["for_job_id"] == high
    assert "task_lost" not in kinds(sched, low)
    ledger = sql(sched, "SELECT job_id, outcome, preempted_by FROM usage")
    assert [(r["job_id"], r["outcome"]) for r in ledger] == [(low, "preempted")]
    # another worker runs the waiting task first, then the victim, told it was preempted
    w2 = add_worker(sched, "w2", gpus=1, slots=1)
    room = take(sched, w2)
    assert room["job_id"] == high and ledger[0]["preempted_by"] == room["task_id"]
    finish(sched, w2, room["task_id"])
    again = take(sched, w2)
    assert again["job_id"] == low and again["attempt"] == 1 and again["env"]["GPULAYER_PREEMPTED"] == "1"


def test_a_victim_on_a_worker_that_leaves_in_the_grace_is_requeued(sched):
    w = add_worker(sched, "w", gpus=1, slots=1)
    keep = add_worker(sched, "keep", gpus=1, slots=1)
    low = sched.submit(job(gpus=1, priority="low", preemptible=True, retry={"max_attempts": 1}))
    other = sched.submit(job(gpus=1, priority="low", retry={"max_attempts": 1}))
    victim, bystander = take(sched, w), take(sched, keep)
    assert (victim["job_id"], bystander["job_id"]) == (low, other)
    sched.submit(job(gpus=1, priority="high"))
    assert sched.preempt() == [victim["task_id"]]
    assert sched.deregister(w) == 0          # nothing of w's is lost: its victim is requeued
    assert state_of(sched, low)["state"] == "queued" and state_of(sched, low)["attempt"] == 1
    assert sched.preempt() == []             # asked once; the room will come on another worker



# -- a waiting gang preempts: victims on `width` distinct workers, their room held ------------

def held(sched):
    return {(r["worker_id"], r["job_id"]) for r in sql(sched, "SELECT worker_id, job_id FROM gang_reservations")}


def gang_waiting_on_three(sched, clock):
    """w1, w2 (1 GPU) each run a low preemptible task; w3 (2 GPUs) is idle; a high 3-node gang of
    1 GPU a rank waits: (workers, the two victims' assignments, the low jobs, the gang)."""
    w1, w2 = add_worker(sched, "w1", gpus=1), add_worker(sched, "w2", gpus=1)
    w3 = add_worker(sched, "w3", gpus=2, slots=2)
    low = [sched.submit(job(gpus=1, priority="low", preemptible=True, retry={"max_attempts": 1})) for _ in range(2)]
    v1, v2 = take(sched, w1), take(sched, w2)
    assert [v1["job_id"], v2["job_id"]] == low
    clock.advance(60)
    gang = sched.submit(job(gpus=1, nodes=3, priority="high"))
    return (w1, w2, w3), (v1, v2), low, gang


def test_a_waiting_gang_preempts_on_width_workers_and_its_room_is_held(sched, clock):
    (w1, w2, w3), (v1, v2), low, gang = gang_waiting_on_three(sched, clock)
    assert sorted(sched.preempt()) == sorted([v1["task_id"], v2["task_id"]])
    assert held(sched) == {(w1, gang), (w2, gang), (w3, gang)}   # w3: room now, held with the others
    assert {r["for_job_id"] for r in sql(sched, "SELECT for_job_id FROM preemptions")} == {gang}
    assert sched.preempt() == []   # under way: not again
    # other work takes only the room beyond what is held: w3's second GPU, not its first
    other = [sched.submit(job(gpus=1)) for _ in range(2)]
    assert take(sched, w3)["job_id"] == other[0]
    assert take(sched, w3) is None
    # the first victim stops: its worker's room stays held (the victim itself and `other` wait)
    finish(sched, w1, v1["task_id"], outcome="cancelled", exit_code=143)
    assert take(sched, w1) is None
    assert state_of(sched, gang)["state"] == "queued"
    # the last one stops: the gang is placed whole on the three workers, and the hold ends
    finish(sched, w2, v2["task_id"], outcome="cancelled", exit_code=143)
    first = take(sched, w2)
    assert first["job_id"] == gang
    assert state_of(sched, gang)["state"] == "running"
    placed = sql(sched, "SELECT worker_id FROM tasks WHERE job_id = ? AND state IN ('assigned', 'running')", gang)
    assert sorted(r["worker_id"] for r in placed) == sorted([w1, w2, w3])
    assert held(sched) == set()
    for job_id in low:
        info = state_of(sched, job_id)
        assert info["state"] == "queued" and info["attempt"] == 1
        assert [t["reason"] for t in info["tasks"]] == ["preempted"]


def test_a_gang_preempts_nothing_unless_width_workers_can_be_found(sched, clock):
    w1, w2 = add_worker(sched, "w1", gpus=1), add_worker(sched, "w2", gpus=1)
    w3 = add_worker(sched, "w3", gpus=1)
    for w in (w1, w2):
        low = sched.submit(job(gpus=1, priority="low", preemptible=True))
        assert take(sched, w)["job_id"] == low
    sched.submit(job(gpus=1, priority="low"))   # w3: not preemptible
    assert take(sched, w3)
    clock.advance(10)
    gang = sched.submit(job(gpus=1, nodes=3, priority="high"))
    assert sched.preempt() == []   # two workers could be freed, not three: no victim at all
    assert held(sched) == set()
    wider = sched.submit(job(gpus=1, nodes=4, priority="high"))   # wider than the fleet
    assert sched.preempt() == []
    assert {r["job_id"] for r in sql(sched, "SELECT job_id FROM tasks WHERE cancel_requested = 1")} == set()
    assert gang and wider


def test_another_gang_skips_a_worker_holding_room_for_a_gang(sched, clock):
    (w1, w2, w3), (v1, v2), low, first = gang_waiting_on_three(sched, clock)
    assert len(sched.preempt()) == 2   # the first gang holds w1-w3
    w5 = add_worker(sched, "w5", gpus=1)
    low5 = sched.submit(job(gpus=1, priority="low", preemptible=True))
    v5 = take(sched, w5)
    assert v5["job_id"] == low5
    w4 = add_worker(sched, "w4", gpus=1)   # idle
    second = sched.submit(job(gpus=1, cpus=2, nodes=2, priority=5))
    # w3 has a GPU beyond the rank held there, but another gang skips a worker holding room
    # whole: the second gang has w4 free and w5's victim to stop
    assert sched.preempt() == [v5["task_id"]]
    assert held(sched) == {(w1, first), (w2, first), (w3, first), (w4, second), (w5, second)}
    finish(sched, w5, v5["task_id"], outcome="cancelled", exit_code=143)
    assert take(sched, w5)["job_id"] == second
    placed = sql(sched, "SELECT worker_id FROM tasks WHERE job_id = ? AND state IN ('assigned', 'running')", second)
    assert sorted(r["worker_id"] for r in placed) == sorted([w4, w5])
    assert held(sched) == {(w1, first), (w2, first), (w3, first)}

def test_a_gang_reclaims_lent_gpus_across_workers_and_is_never_preempted_back(sched, ml):
    sched.change_teams(teams.set_project, "cv", {"gpus": 0, "borrow": 2})
    w1, w2 = add_worker(sched, "w1", gpus=1), add_worker(sched, "w2", gpus=1)
    for _ in range(2):
        submit(sched, ml["ann"], "cv", gpus=1)
    x1, x2 = take(sched, w1), take(sched, w2)   # cv borrows both GPUs: nobody waits
    gang = submit(sched, ml["bob"], "ml", gpus=1, nodes=2)   # ml within its nominal 2: reclaims
    assert sorted(sched.preempt()) == sorted([x1["task_id"], x2["task_id"]])
    for w, x in ((w1, x1), (w2, x2)):
        finish(sched, w, x["task_id"], outcome="cancelled", exit_code=143)
    assert take(sched, w2)["job_id"] == gang and state_of(sched, gang)["state"] == "running"
    # the quotas turn round: ml now borrows, and cv's requeued tasks are within cv's quota; they
    # could reclaim the gang's GPUs, but each was preempted for that gang: no ping-pong
    sched.change_teams(teams.set_project, "ml", {"gpus": 0, "borrow": 2})
    sched.change_teams(teams.set_project, "cv", {"gpus": 2})
    assert sched.preempt() == []


def test_room_held_for_a_gang_is_free_again_once_the_hold_expires(sched, clock):
    (w1, w2, w3), (v1, v2), low, gang = gang_waiting_on_three(sched, clock)
    assert len(sched.preempt()) == 2
    sched.deregister(w3)   # a worker it was to use leaves: the gang cannot be placed
    for w, v in ((w1, v1), (w2, v2)):
        finish(sched, w, v["task_id"], outcome="cancelled", exit_code=143)
    assert take(sched, w1) is None and take(sched, w2) is None   # held for the gang
    grace = sched.config.preempt_grace_s
    clock.advance(grace + 2 * sched.config.lease_ttl_s + 1)
    for w in (w1, w2):   # heartbeats keep the workers online
        hb(sched, w)
    assert take(sched, w1)["job_id"] == low[0]   # the hold expired: the room is anyone's again
    assert sched.preempt() == [] and held(sched) == set()   # the round forgets it; 2 workers: no new plan


# -- the usage ledger -----------------------------------------------------------------

def test_the_ledger_holds_each_run_and_survives_retention(sched, ml, clock):
    from gpulayer.server.scheduler import retention
    w = add_worker(sched, "w", gpus=2, cpus=8, slots=2)
    one = submit(sched, ml["bob"], "ml", gpus=2, cpus=1, name="train", labels={})
    t = take(sched, w)
    clock.advance(30)
    finish(sched, w, t["task_id"])
    cpu = submit(sched, ml["ann"], "cv", cpus=2, name="etl")
    t = take(sched, w)
    clock.advance(10)
    finish(sched, w, t["task_id"], outcome="failed", exit_code=1)
    rows = sql(sched, "SELECT job_id, outcome, gpu_seconds, cpu_seconds, user_id, project_id FROM usage ORDER BY id")
    assert [(r["job_id"], r["outcome"], r["gpu_seconds"], r["cpu_seconds"]) for r in rows] == [
        (one, "succeeded", 60.0, 30.0), (cpu, "failed", 0.0, 20.0)]
    by_user = sched.usage(None, "user", "1d")
    assert [(r["key"], r["gpu_hours"], r["jobs"]) for r in by_user["rows"]] == [
        ("bob", round(60 / 3600, 6), 1), ("ann", 0.0, 1)]
    assert [r["key"] for r in sched.usage(None, "project", "1d")["rows"]] == ["ml", "cv"]
    assert [r["key"] for r in sched.usage(None, "job-name", "1d")["rows"]] == ["train", "etl"]
    # bob sees his own runs only; a bad `by` or `since` is a 400
    assert [r["key"] for r in sched.usage(ml["bob"], "user", "1d")["rows"]] == ["bob"]
    with pytest.raises(InvalidRequest):
        sched.usage(None, "color", "1d")
    with pytest.raises(InvalidRequest):
        sched.usage(None, "user", "soon")
    clock.advance(400 * 86400)
    retention.prune(sched.store, now=clock.now, log_retention_s=86400, job_retention_s=86400)
    assert sql(sched, "SELECT count(*) AS n FROM jobs")[0]["n"] == 0
    assert sql(sched, "SELECT count(*) AS n FROM usage")[0]["n"] == 2


def test_a_lost_task_is_in_the_ledger(sched, clock):
    w = add_worker(sched, "w")
    sched.submit(job(cpus=1))
    t = take(sched, w)
    clock.advance(100)
    sched.expire()
    found = sql(sched, "SELECT task_id, outcome, cpu_seconds FROM usage")
    assert [(r["task_id"], r["outcome"]) for r in found] == [(t["task_id"], "lost")]
    assert json.loads(json.dumps(found[0]["cpu_seconds"])) == pytest.approx(100)
