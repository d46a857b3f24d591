"""Upkeep named (gpulayer/server/upkeep.py, server/process.py `upkeep_jobs`): a job that raises every time is
logged by name and counted, and the jobs after it in the table still run on their own intervals; /metrics shows
each job's runs and failures. A real state file, the scheduler's clock and upkeep's monotonic clock both pinned."""
from __future__ import annotations

import logging

import pytest

from gpulayer.server.process import upkeep_jobs
from gpulayer.server.upkeep import DEADLINE_MARGIN_S, Job, Stats, Upkeep

ORDER = ["cascades", "expire", "fairshare", "begin_due", "preempt", "idle", "reservations", "drains", "rollouts", "autoscale",
         "service_drains", "prune", "sweep", "estimates"]


def test_the_table_keeps_the_order_and_intervals(deps):
    jobs = upkeep_jobs(deps)
    assert [j.name for j in jobs] == ORDER
    every = {j.name: (j.every_s, j.first_s) for j in jobs}
    assert every["expire"] == every["begin_due"] == every["drains"] == every["reservations"] == (0, 0)
    assert every["fairshare"] == (5.0, 0)
    assert every["idle"] == (deps.config.idle_check_interval_s, 0)   # --idle-check-interval
    assert every["prune"] == (deps.config.prune_interval_s, min(deps.config.prune_interval_s, 60.0))
    assert every["sweep"] == (deps.config.artifact_sweep_interval_s, deps.config.artifact_sweep_interval_s)


def test_a_job_failing_every_time_stops_none_of_the_others(api, deps, client_h, clock, monkeypatch, caplog):
    answer = api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["true"], "begin_at": clock.now + 10})
    job_id = answer.json["id"]
    clock.advance(11)   # its begin time has come: begin_due, after expire in the table, releases it

    def broken():
        raise RuntimeError("expire is broken")
    monkeypatch.setattr(deps.scheduler, "expire", broken)
    ticks = type(clock)(0.0)   # upkeep's monotonic clock, pinned too
    upkeep = Upkeep(upkeep_jobs(deps), deps.upkeep, clock=ticks)
    with caplog.at_level(logging.ERROR, logger="gpulayer.server.upkeep"):
        for _ in range(3):
            upkeep.tick()
            ticks.advance(1.0)
    failed = [r for r in caplog.records if r.getMessage() == "upkeep_job_failed job=expire"]
    assert len(failed) == 3 and all(r.exc_info for r in failed)
    assert api.simulate_get(f"/v1/jobs/{job_id}", headers=client_h).json["state"] == "queued"

    stats = deps.upkeep.snapshot()
    assert (stats["expire"].runs, stats["expire"].failures) == (3, 3)
    for name in ("cascades", "begin_due", "preempt", "reservations", "drains"):
        assert (stats[name].runs, stats[name].failures) == (3, 0), name
    assert stats["fairshare"].runs == stats["idle"].runs == 1            # every 5 s, every 10 s
    assert "prune" not in stats and "sweep" not in stats   # first after 60 s and after the sweep interval
    ticks.advance(60.0)
    upkeep.tick()
    assert deps.upkeep.snapshot()["prune"].runs == 1

    text = api.simulate_get("/metrics", headers=client_h).text
    assert 'gpulayer_upkeep_failures_total{job="expire"} 4.0' in text
    assert 'gpulayer_upkeep_runs_total{job="expire"} 4.0' in text
    assert 'gpulayer_upkeep_runs_total{job="begin_due"} 4.0' in text
    assert 'gpulayer_upkeep_failures_total{job="begin_due"} 0.0' in text
    assert 'gpulayer_upkeep_last_duration_seconds{job="prune"}' in text


def test_a_failure_while_stopping_is_not_logged(clock, caplog):
    def broken():
        raise RuntimeError("the state file is closed")
    stats = Stats()
    upkeep = Upkeep([Job("broken", 0, broken)], stats, clock=clock, stopping=lambda: True)
    with caplog.at_level(logging.ERROR, logger="gpulayer.server.upkeep"):
        upkeep.tick()
    assert not caplog.records and stats.snapshot() == {}


def test_a_job_with_a_deadline_runs_alone_at_it_and_never_spins(clock):
    due: list[float | None] = [None]
    ran: list[str] = []
    upkeep = Upkeep([Job("tick", 0, lambda: ran.append("tick")),
                     Job("deadline", 0, lambda: ran.append("deadline"), due_in=lambda: due[0])], Stats(), clock=clock)
    next_tick = clock.now + 0.5
    assert upkeep.next_wait(next_tick) == (0.5, None)                         # no deadline: the tick, every job
    due[0] = 0.2
    wait, early = upkeep.next_wait(next_tick)
    assert wait == pytest.approx(0.2 + DEADLINE_MARGIN_S) and early == {"deadline"}   # just past it, that job alone
    upkeep.tick(early)
    assert ran == ["deadline"]
    due[0] = 3.0
    assert upkeep.next_wait(next_tick) == (0.5, None)                         # past the tick: changes nothing
    due[0] = 0.0
    assert upkeep.next_wait(next_tick) == (0.5, None)                         # past: the run that ran saw it
