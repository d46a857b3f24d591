"""Idle GPUs taken back (issue 40, point 2; scheduler/idle.py, queries/idle.sql): the decision from gpu_samples
(every held GPU under the threshold for the whole timeout; gaps are not idleness), the policy's precedence (job,
project, fleet), the three actions (notify, requeue as preemption does, cancel), interactive work warned first,
and bad policies refused. A real state file and the in-process scheduler, its clock pinned; samples go through
the heartbeat's buffer and upkeep's flush as a worker's do."""
from __future__ import annotations

import dataclasses
import json

import pytest

from gpulayer.server.errors import InvalidRequest
from gpulayer.server.scheduler import teams
from gpulayer.server.scheduler.core import Scheduler

from helpers import add_worker, events_of, job, state_of

H = 0.5  # the config fixture's heartbeat interval: one sample per GPU per heartbeat


@pytest.fixture
def fleet(store, config, clock):
    """A scheduler whose fleet default is: 10 s under 5% -> notify, a warned interactive task has 4 s."""
    return Scheduler(store, dataclasses.replace(config, idle_timeout_s=10.0, idle_warning_s=4.0), clock)


def running(sched, w, **spec):
    """A submitted job of one task on worker w, started: (job id, task id, its GPU indices)."""
    job_id = sched.submit(job(gpus=spec.pop("gpus", 1), **spec))
    a = sched.acquire(w)
    sched.start(w, a["task_id"], 100)
    return job_id, a["task_id"], a["gpus"]


def beats(sched, clock, w, task_ids, utils, seconds, *, skip=()):
    """Heartbeats every H for `seconds`, each with one sample per GPU (utils: {index: %}); upkeep flushes
    each tick. Beats whose step is in `skip` bring no samples (a gap)."""
    for step in range(int(seconds / H)):
        clock.advance(H)
        samples = [] if step in skip else [
            {"index": i, "at": clock.now, "utilization_pct": u, "memory_used_mb": 1, "memory_total_mb": 80}
            for i, u in utils.items()]
        sched.heartbeat(w, [{"task_id": t, "state": "running", "endpoint": None, "restarts": 0} for t in task_ids],
                        samples=samples)
        sched.expire()


def idle_events(sched, job_id):
    return [e["data"] for e in events_of(sched, job_id) if e["kind"] == "task_idle"]


def test_idle_past_the_timeout_is_notified_once_with_its_samples(fleet, clock):
    w = add_worker(fleet, gpus=2)
    job_id, task_id, gpus = running(fleet, w, gpus=2)
    beats(fleet, clock, w, [task_id], {0: 1.0, 1: 0.0}, 9)
    assert fleet.reclaim_idle() == []            # not yet the whole timeout
    beats(fleet, clock, w, [task_id], {0: 1.0, 1: 0.0}, 2)
    assert fleet.reclaim_idle() == [(task_id, "notify")]
    (seen,) = idle_events(fleet, job_id)
    assert seen["action"] == "notify" and seen["timeout_s"] == 10 and seen["below_pct"] == 5
    assert [g["index"] for g in seen["gpus"]] == [0, 1] and seen["gpus"][0]["peak_pct"] == 1.0
    assert all(g["samples"] >= 19 and len(g["series"]) == g["samples"] for g in seen["gpus"])
    beats(fleet, clock, w, [task_id], {0: 1.0, 1: 0.0}, 2)
    assert fleet.reclaim_idle() == []            # once per assignment
    assert state_of(fleet, job_id)["state"] == "running"


def test_busy_at_6_percent_or_on_one_gpu_is_never_touched(fleet, clock):
    w = add_worker(fleet, gpus=2, slots=2)
    _, six, _ = running(fleet, w)
    _, one_busy, _ = running(fleet, w)
    utils = {0: 6.0, 1: 0.0}   # the first task holds GPU 0 at 6%, the second GPU 1 idle
    beats(fleet, clock, w, [six, one_busy], utils, 4)
    beats(fleet, clock, w, [six, one_busy], {0: 6.0, 1: 90.0}, 0.5)   # one busy sample in the second's window
    beats(fleet, clock, w, [six, one_busy], utils, 8)
    assert fleet.reclaim_idle() == []
    beats(fleet, clock, w, [six, one_busy], utils, 4)   # the busy sample has left the window: now it is idle
    assert fleet.reclaim_idle() == [(one_busy, "notify")]


