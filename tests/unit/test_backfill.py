"""EASY backfill (issue 38 point 1) against real state files and a pinned clock: the plan (reservations.plan) gives
the highest-ranked waiting job of each group of workers the earliest room, the claims (acquire_one, acquire_task,
gang placement) honour it, and the plan moves a reservation when its worker leaves or a task overruns."""
from __future__ import annotations

import pytest

from gpulayer.server.scheduler import reservations, teams
from helpers import add_worker, job

BIG = dict(gpus=8, cpus=64, memory_mb=256000, slots=16)


def _run(sched, worker_id, spec, *, start=True):
    """Submit `spec`, have `worker_id` claim it (it must be the one it takes) and start it; the job id."""
    j = sched.submit(job(**spec))
    got = sched.acquire_many(worker_id, 0, 1)
    assert got and got[0]["job_id"] == j, got
    if start:
        sched.start(worker_id, got[0]["task_id"], 100)
    return j


def _plan(sched):
    return sched.plan_reservations()


def _reserved(sched):
    """{job id: (sorted worker ids, start_at)}."""
    out: dict = {}
    for r in sched.store.read(lambda c: c.execute("SELECT * FROM reservations ORDER BY job_id, worker_id").fetchall()):
        workers, _ = out.get(r["job_id"], ([], 0))
        out[r["job_id"]] = (workers + [r["worker_id"]], r["start_at"])
    return out


def _claims(sched, worker_id):
    return [a["job_id"] for a in sched.acquire_many(worker_id, 0, 1)]


def test_the_top_waiting_job_gets_the_earliest_room_and_a_short_job_backfills(sched, clock):
    w1, w2 = add_worker(sched, "w1", **BIG), add_worker(sched, "w2", **BIG)
    _run(sched, w1, dict(gpus=4, timeout_seconds=100))
    _run(sched, w2, dict(gpus=8, timeout_seconds=300))
    big = sched.submit(job(gpus=8))                      # fits no worker now
    assert _plan(sched) and _reserved(sched) == {big: ([w1], clock() + 100)}
    long = sched.submit(job(gpus=4, timeout_seconds=1000))  # would still hold w1's GPUs at the reservation
    short = sched.submit(job(gpus=4, timeout_seconds=50))   # the same shape, ends before it: backfilled
    assert _claims(sched, w1) == [short]
    assert sched.store.read(lambda c: c.execute("SELECT state FROM jobs WHERE id = ?", (long,)).fetchone())["state"] == "queued"
    assert _reserved(sched)[big] == ([w1], clock() + 100)


def test_several_claimed_at_once_never_take_reserved_room(sched, clock):
    w = add_worker(sched, "w", **BIG)
    _run(sched, w, dict(gpus=2, timeout_seconds=100))
    big = sched.submit(job(gpus=8))
    _plan(sched)
    assert big in _reserved(sched)
    ids = [sched.submit(job(gpus=1, timeout_seconds=t)) for t in (1000, 60, 1000, 90, 30)]
    got = [a["job_id"] for a in sched.acquire_many(w, 0, 8)]
    assert sorted(got) == [ids[1], ids[3], ids[4]]        # the three that end before the reservation's start


def test_room_beyond_the_reservation_is_anyones(sched, clock):
    """6 of 8 GPUs busy until +100, the top job asks 4: 8 are free then, 4 beyond it, so a long 2-GPU job may run."""
    w = add_worker(sched, "w", **BIG)
    _run(sched, w, dict(gpus=6, timeout_seconds=100))
    top = sched.submit(job(gpus=4))
    _plan(sched)
    assert _reserved(sched) == {top: ([w], clock() + 100)}
    long = sched.submit(job(gpus=2, timeout_seconds=10_000))
    assert _claims(sched, w) == [long]


def test_a_job_that_may_not_be_backfilled_waits(sched):
    w = add_worker(sched, "w", **BIG)
    _run(sched, w, dict(gpus=4, timeout_seconds=100))
    sched.submit(job(gpus=8))
    _plan(sched)
    sched.submit(job(gpus=4, timeout_seconds=10, backfill=False))
    assert _claims(sched, w) == []


