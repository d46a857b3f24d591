"""Start-time forecasts (issue 38 point 2): the real claim and finish replayed forward on a copy of a real
state file (scheduler/forecast.py), with starts worked out by hand."""
from __future__ import annotations

import pytest

from gpulayer.server.scheduler import forecast
from helpers import add_worker, job

NOW = 1_700_000_000.0


def _forecast(sched, max_jobs=forecast.DEFAULT_MAX_JOBS):
    copy = sched.store.read(forecast.snapshot)
    return forecast.waiting_estimates(copy, sched.clock(), max_jobs)


def _run(sched, worker):
    a = sched.acquire(worker)
    sched.start(worker, a["task_id"], 1)
    return a


def test_a_queue_whose_starts_are_known_by_hand(sched, clock):
    w = add_worker(sched, "gpu-01", gpus=8, slots=8)
    running = sched.submit(job(gpus=8, timeout_seconds=600))
    _run(sched, w)
    clock.advance(100)  # 500 s left of the running job's limit
    first = sched.submit(job(gpus=4, timeout_seconds=300))
    second = sched.submit(job(gpus=4, timeout_seconds=1000))
    third = sched.submit(job(gpus=8, timeout_seconds=60))
    fourth = sched.submit(job(gpus=2, timeout_seconds=60))
    found = _forecast(sched).estimates
    start = NOW + 600
    assert running not in found
    assert found[first].at == start and found[first].worker == "gpu-01"
    assert found[second].at == start
    # the 8-GPU job waits for both 4-GPU ones: the first ends at +300, the second at +1000
    assert found[third].at == start + 1000
    # the 2-GPU job is behind the 8-GPU one in the claim's order? No: it fits beside the second at +300
    assert found[fourth].at == start + 300
    assert all(e.reason is None for e in found.values())


def test_an_estimate_moves_when_a_task_overruns(sched, clock):
    w = add_worker(sched, "gpu-01", gpus=8, slots=8)
    sched.submit(job(gpus=8, timeout_seconds=600))
    _run(sched, w)
    waiting = sched.submit(job(gpus=8, timeout_seconds=60))
    assert _forecast(sched).estimates[waiting].at == NOW + 600
    clock.advance(900)  # the running task is 300 s past its expected end, and still runs
    assert _forecast(sched).estimates[waiting].at == NOW + 900
    clock.advance(100)
    assert _forecast(sched).estimates[waiting].at == NOW + 1000
    assert sched.acquire(w) is None  # the live state is untouched: the 8 GPUs are still held


def test_a_gang_starts_when_enough_whole_workers_are_free(sched, clock):
    a = add_worker(sched, "gpu-01", gpus=8, slots=8)
    add_worker(sched, "gpu-02", gpus=8, slots=8)
    sched.submit(job(gpus=8, timeout_seconds=500))
    _run(sched, a)
    gang = sched.submit(job(gpus=8, nodes=2, timeout_seconds=100))
    found = _forecast(sched).estimates[gang]
    assert found.at == NOW + 500 and set(found.workers) == {"gpu-01", "gpu-02"}


def test_what_if_fewer_gpus_starts_sooner(sched, clock):
    w = add_worker(sched, "gpu-01", gpus=8, slots=8)
    sched.submit(job(gpus=4, timeout_seconds=600))
    _run(sched, w)
    clock.advance(60)
    before = sched.store.read(forecast.snapshot).execute("SELECT count(*) AS n FROM jobs").fetchall()
    four = sched.estimate(job(gpus=4, timeout_seconds=100))
    eight = sched.estimate(job(gpus=8, timeout_seconds=100))
    assert four.at == NOW + 60 and four.worker == "gpu-01"
    assert eight.at == NOW + 600
    after = sched.store.read(forecast.snapshot).execute("SELECT count(*) AS n FROM jobs").fetchall()
    assert before == after  # nothing was submitted