def test_gaps_in_the_samples_are_not_idleness(fleet, clock):
    w = add_worker(fleet, gpus=1)
    _, task_id, _ = running(fleet, w)
    beats(fleet, clock, w, [task_id], {}, 12)                          # no samples at all
    assert fleet.reclaim_idle() == []
    beats(fleet, clock, w, [task_id], {0: 0.0}, 11, skip=range(8, 14))  # 3 s without samples in the window
    assert fleet.reclaim_idle() == []
    beats(fleet, clock, w, [task_id], {0: None}, 11)                    # NVML could not tell: busy
    assert fleet.reclaim_idle() == []


def test_requeue_stops_it_as_a_preemption_and_keeps_the_attempt(sched, clock):
    w = add_worker(sched, gpus=1)
    job_id, task_id, _ = running(sched, w, idle_timeout_seconds=5, idle_action="requeue", idle_below_pct=10)
    beats(sched, clock, w, [task_id], {0: 9.0}, 6)
    assert sched.reclaim_idle() == [(task_id, "requeue")]
    answer = sched.heartbeat(w, [{"task_id": task_id, "state": "running", "endpoint": None, "restarts": 0}])
    assert answer["cancel_task_ids"] == [task_id] and answer["preempted_task_ids"] == [task_id]
    assert sched.finish(w, task_id, exit_code=143, outcome="cancelled", outputs={}, reason=None)
    info = state_of(sched, job_id)
    assert info["state"] == "queued" and info["attempt"] == 1
    assert [(t["state"], t["reason"]) for t in info["tasks"]] == [("queued", "preempted")]
    preempted = [e["data"] for e in events_of(sched, job_id) if e["kind"] == "task_preempted"]
    assert preempted[0]["reason"] == "idle"
    again = sched.acquire(w)   # placed again: judged afresh, its old samples before its start do not count
    sched.start(w, again["task_id"], 101)
    beats(sched, clock, w, [again["task_id"]], {0: 0.0}, 3)
    assert sched.reclaim_idle() == [] and again["env"]["GPULAYER_PREEMPTED"] == "1"


def test_cancel_ends_the_job_and_an_array_element_alone(sched, clock):
    w = add_worker(sched, gpus=2, slots=2)
    whole, task_id, _ = running(sched, w, idle_timeout_seconds=5, idle_action="cancel")
    array = sched.submit(job(gpus=1, array="0-1", idle_timeout_seconds=5, idle_action="cancel"))
    element = sched.acquire(w)
    sched.start(w, element["task_id"], 100)
    beats(sched, clock, w, [task_id, element["task_id"]], {0: 0.0, 1: 0.0}, 6)
    assert sorted(sched.reclaim_idle()) == sorted([(task_id, "cancel"), (element["task_id"], "cancel")])
    assert state_of(sched, whole)["state"] == "cancelled"
    assert state_of(sched, array)["state"] in ("queued", "running")   # the other element still to run


def test_interactive_work_is_warned_first_and_acted_on_after_the_warning(fleet, clock):
    w = add_worker(fleet, gpus=1)
    job_id, task_id, _ = running(fleet, w, idle_action="cancel")
    fleet.store.write(lambda c: c.execute(
        "INSERT INTO sessions (worker_id, job_id, task_id, user, kind, opened_at) VALUES (?, ?, ?, 'user:a', 'ssh', ?)",
        (w, job_id, task_id, clock.now)))
    beats(fleet, clock, w, [task_id], {0: 0.0}, 11)
    assert fleet.reclaim_idle() == [(task_id, "warn")]
    beats(fleet, clock, w, [task_id], {0: 0.0}, 2)
    assert fleet.reclaim_idle() == []            # its warning period (4 s) runs
    beats(fleet, clock, w, [task_id], {0: 0.0}, 2.5)
    assert fleet.reclaim_idle() == [(task_id, "cancel")]
    assert [e["action"] for e in idle_events(fleet, job_id)] == ["warn", "cancel"]
    assert idle_events(fleet, job_id)[0]["interactive"] is True