def test_a_gang_reserves_workers_at_once_and_small_jobs_go_elsewhere(sched, clock):
    w1, w2, w3 = (add_worker(sched, f"w{i}", **BIG) for i in (1, 2, 3))
    for w, limit in ((w1, 100), (w2, 200), (w3, 500)):
        _run(sched, w, dict(gpus=4, timeout_seconds=limit))
    gang = sched.submit(job(gpus=8, nodes=2))
    _plan(sched)
    assert _reserved(sched) == {gang: ([w1, w2], clock() + 200)}
    small = sched.submit(job(gpus=1, timeout_seconds=1000))
    assert _claims(sched, w1) == [] and _claims(sched, w2) == [] and _claims(sched, w3) == [small]
    short = sched.submit(job(gpus=1, timeout_seconds=150))
    assert _claims(sched, w2) == [short]  # ends at +150, before the gang's start at +200


def test_another_gang_does_not_take_reserved_workers(sched, clock):
    w1, w2, w3 = (add_worker(sched, f"w{i}", **BIG) for i in (1, 2, 3))
    _run(sched, w1, dict(gpus=8, timeout_seconds=100))
    wide = sched.submit(job(gpus=8, nodes=3))
    _plan(sched)
    assert _reserved(sched)[wide][0] == [w1, w2, w3]
    narrow = sched.submit(job(gpus=8, nodes=2, timeout_seconds=1000))
    assert _claims(sched, w2) == [] and _claims(sched, w3) == []
    assert sched.store.read(lambda c: c.execute("SELECT state FROM jobs WHERE id = ?", (narrow,)).fetchone())["state"] == "queued"


def _cordon(sched, worker_id):
    sched.cordon("w1", "maintenance")


def _offline(sched, worker_id):
    sched.store.write(lambda c: c.execute("UPDATE workers SET state = 'offline' WHERE id = ?", (worker_id,)))


@pytest.mark.parametrize("leave", [_cordon, _offline])
def test_a_worker_that_is_cordoned_or_goes_offline_loses_the_reservation_and_it_moves(sched, clock, leave):
    w1, w2 = add_worker(sched, "w1", **BIG), add_worker(sched, "w2", **BIG)
    _run(sched, w1, dict(gpus=4, timeout_seconds=100))
    _run(sched, w2, dict(gpus=4, timeout_seconds=300))
    big = sched.submit(job(gpus=8))
    _plan(sched)
    assert _reserved(sched) == {big: ([w1], clock() + 100)}
    leave(sched, w1)
    assert _reserved(sched) == {}                        # released in that same transaction
    _plan(sched)
    assert _reserved(sched) == {big: ([w2], clock() + 300)}


def test_an_overrunning_task_moves_the_reservation_and_nothing_is_killed(sched, clock):
    w = add_worker(sched, "w", **BIG)
    first = _run(sched, w, dict(gpus=4, timeout_seconds=100))
    big = sched.submit(job(gpus=8))
    _plan(sched)
    clock.advance(150)                                   # past its expected end, still running
    _plan(sched)
    assert _reserved(sched) == {big: ([w], clock() + reservations.OVERRUN_S)}  # it may end any time now
    sched.submit(job(gpus=4, timeout_seconds=60))
    assert _claims(sched, w) == []                       # nothing ends by now: no backfill into the room
    states = sched.store.read(lambda c: [r["state"] for r in c.execute("SELECT state FROM tasks WHERE job_id = ?", (first,))])
    assert states == ["running"]


def test_each_group_of_workers_has_its_own_top_job(sched, clock):
    a = add_worker(sched, "a", labels={"pool": "a"}, **BIG)
    b = add_worker(sched, "b", labels={"pool": "b"}, **BIG)
    _run(sched, a, dict(gpus=4, timeout_seconds=100, labels={"pool": "a"}))
    _run(sched, b, dict(gpus=4, timeout_seconds=200, labels={"pool": "b"}))
    ja, ja2 = sched.submit(job(gpus=8, labels={"pool": "a"})), sched.submit(job(gpus=8, labels={"pool": "a"}))
    jb = sched.submit(job(gpus=8, labels={"pool": "b"}))
    _plan(sched)
    assert _reserved(sched) == {ja: ([a], clock() + 100), jb: ([b], clock() + 200)}
    assert ja2 not in _reserved(sched)                   # depth 1: one reservation per group


