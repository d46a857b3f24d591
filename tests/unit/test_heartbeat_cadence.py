"""The heartbeat interval scaled with the fleet and jittered, and the lease TTL that follows it
(runtime/cadence.py): the formula and its bounds, then the scheduler's answers and leases."""

from __future__ import annotations

import dataclasses

import pytest

from gpulayer.server.scheduler.core import Scheduler
from gpulayer.server.runtime.cadence import Cadence, fleet_scale, jitter_cap, spread_of

from helpers import add_worker, job

RUNNING = {"state": "running", "endpoint": None, "restarts": 0}


def test_the_scale_keeps_the_fleet_under_the_rate_and_never_below_the_base():
    assert fleet_scale(0, 2.0, 500) == 1.0
    assert fleet_scale(1000, 2.0, 500) == 1.0  # 1,000 beats every 2 s: 500/s, the target
    assert fleet_scale(2000, 2.0, 500) == 2.0  # twice the fleet: twice the interval
    assert fleet_scale(5000, 2.0, 50) == 50.0  # Nomad's default rate
    assert fleet_scale(10**6, 2.0, 0) == 1.0  # 0: never scaled
    for n in (1, 999, 1001, 3333, 10**5):
        interval = 2.0 * fleet_scale(n, 2.0, 500)
        assert interval >= 2.0 and n / interval <= 500 + 1e-9


def test_the_jitter_never_makes_an_interval_longer_than_a_third_of_the_ttl():
    assert jitter_cap(2.0, 20.0, 0.2) == 0.2
    assert jitter_cap(2.0, 6.0, 0.2) == 0.0  # the benches' tight TTL: no jitter
    assert jitter_cap(2.0, 7.2, 0.5) == pytest.approx(0.2)
    assert jitter_cap(2.0, 20.0, 0.0) == 0.0


def test_each_worker_has_its_own_jitter_upwards_only_and_the_ttl_scales_with_the_fleet():
    c = Cadence(2.0, 20.0, 500, 0.2)
    c.fleet(3000)
    told = [c.interval_s(w) for w in range(1, 1001)]
    assert c.interval_s() == 6.0  # no worker: no jitter
    assert all(6.0 <= t <= 7.2 for t in told)
    assert told == [c.interval_s(w) for w in range(1, 1001)]  # the same in every answer: no log line per beat
    assert len(set(told)) > 900 and 6.5 < sum(told) / len(told) < 6.7  # spread evenly: no lockstep
    assert [spread_of(w) < 0.5 for w in range(1, 9)].count(True) in range(2, 7)
    assert c.lease_ttl_s() == 60.0 >= 3 * max(told) * 2  # the TTL held stays many intervals long


def test_a_shrinking_fleet_keeps_the_longer_ttl_for_one_longer_ttl(clock):
    c = Cadence(2.0, 20.0, 500, 0.2, clock=clock)
    c.fleet(4000)
    assert (c.interval_s(), c.lease_ttl_s()) == (8.0, 80.0)
    c.fleet(500)  # the fleet shrank: the interval asked for falls at once, the TTL given does not
    assert (c.interval_s(), c.lease_ttl_s()) == (2.0, 80.0)
    clock.advance(79.0)
    assert c.lease_ttl_s() == 80.0
    clock.advance(1.5)
    assert c.lease_ttl_s() == 20.0
    c.fleet(4000)  # growing lengthens the TTL at once
    assert c.lease_ttl_s() == 80.0


def test_at_start_up_the_fleet_scale_is_held_one_ttl(clock):
    c = Cadence(2.0, 20.0, 500, 0.2, clock=clock)
    c.fleet(2000, hold=True)
    c.fleet(0)  # the first upkeep finds fewer online: the TTL of the process before still holds
    assert c.lease_ttl_s() == 40.0
    clock.advance(41.0)
    assert c.lease_ttl_s() == 20.0


@pytest.fixture
def small_rate(store, config, clock):
    """A scheduler whose fleet target is 4 heartbeats/s: past 2 workers (0.5 s base) the interval grows."""
    return Scheduler(store, dataclasses.replace(config, max_heartbeats_per_s=4.0, heartbeat_jitter=0.0), clock)


def test_the_answer_interval_and_the_lease_grow_with_the_online_fleet(small_rate, clock):
    sched = small_rate
    first = add_worker(sched, "w0")
    assert sched.heartbeat_terms()["heartbeat_interval_s"] == 0.5
    for i in range(1, 8):
        add_worker(sched, f"w{i}")
    sched.expire()  # upkeep counts the online fleet: 8 workers at 4/s want 2 s
    assert sched.heartbeat_terms()["heartbeat_interval_s"] == 2.0
    answer = sched.heartbeat(first, [])
    assert answer["lease_expires_at"] == clock.now + 12.0  # the 3 s TTL times 4