def test_the_job_overrides_its_project_which_overrides_the_fleet(fleet, clock):
    fleet.change_teams(teams.add_project, {"name": "ml", "idle_timeout_seconds": 3, "idle_action": "requeue"})
    fleet.change_teams(teams.set_project, "default", {"idle_below_pct": 50.0})
    w = add_worker(fleet, gpus=3, slots=3)
    fleet.submit(job(gpus=1), None, "ml")                           # ml's: 3 s, requeue, fleet's 5%
    ml = fleet.acquire(w)
    fleet.start(w, ml["task_id"], 100)
    _, own, _ = running(fleet, w, idle_timeout_seconds=20)           # its own 20 s, default's 50%, notify
    _, dflt, _ = running(fleet, w)                                   # the default project's 50%, the fleet's 10 s
    beats(fleet, clock, w, [ml["task_id"], own, dflt], {0: 4.0, 1: 40.0, 2: 40.0}, 4)
    found = dict(fleet.reclaim_idle())
    assert found == {ml["task_id"]: "requeue"}
    beats(fleet, clock, w, [own, dflt], {1: 40.0, 2: 40.0}, 7)
    assert dict(fleet.reclaim_idle()) == {dflt: "notify"}
    beats(fleet, clock, w, [own], {1: 40.0}, 10)
    assert dict(fleet.reclaim_idle()) == {own: "notify"}


@pytest.mark.parametrize("spec, match", [
    ({"idle_below_pct": 101}, "between 0 and 100"), ({"idle_below_pct": -0.5}, "between 0 and 100"),
    ({"idle_timeout_seconds": 0.2}, "under one GPU sample interval"), ({"idle_action": "kill"}, "notify"),
])
def test_bad_policies_are_refused_and_change_nothing(sched, spec, match):
    with pytest.raises(InvalidRequest, match=match):
        sched.submit(job(**spec))
    with pytest.raises(InvalidRequest, match="under one GPU sample interval"):
        sched.change_teams(teams.set_project, "default", {"idle_timeout_seconds": 0.1})
    found = sched.store.read(lambda c: c.execute("SELECT count(*) AS n FROM jobs").fetchall())[0]["n"]
    policy = sched.store.read(lambda c: c.execute("SELECT idle_timeout_s FROM projects").fetchall())
    assert found == 0 and [p["idle_timeout_s"] for p in policy] == [None]


def test_the_canned_query_sums_gpu_hours_held_idle_by_user_and_project(sched, config, clock):
    from typer.testing import CliRunner

    from gpulayer.cli.app import app

    w = add_worker(sched, gpus=2, slots=2)
    _, idle, _ = running(sched, w)                      # GPU 0: 2% for 60 s: idle
    _, busy, _ = running(sched, w, idle_below_pct=1)    # GPU 1: 2% too, but its own threshold is 1%: busy
    beats(sched, clock, w, [idle, busy], {0: 2.0, 1: 2.0}, 60)
    answer = CliRunner().invoke(app, ["sql", "gpus_held_idle", "--state", str(config.layout.state), "--json",
                                      "-p", "since=0", "-p", "until=2000000000"])
    assert answer.exit_code == 0, answer.output
    (found,) = json.loads(answer.output)
    assert (found["user"], found["project"], found["tasks"]) == ("admin", "default", 2)
    assert found["gpu_hours_held"] == pytest.approx(2 * 59.5 / 3600, abs=1e-3)
    assert found["gpu_hours_idle"] == pytest.approx(59.5 / 3600, abs=1e-3) and found["idle_pct"] == 50.0
