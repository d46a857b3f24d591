"""Autoscaling (issue 39, point 1) through the scheduler with simulated workers over plain HTTP and a pinned
clock: upkeep's `autoscale` step reads the ingress's requests in flight (set here as the proxy keeps them),
adds replicas as queued tasks placed like any task, drains the newest going down, records each decision
(`service_scaling`, a `service_scaled` event, the job read's `scaling`); bad `service.autoscale` input is 400
and makes nothing."""
from __future__ import annotations

import pytest

from gpulayer.server.store.queries import rows
from test_services_gangs import Sim

AUTOSCALE = {"min": 1, "max": 3, "target_concurrency": 1, "up_after_s": 2, "down_after_s": 5}


def _spec(**scale):
    return {"command": ["serve"], "service": {"ingress": {"access": "token"}, "autoscale": {**AUTOSCALE, **scale}}}


@pytest.fixture
def sim(api, tokens, client_h, deps, clock):
    return Sim(api, tokens, client_h, deps, clock)


def _tick(sim, seconds: float, every: float = 0.5) -> list[dict]:
    made = []
    for _ in range(int(seconds / every)):
        sim.clock.advance(every)
        made += sim.deps.scheduler.autoscale()
    return made


def _live(job):
    return [t for t in job["tasks"] if t["state"] in ("queued", "assigned", "running")]


def test_up_under_load_then_down_by_draining_the_newest(sim, deps):
    a, b, c = sim.worker("a"), sim.worker("b"), sim.worker("c")
    job_id = sim.submit(_spec())
    first = sim.take(a)
    sim.beat(a, (first["task_id"], "running", "10.0.0.1:8000", 0))
    deps.scheduler.ingress.outstanding[first["task_id"]] = 3      # three requests in flight, target 1
    assert _tick(sim, 1.5) == []                                    # not yet up_after_s over target
    [up] = _tick(sim, 1.0)
    assert (up["from"], up["to"], up["why"], len(up["added"])) == (1, 3, "up", 2)
    job = sim.job(job_id)
    assert len(_live(job)) == 3 and sorted(t["index"] for t in _live(job)) == [0, 1, 2]
    [event] = [e for e in sim.get(f"/jobs/{job_id}/events")["events"] if e["kind"] == "service_scaled"]
    assert {k: event["data"][k] for k in ("from", "to", "why", "load", "ready")} == \
        {"from": 1, "to": 3, "why": "up", "load": 3.0, "ready": 1}
    placed = [sim.take(b), sim.take(c)]                            # placed like any task
    for h, task in zip((b, c), placed):
        sim.beat(h, (task["task_id"], "running", "10.0.0.9:8000", 0))
    assert sim.job(job_id)["scaling"]["replicas"] == 3 and sim.job(job_id)["scaling"]["ready"] == 3

    deps.scheduler.ingress.outstanding.clear()                      # idle: after down_after_s, back to min
    assert _tick(sim, 4.5) == []
    [down] = _tick(sim, 1.0)
    assert (down["from"], down["to"], down["why"]) == (3, 1, "down")
    assert sorted(down["drained"]) == sorted(t["task_id"] for t in placed)   # the newest two
    scaling = sim.job(job_id)["scaling"]
    assert (scaling["replicas"], scaling["draining"]) == (1, 2)
    assert [(h["from_replicas"], h["to_replicas"], h["why"]) for h in scaling["history"]] == [(1, 3, "up"), (3, 1, "down")]
    ops = deps.store.read(rows, "service_scaling_of", job_id=job_id, limit=10)
    assert [r["why"] for r in ops] == ["down", "up"]
    sim.clock.advance(3)
    assert sorted(deps.scheduler.advance_service_drains()) == sorted(down["drained"])


def test_min_0_scales_to_zero_when_idle_and_the_job_goes_on(sim, deps):
    a = sim.worker("a")
    job_id = sim.submit(_spec(min=0))
    task = sim.take(a)
    assert sim.job(job_id)["spec"]["service"]["replicas"] == 1      # the starting count: min, at least one
    sim.beat(a, (task["task_id"], "running", "10.0.0.1:8000", 0))
    [zero] = _tick(sim, 5.5)
    assert (zero["to"], zero["why"]) == (0, "zero")
    sim.clock.advance(3)
    assert deps.scheduler.advance_service_drains() == [task["task_id"]]
    assert sim.post(a, f"/tasks/{task['task_id']}/finish", {"exit_code": 0, "outcome": "succeeded", "outputs": {}}).status_code == 200
    job = sim.job(job_id)
    assert job["state"] == "running" and _live(job) == [] and job["scaling"]["replicas"] == 0
    assert _tick(sim, 10) == []                                     # at min: nothing more