def test_no_reservation_for_a_job_that_cannot_run(sched, clock):
    w = add_worker(sched, "w", **BIG)
    _run(sched, w, dict(gpus=4, timeout_seconds=100))
    sched.change_teams(teams.add_project, {"name": "small", "gpus": 4, "max_priority": 10})
    from gpulayer.server.security.auth import Principal
    uid = sched.change_teams(teams.add_user, "ann", False, [("small", "member")], None)
    ann = Principal(kind="client", jti="jti-ann", name="ann", user_id=uid, user="ann", admin=False)
    sched.submit(job(gpus=8), ann, "small")             # over its project's quota, no borrowing
    held = sched.submit(job(gpus=8, hold=True))
    later = sched.submit(job(gpus=8, begin_at=clock() + 3600))
    after = sched.submit(job(gpus=8, after=[held]))
    _plan(sched)
    assert _reserved(sched) == {}
    top = sched.submit(job(gpus=8))
    _plan(sched)
    assert set(_reserved(sched)) == {top} and {later, after}.isdisjoint(_reserved(sched))


def test_backfill_off_holds_no_reservation(sched, store, config, clock):
    w = add_worker(sched, "w", **BIG)
    _run(sched, w, dict(gpus=4, timeout_seconds=100))
    sched.submit(job(gpus=8))
    _plan(sched)
    assert _reserved(sched)
    store.write(lambda c: c.execute("UPDATE scheduler_settings SET backfill = 0"))
    assert _plan(sched) == [] and _reserved(sched) == {}
    long = sched.submit(job(gpus=4, timeout_seconds=10_000))
    assert _claims(sched, w) == [long]                   # greedy, as before issue 38


def test_a_plan_made_again_after_a_restart_is_the_same(sched, store, config, clock):
    from gpulayer.server.scheduler.core import Scheduler
    w = add_worker(sched, "w", **BIG)
    _run(sched, w, dict(gpus=4, timeout_seconds=100))
    sched.submit(job(gpus=8))
    _plan(sched)
    before = _reserved(sched)
    again = Scheduler(store, config, clock)
    again.restarted()
    again.plan_reservations()
    assert _reserved(again) == before


@pytest.mark.parametrize("start_in", [0.0, 50.0])
def test_earliest_reads_each_workers_timeline(start_in):
    w = reservations.Worker(1, "w", (4, 4, 8, 1000))
    w.changes.append((100.0, (1, 4, 0, 0)))             # a task ends at 100: 8 GPUs from then
    group = frozenset({1})
    assert reservations._earliest({1: w}, group, (1, 8, 1, 1), 1, start_in, 60) == (100.0, [1])
    w.take((1, 8, 1, 1), 100.0, 160.0)                  # a reservation from 100 to 160
    assert reservations._earliest({1: w}, group, (1, 2, 1, 1), 1, start_in, 30) == (start_in, [1])
    assert reservations._earliest({1: w}, group, (1, 2, 1, 1), 1, start_in, 200) == (160.0, [1])


def test_earliest_prefers_the_workers_busy_now_so_idle_ones_stay_open_to_backfill():
    idle = reservations.Worker(1, "idle", (2, 8, 8, 1000))
    busy = [reservations.Worker(i, f"busy{i}", (1, 0, 8, 1000)) for i in (2, 3)]
    for w in busy:
        w.changes.append((100.0, (1, 8, 0, 0)))  # each frees its 8 GPUs at 100
    workers = {w.id: w for w in (idle, *busy)}
    # a gang of two 8-GPU ranks starts at 100 at the earliest; all three are as tight then: the two busy now
    assert reservations._earliest(workers, frozenset(workers), (1, 8, 1, 1), 2, 0.0, 60) == (100.0, [2, 3])