def test_a_fleet_on_the_longer_interval_is_never_falsely_lost(small_rate, clock):
    sched = small_rate
    ids = [add_worker(sched, f"w{i}") for i in range(8)]
    sched.submit(job())
    task = sched.acquire(ids[0])
    sched.start(ids[0], task["task_id"], 100)
    sched.expire()
    interval = sched.heartbeat_terms()["heartbeat_interval_s"]
    assert interval == 2.0
    for _ in range(10):  # 20 s at the told interval, 5 base TTLs
        clock.advance(interval)
        for w in ids:
            sched.heartbeat(w, [{"task_id": task["task_id"], **RUNNING}] if w == ids[0] else [])
        assert sched.expire() == {"tasks_lost": 0, "workers_offline": 0, "gangs_released": 0}
    # The fleet shrinks to 2: the interval falls to 0.5 s, but a worker told 2 s just before keeps its lease
    # until its next answer tells it the shorter one.
    for w in ids[2:]:
        sched.deregister(w)
    clock.advance(0.2)
    sched.expire()
    assert sched.heartbeat_terms()["heartbeat_interval_s"] == 0.5
    clock.advance(interval - 0.2)
    sched.heartbeat(ids[0], [{"task_id": task["task_id"], **RUNNING}])
    sched.heartbeat(ids[1], [])
    assert sched.expire()["tasks_lost"] == 0
    clock.advance(12.1)  # silent past the held TTL: lost as usual
    assert sched.expire() == {"tasks_lost": 1, "workers_offline": 2, "gangs_released": 0}


def test_old_agents_on_the_base_interval_keep_a_ttl_that_covers_them(small_rate, clock):
    sched = small_rate
    ids = [add_worker(sched, f"w{i}") for i in range(8)]
    sched.expire()
    for _ in range(20):  # they ignore the 2 s asked and beat every 0.5 s: the TTL only grew for them
        clock.advance(0.5)
        for w in ids:
            assert sched.heartbeat(w, [])["lease_expires_at"] == clock.now + 12.0
        assert sched.expire()["workers_offline"] == 0


def test_a_restart_gives_the_scaled_fleet_one_scaled_ttl(small_rate, store, config, clock):
    sched = small_rate
    for i in range(8):
        add_worker(sched, f"w{i}")
    sched.expire()
    clock.advance(60)  # the control plane was down a minute
    again = Scheduler(store, dataclasses.replace(config, max_heartbeats_per_s=4.0, heartbeat_jitter=0.0), clock)
    assert again.restarted() == {"tasks": 0, "workers": 8}
    assert again.heartbeat_terms()["heartbeat_interval_s"] == 2.0
    clock.advance(11.9)  # the workers were told 2 s; the grace is the scaled TTL, 12 s
    assert again.expire()["workers_offline"] == 0
    clock.advance(0.2)
    assert again.expire()["workers_offline"] == 8


@pytest.mark.parametrize("request_kind", ["acquire", "start", "logs", "finish"])
def test_every_worker_request_renews_like_a_heartbeat(sched, clock, request_kind):
    w = add_worker(sched)
    add_worker(sched, "other")  # makes no request: it goes offline
    sched.submit(job())
    sched.submit(job())
    task = sched.acquire(w)
    if request_kind != "start":
        sched.start(w, task["task_id"], 100)
    sched.expire()
    clock.advance(2.5)  # within the 3 s TTL of the last request, and nothing since
    if request_kind == "acquire":
        sched.acquire(w)  # the worker is busy (one slot): nothing for it, but it was seen
    elif request_kind == "start":
        sched.start(w, task["task_id"], 100)
    elif request_kind == "logs":
        sched.logs(w, task["task_id"], [{"n": 0, "stream": "stdout", "text": "hi", "at": clock.now}])
    else:
        sched.finish(w, task["task_id"], exit_code=0, outcome="succeeded", outputs={}, reason=None)
    clock.advance(2.9)  # 5.4 s after the last heartbeat-like write, 2.9 s after this request
    result = sched.expire()
    assert result["workers_offline"] == 1  # only `other`, which made no request
    assert result["tasks_lost"] == 0
    online = sched.store.read(lambda c: c.execute("SELECT id FROM workers WHERE state = 'online'").fetchall())
    assert online == [{"id": w}]