def test_a_spec_that_could_never_run(sched):
    add_worker(sched, "gpu-01", gpus=8, slots=8)
    found = sched.estimate(job(gpus=16))
    assert found.at is None and found.never
    assert found.reason == ("no worker could ever run it: no online worker has the accelerator and size it asks for (16 GPUs)")
    never = sched.submit(job(gpus=16))
    got = _forecast(sched).estimates[never]
    assert got.at is None and got.reason == found.reason


def test_held_after_and_the_cap_are_null_with_a_reason(sched, clock):
    w = add_worker(sched, "gpu-01", gpus=8, slots=8)
    first = sched.submit(job(gpus=8, timeout_seconds=600))
    _run(sched, w)
    held = sched.submit(job(gpus=1, hold=True))
    after = sched.submit(job(gpus=1, after=[first]))
    third = sched.submit(job(gpus=1))
    fourth = sched.submit(job(gpus=1))
    made = _forecast(sched, max_jobs=3)
    assert made.estimates[held].reason.startswith("held:") and made.estimates[held].at is None
    assert made.estimates[after].reason == f"after job {first}, which has not ended"
    assert made.estimates[third].at == NOW + 600
    assert fourth in made.skipped and fourth not in made.estimates


def test_a_begin_time_is_waited_for(sched, clock):
    add_worker(sched, "gpu-01", gpus=8, slots=8)
    later = sched.submit(job(gpus=1, begin_at=NOW + 3600))
    assert _forecast(sched).estimates[later].at == NOW + 3600


@pytest.mark.parametrize("body,code", [({"command": []}, "invalid_request"), ({"command": ["x"], "gpus": -1}, "invalid_request")])
def test_what_if_refuses_what_submit_refuses(sched, body, code):
    from gpulayer.server.errors import InvalidRequest
    with pytest.raises(InvalidRequest):
        sched.estimate(body)


def test_what_if_is_judged_as_its_caller(sched, clock):
    from gpulayer.server.errors import Forbidden
    from gpulayer.server.scheduler import teams
    from gpulayer.server.security.auth import Principal
    w = add_worker(sched, "gpu-01", gpus=8, slots=8)
    sched.change_teams(teams.add_project, {"name": "ml", "max_priority": 5, "gpus": 4})
    uid = sched.change_teams(teams.add_user, "bob", False, [("ml", "member")], None)
    bob = Principal(kind="client", jti="jti-bob", name="bob", user_id=uid, user="bob", admin=False)
    with pytest.raises(Forbidden):  # above the project's priority ceiling, as a submit would be
        sched.estimate(job(gpus=1, priority=10), bob)
    with pytest.raises(Forbidden):  # a project bob is not in
        sched.estimate(job(gpus=1), bob, "default")
    sched.submit(job(gpus=4, timeout_seconds=300), bob)
    _run(sched, w)
    # ml's quota is 4 GPUs, all in use: bob's next job waits for them although 4 GPUs are free
    assert sched.estimate(job(gpus=4), bob).at == NOW + 300
    assert sched.estimate(job(gpus=4)).at == NOW  # the admin's default project has no quota
    never = sched.estimate(job(gpus=8), bob)
    assert never.at is None and never.never and "quota" in never.reason


def test_what_if_behind_more_than_max_jobs_is_not_estimated(sched, config):
    w = add_worker(sched, "gpu-01", gpus=8, slots=8)
    for _ in range(4):
        sched.submit(job(gpus=8, timeout_seconds=60))
    _run(sched, w)
    config.estimate_max_jobs = 2
    found = sched.estimate(job(gpus=8))
    assert found.at is None and found.reason == ("not estimated: more than 2 waiting jobs start before it "
                                                 "(--estimate-max-jobs)")
    config.estimate_max_jobs = 3
    assert sched.estimate(job(gpus=8)).at == NOW + 4 * 60