def test_the_job_shows_its_reservation_and_its_waiting_reason_says_it(sched, clock):
    from helpers import state_of
    w1, w2 = add_worker(sched, "gpu-03", **BIG), add_worker(sched, "gpu-04", **BIG)
    _run(sched, w1, dict(gpus=4, timeout_seconds=100))
    _run(sched, w2, dict(gpus=4, timeout_seconds=200))
    gang = sched.submit(job(gpus=8, nodes=2))
    assert state_of(sched, gang)["reservation"] is None
    _plan(sched)
    shown = state_of(sched, gang)
    assert shown["reservation"] == {"workers": ["gpu-03", "gpu-04"], "start_at": clock() + 200}
    assert "reserved: gpu-03, gpu-04 from 2023-11-14T22:16:40Z" in shown["waiting_reason"], shown["waiting_reason"]
    sched.cancel(gang)
    assert state_of(sched, gang)["reservation"] is None


def test_no_reservation_for_a_job_waiting_on_a_missing_secret(sched):
    w = add_worker(sched, "w", **BIG)
    _run(sched, w, dict(gpus=4, timeout_seconds=100))
    sched.set_secret("TOKEN", "s3cret", {})
    needs = sched.submit(job(gpus=8, secrets=["TOKEN"]))
    sched.delete_secret("TOKEN")                         # deleted since submit: it waits until set again
    _plan(sched)
    assert needs not in _reserved(sched)
    sched.set_secret("TOKEN", "s3cret", {})
    _plan(sched)
    assert needs in _reserved(sched)


def test_a_job_ranked_higher_that_fits_now_is_not_kept_out_by_the_next_ones_reservation(sched, clock):
    """The plan takes the top job as starting now; the next one gets no reservation on that worker this tick, so
    the top job's claim (after the plan, so ending a little later than the plan thought) still gets the room."""
    w = add_worker(sched, "w", **BIG)
    first = _run(sched, w, dict(gpus=8, timeout_seconds=100))
    sched.store.write(lambda c: c.execute("UPDATE tasks SET state = 'succeeded', finished_at = 1, outcome = 'succeeded' "
                                          "WHERE job_id = ?", (first,)))
    high = sched.submit(job(gpus=8, priority=10))
    low = sched.submit(job(gpus=8, priority=-10))
    _plan(sched)
    assert _reserved(sched) == {}
    clock.advance(1)
    assert _claims(sched, w) == [high]
    _plan(sched)
    assert list(_reserved(sched)) == [low]


def test_the_first_claim_after_the_queue_changed_plans_again(sched, clock):
    """Upkeep plans every tick, but a claim comes at once after a submit or a finish: it plans again first, so
    a job submitted since the last tick is judged by its reservation, not by none (as EASY replans each event)."""
    w1, w2 = add_worker(sched, "w1", **BIG), add_worker(sched, "w2", **BIG)
    _run(sched, w1, dict(gpus=8, timeout_seconds=2000))
    _run(sched, w2, dict(gpus=4, timeout_seconds=100))
    assert _plan(sched) == []                                   # the last tick's plan: nothing waits
    big = sched.submit(job(gpus=8, timeout_seconds=100))        # its earliest room: w2 at +100
    long = sched.submit(job(gpus=4, timeout_seconds=5000))      # fits w2 now, would hold it past +100
    assert _claims(sched, w2) == []
    assert _reserved(sched) == {big: ([w2], clock() + 100)}
    short = sched.submit(job(gpus=4, timeout_seconds=50))
    assert _claims(sched, w2) == [short]
    assert sched.store.read(lambda c: c.execute("SELECT state FROM jobs WHERE id = ?", (long,)).fetchone())["state"] == "queued"


