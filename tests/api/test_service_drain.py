"""A replica leaving its service without dropping a request (issue 39, item 5): service_drain.py through the
scheduler, with simulated workers over plain HTTP and a pinned clock. A drained replica leaves the ingress's
set at once, is stopped (its worker told through `cancel_task_ids`) once nothing is in flight to it or at its
deadline, and its end, whatever it is, neither replaces it nor ends its service."""
from __future__ import annotations

import pytest

from gpulayer.server.scheduler import service_drain
from gpulayer.server.store.queries import rows
from test_services_gangs import Sim

SERVE = {"command": ["serve"], "service": {"replicas": 2, "ingress": {"access": "token"}}}


@pytest.fixture
def sim(api, tokens, client_h, deps, clock):
    return Sim(api, tokens, client_h, deps, clock)


def _serving(sim):
    """Two workers, a two-replica service, both replicas running with an endpoint: (job id, [(h, task)])."""
    a, b = sim.worker("a"), sim.worker("b")
    job_id = sim.submit(SERVE)
    ta, tb = sim.take(a), sim.take(b)
    sim.beat(a, (ta["task_id"], "running", "10.0.0.1:8000", 0))
    sim.beat(b, (tb["task_id"], "running", "10.0.0.2:8000", 0))
    return job_id, [(a, ta), (b, tb)]


def _set(deps, job_id):
    return [r["task_id"] for r in deps.store.read(rows, "ingress_replicas", job_id=job_id)]


def _kinds(sim, job_id, kind):
    return [e for e in sim.get(f"/jobs/{job_id}/events")["events"] if e["kind"] == kind]


def test_a_drained_replica_leaves_the_set_then_stops_once_idle(sim, deps):
    job_id, [(a, ta), (b, tb)] = _serving(sim)
    scheduler, first = deps.scheduler, ta["task_id"]
    assert sorted(_set(deps, job_id)) == sorted([first, tb["task_id"]])
    assert scheduler.drain_replica(first, 30, "scale_down")["job_id"] == job_id
    assert _set(deps, job_id) == [tb["task_id"]] and first in scheduler.ingress.draining
    assert scheduler.drain_replica(first, 30, "scale_down") is None  # draining already: its deadline holds
    [draining] = _kinds(sim, job_id, "replica_draining")
    assert draining["data"]["why"] == "scale_down" and draining["data"]["deadline"] == sim.clock.now + 30

    scheduler.ingress.outstanding[first] = 1   # a request in flight to it: it is not stopped
    sim.clock.advance(service_drain.SETTLE_S + 1)
    assert scheduler.advance_service_drains() == []
    assert first not in sim.beat(a, (first, "running", "10.0.0.1:8000", 0))["cancel_task_ids"]
    del scheduler.ingress.outstanding[first]   # it finished: stopped at the next tick
    assert scheduler.advance_service_drains() == [first]
    assert sim.beat(a, (first, "running", "10.0.0.1:8000", 0))["cancel_task_ids"] == [first]
    [drained] = _kinds(sim, job_id, "replica_drained")
    assert drained["data"]["stopped"] == "idle" and drained["data"]["in_flight"] == 0

    # its worker stops it (a clean exit on SIGTERM): the service runs on with its other replica, none added
    done = sim.post(a, f"/tasks/{first}/finish", {"exit_code": 0, "outcome": "succeeded", "outputs": {}})
    assert done.status_code == 200, done.text
    job = sim.job(job_id)
    assert job["state"] == "running"
    assert [t["state"] for t in job["tasks"] if t["task_id"] == first] == ["succeeded"]
    assert len([t for t in job["tasks"] if t["state"] in ("queued", "assigned", "running")]) == 1
    assert not _kinds(sim, job_id, "replica_replaced") and not _kinds(sim, job_id, "job_finished")


def test_the_deadline_stops_a_busy_replica_and_the_last_one_ends_nothing(sim, deps):
    job_id, pairs = _serving(sim)
    scheduler = deps.scheduler
    for _, task in pairs:
        scheduler.drain_replica(task["task_id"], 5, "update")
        scheduler.ingress.outstanding[task["task_id"]] = 3   # long requests that never finish
    assert _set(deps, job_id) == []
    sim.clock.advance(4)
    assert scheduler.advance_service_drains() == []
    sim.clock.advance(2)
    assert sorted(scheduler.advance_service_drains()) == sorted(t["task_id"] for _, t in pairs)
    assert {e["data"]["stopped"] for e in _kinds(sim, job_id, "replica_drained")} == {"deadline"}
    (a, ta), (b, tb) = pairs
    assert sim.post(a, f"/tasks/{ta['task_id']}/finish", {"exit_code": -15, "outcome": "cancelled", "outputs": {}}).status_code == 200
    sim.clock.advance(60)   # b's worker is lost with its draining replica: not placed again either
    sim.expire_after(1, (a, ()))
    sim.clock.advance(60)
    deps.scheduler.expire()
    job = sim.job(job_id)
    assert job["state"] == "running" and all(t["state"] not in ("queued", "assigned", "running") for t in job["tasks"])
    assert not _kinds(sim, job_id, "replica_replaced") and not _kinds(sim, job_id, "job_retried")
    scheduler.ingress.outstanding.clear()
    assert scheduler.advance_service_drains() == [] and scheduler.ingress.draining == frozenset()
    assert sim.api.simulate_post(f"/v1/jobs/{job_id}/cancel", headers=sim.client_h).status_code == 200
    assert sim.job(job_id)["state"] == "cancelled"


def test_a_replica_not_placed_yet_ends_at_once_and_nothing_else_drains(sim, deps):
    a = sim.worker("a")
    job_id = sim.submit(SERVE)
    placed = sim.take(a)
    queued = next(t for t in sim.job(job_id)["tasks"] if t["state"] == "queued")
    assert deps.scheduler.drain_replica(queued["task_id"], 30, "scale_down")["state"] == "cancelled"
    assert [t["state"] for t in sim.job(job_id)["tasks"] if t["task_id"] == queued["task_id"]] == ["cancelled"]
    assert _kinds(sim, job_id, "replica_drained")[0]["data"]["stopped"] == "not_placed"
    assert sim.job(job_id)["state"] == "running"
    batch = sim.submit({"command": ["x"]})
    b = sim.worker("b")
    assert sim.take(b)["job_id"] == batch
    task = next(t for t in sim.job(batch)["tasks"])
    assert deps.scheduler.drain_replica(task["task_id"], 30, "scale_down") is None   # no service's replica
    assert deps.scheduler.drain_replica(10**9, 30, "scale_down") is None
    assert deps.scheduler.drain_replica(placed["task_id"], 30, "scale_down") is not None