def test_the_estimate_uses_learned_runs_not_the_time_limit(sched, clock):
    w = add_worker(sched, "gpu-01", gpus=8, slots=8)
    _learn(sched, clock, w, "train", [100, 100, 100])  # three runs that took 100 s of their 1000 s limit
    started = clock.now
    sched.submit(job(gpus=8, name="train", timeout_seconds=1000))
    _run(sched, w)
    waiting = sched.submit(job(gpus=8, name="other", timeout_seconds=1000))
    assert _forecast(sched).estimates[waiting].at == started + 100


def _learn(sched, clock, w, name, runs, limit=1000):
    for seconds in runs:  # ended runs of `name` that took `seconds` of their `limit`
        sched.submit(job(gpus=8, name=name, timeout_seconds=limit))
        a = _run(sched, w)
        clock.advance(seconds)
        sched.finish(w, a["task_id"], exit_code=0, outcome="succeeded", outputs={}, reason=None)


def test_a_running_task_is_expected_to_run_the_median_of_the_runs_longer_than_its_own_so_far(sched, clock):
    w = add_worker(sched, "gpu-01", gpus=8, slots=8)
    _learn(sched, clock, w, "train", [100, 200, 300, 400, 500])
    started = clock.now
    sched.submit(job(gpus=8, name="train", timeout_seconds=1000))
    _run(sched, w)
    waiting = sched.submit(job(gpus=8, name="other", timeout_seconds=1000))
    assert _forecast(sched).estimates[waiting].at == started + 300  # not started long: the median of all five
    clock.advance(250)  # it outlived 100, 200 (and 250 s): the median of 300, 400 and 500
    assert _forecast(sched).estimates[waiting].at == started + 400
    clock.advance(300)  # 550 s: longer than every run learned, so it may end any moment
    assert _forecast(sched).estimates[waiting].at == clock.now


def test_without_history_a_running_task_is_judged_by_the_shares_of_their_limits_recent_runs_used(sched, clock):
    w = add_worker(sched, "gpu-01", gpus=8, slots=8)
    for i, seconds in enumerate([200, 400, 600]):  # unnamed, other commands: 20%, 40%, 60% of a 1000 s limit
        _learn(sched, clock, w, f"once-{i}", [seconds])
    started = clock.now
    sched.submit(job(gpus=8, timeout_seconds=2000))
    _run(sched, w)
    waiting = sched.submit(job(gpus=8, timeout_seconds=60))
    assert _forecast(sched).estimates[waiting].at == started + 800  # 40% of 2000 s
    clock.advance(900)  # it outlived 20% and 40%: 60% of its limit
    assert _forecast(sched).estimates[waiting].at == started + 1200


def test_each_forecast_is_written_to_the_estimates_table(sched, clock):
    w = add_worker(sched, "gpu-01", gpus=8, slots=8)
    sched.submit(job(gpus=8, timeout_seconds=600))
    _run(sched, w)
    waiting = sched.submit(job(gpus=8, timeout_seconds=60))
    held = sched.submit(job(gpus=1, hold=True))

    def table():
        return sched.store.read(lambda c: c.execute(
            "SELECT job_id, start_at, reason, workers, forecast_at FROM estimates ORDER BY job_id").fetchall())
    sched.estimates.refresh()
    assert [tuple(r.values()) for r in table()] == [
        (waiting, NOW + 600, None, '["gpu-01"]', NOW),
        (held, None, "held: it starts once released (`gpulayer job release`)", "[]", NOW)]
    sched.cancel(waiting)
    clock.advance(5)
    sched.estimates.refresh()
    assert [r["job_id"] for r in table()] == [held] and table()[0]["forecast_at"] == NOW + 5


def test_a_replay_stops_at_its_budget(sched):
    w = add_worker(sched, "gpu-01", gpus=8, slots=8)
    for _ in range(3):
        sched.submit(job(gpus=8, timeout_seconds=60))
    _run(sched, w)
    last = sched.submit(job(gpus=8))
    copy = sched.store.read(forecast.snapshot)
    found = forecast.replay(copy, NOW, [last], budget_s=0)[last]
    assert found.at is None and found.reason.startswith("not estimated: the replay ran out of its 0 s")