def test_the_claim_after_a_finish_starts_the_reserved_job_and_reserves_for_the_next(sched, clock):
    w1, w2 = add_worker(sched, "w1", **BIG), add_worker(sched, "w2", **BIG)
    _run(sched, w1, dict(gpus=4, timeout_seconds=100))
    _run(sched, w2, dict(gpus=4, timeout_seconds=300))
    first = sched.submit(job(gpus=8, timeout_seconds=100))
    second = sched.submit(job(gpus=8, timeout_seconds=100))
    sched.submit(job(gpus=4, timeout_seconds=5000))             # fits w2 now, would hold it past +200
    _plan(sched)
    assert _reserved(sched) == {first: ([w1], clock() + 100)}
    clock.advance(100)
    w1_task = sched.store.read(lambda c: c.execute(
        "SELECT id FROM tasks WHERE worker_id = ? AND state = 'running'", (w1,)).fetchone())["id"]
    sched.finish(w1, w1_task, exit_code=0, outcome="succeeded", outputs={}, reason=None)
    assert _claims(sched, w1) == [first]                        # the reserved job starts; its reservation goes
    assert _claims(sched, w2) == []                             # `long` would hold w2 past `second`'s start
    assert _reserved(sched) == {second: ([w2], clock() + 200)}


def test_a_gangs_ranks_ending_milliseconds_apart_are_one_end_so_the_idle_workers_stay_open(sched, clock):
    """A gang's ranks start a few milliseconds apart, so they are expected to end so: the strict earliest start of
    a 4-worker reservation is when the first two ranks' workers and the two idle ones are free, and it took the
    idle ones. Ends under SAME_END_S apart are one end: it takes the four busy workers, and a long 2-worker gang
    runs on the idle two now (bench_trace.py's tail: a 16-GPU job waited 6 s beside two idle workers)."""
    ws = [add_worker(sched, f"w{i}", **BIG) for i in range(1, 5)]
    sched.submit(job(gpus=8, nodes=4, timeout_seconds=100))
    for w in ws:
        got = sched.acquire_many(w, 0, 1)
        sched.start(w, got[0]["task_id"], 100)
        clock.advance(0.01)
    idle = [add_worker(sched, f"w{i}", **BIG) for i in (5, 6)]
    big = sched.submit(job(gpus=8, nodes=4, timeout_seconds=50))
    pair = sched.submit(job(gpus=8, nodes=2, timeout_seconds=1000))
    _plan(sched)
    workers, start = _reserved(sched)[big]
    assert sorted(workers) == sorted(ws) and start == pytest.approx(clock() + 100 - 0.01, abs=1e-6)
    assert _claims(sched, idle[0]) == [pair]


def test_past_the_depth_a_job_is_only_looked_at_now_and_the_plan_is_the_same(sched, clock, monkeypatch):
    # A deep queue behind a group's reservation: each job past the depth is asked only whether it starts now
    # (one look), not when it could (a walk over every later end); what is reserved does not change.
    w = add_worker(sched, "w", **BIG)
    _run(sched, w, dict(gpus=4, timeout_seconds=100))
    big = sched.submit(job(gpus=8))
    for t in (50, 1000, 70, 2000):
        sched.submit(job(gpus=2, timeout_seconds=t))
    for _ in range(20):
        sched.submit(job(gpus=8, timeout_seconds=10))
    walks = []
    earliest = reservations._earliest
    monkeypatch.setattr(reservations, "_earliest", lambda *a, **k: walks.append(a) or earliest(*a, **k))
    assert _plan(sched) and _reserved(sched) == {big: ([w], clock() + 100)}
    assert len(walks) == 2  # the reserved job's two (any worker, then none a higher job starts on), none else


def test_a_run_expected_to_take_no_time_holds_no_room_and_adds_no_change():
    w = reservations.Worker(1, "w", (2, 0, 4, 1000))
    w.take((1, 0, 1, 10), 5.0, 5.0)  # a `true` whose history says 0 s
    assert w.changes == [] and w.holds((2, 0, 4, 1000), 5.0, 6.0)
    w.take((1, 0, 1, 10), 5.0, 7.0)
    assert not w.holds((2, 0, 4, 1000), 5.0, 6.0) and w.holds((2, 0, 4, 1000), 7.0, 8.0)