def test_a_lost_replica_of_a_scaled_up_service_is_replaced_alone(sim, deps):
    a, b = sim.worker("a"), sim.worker("b")
    job_id = sim.submit(_spec())
    first = sim.take(a)
    sim.beat(a, (first["task_id"], "running", "10.0.0.1:8000", 0))
    deps.scheduler.ingress.outstanding[first["task_id"]] = 2
    _tick(sim, 2.5)
    second = sim.take(b)
    sim.beat(b, (second["task_id"], "running", "10.0.0.2:8000", 0))
    sim.expire_after(60, (a, [(first["task_id"], "running", "10.0.0.1:8000", 0)]))   # b is lost
    job = sim.job(job_id)
    assert job["state"] == "running" and job["attempt"] == 1
    assert [t["state"] for t in job["tasks"] if t["task_id"] == first["task_id"]] == ["running"]
    assert len(_live(job)) == 2


@pytest.mark.parametrize("scale, field", [
    ({"min": 3, "max": 2}, "service.autoscale.min"),
    ({"max": 0}, "service.autoscale.max"),
    ({"target_concurrency": 0}, "service.autoscale.target_concurrency"),
    ({"target_concurrency": -1}, "service.autoscale.target_concurrency"),
    ({"up_after_s": -1}, "service.autoscale.up_after_s"),
    ({"bogus": 1}, "service.autoscale"),
])
def test_bad_autoscale_settings_are_refused_and_make_nothing(sim, scale, field):
    answer = sim.api.simulate_post("/v1/jobs", headers=sim.client_h, json=_spec(**scale))
    assert answer.status_code == 400, answer.text
    assert field in answer.json["error"]["message"]
    assert sim.get("/jobs")["jobs"] == []


def test_autoscaling_needs_an_ingress_and_a_starting_count_within_bounds(sim):
    for spec, words in (({"command": ["x"], "service": {"autoscale": AUTOSCALE}}, "needs `service.ingress`"),
                        ({**_spec(), "service": {**_spec()["service"], "replicas": 5}}, "service.replicas")):
        answer = sim.api.simulate_post("/v1/jobs", headers=sim.client_h, json=spec)
        assert answer.status_code == 400 and words in answer.json["error"]["message"], answer.text
    assert sim.get("/jobs")["jobs"] == []
    batch = sim.submit({"command": ["x"]})
    assert sim.job(batch)["scaling"] is None


def test_a_request_at_zero_wakes_one_replica_once(sim, deps):
    a = sim.worker("a")
    job_id = sim.submit(_spec(min=0))
    task = sim.take(a)
    sim.beat(a, (task["task_id"], "running", "10.0.0.1:8000", 0))
    _tick(sim, 5.5)
    sim.clock.advance(3)
    deps.scheduler.advance_service_drains()
    sim.post(a, f"/tasks/{task['task_id']}/finish", {"exit_code": 0, "outcome": "succeeded", "outputs": {}})
    deps.scheduler.ingress.held[job_id] = 1                       # a request held by the ingress
    deps.scheduler.ingress.cold_refused[(job_id, "cold_start_timeout")] = 2   # two it answered 503 before
    metrics = sim.api.simulate_get("/metrics", headers=sim.client_h).text
    assert f'gpulayer_ingress_held{{job_id="{job_id}"}} 1.0' in metrics
    assert f'gpulayer_ingress_cold_start_refused_total{{code="cold_start_timeout",job_id="{job_id}"}} 2.0' in metrics
    woken = deps.scheduler.wake_service(job_id)
    assert (woken["from"], woken["to"], woken["why"], len(woken["added"])) == (0, 1, "wake", 1)
    assert deps.scheduler.wake_service(job_id) is None            # one on its way: no second
    assert _tick(sim, 4) == []                                    # held requests are load: no scale to zero meanwhile
    assert sim.take(a)["task_id"] == woken["added"][0]
    history = sim.job(job_id)["scaling"]["history"]
    assert [(h["why"], h["in_flight"]) for h in history] == [("zero", 0), ("wake", 1)]
    other = sim.submit(_spec())                                  # min 1: never woken by a request
    assert deps.scheduler.wake_service(other) is None


def test_a_cancel_during_a_scale_up_ends_every_replica_and_nothing_scales_after(sim, deps):
    a, b = sim.worker("a"), sim.worker("b")
    job_id = sim.submit(_spec())
    first = sim.take(a)
    sim.beat(a, (first["task_id"], "running", "10.0.0.1:8000", 0))
    deps.scheduler.ingress.outstanding[first["task_id"]] = 3
    [up] = _tick(sim, 2.5)
    starting = sim.take(b)                                          # one new replica assigned, one still queued
    assert starting["task_id"] in up["added"]
    assert sim.api.simulate_post(f"/v1/jobs/{job_id}/cancel", headers=sim.client_h).status_code == 200
    job = sim.job(job_id)
    assert job["state"] == "cancelled"
    assert all(t["state"] in ("cancelled", "running") for t in job["tasks"])
    assert not [t for t in job["tasks"] if t["state"] == "queued"]
    assert first["task_id"] in sim.beat(a, (first["task_id"], "running", "10.0.0.1:8000", 0))["cancel_task_ids"]
    assert _tick(sim, 5) == [] and deps.scheduler.wake_service(job_id) is None
    assert sim.acquire(a) is None
