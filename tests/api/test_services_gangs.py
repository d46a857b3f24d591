"""Services and multi-node gangs over plain HTTP with simulated workers and a pinned clock.

(tests/unit/test_scheduler.py covers the same transactions one level down;
these follow a worker's calls as the protocol describes them.)
"""
from __future__ import annotations

import pytest


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}", "X-GpuLayer-Protocol": "1"}

SERVE = {"command": ["serve"], "service": {"replicas": 2}}


class Sim:
    """Simulated workers speaking protocol v1 through falcon.testing."""

    def __init__(self, api, tokens, client_h, deps, clock):
        self.api, self.tokens, self.client_h, self.deps, self.clock = api, tokens, client_h, deps, clock
        self.held: dict[str, dict] = {}

    def worker(self, name, labels=None, advertise=None) -> dict:
        body = {"name": name, "labels": labels or {}, "version": "t",
                "resources": {"cpus": 8, "gpus": 0, "memory_mb": 1000, "gpu_models": []}}
        if advertise:
            body["advertise_address"] = advertise
        r = self.api.simulate_post("/v1/workers/register", headers=bearer(self.tokens["join_token"]), json=body)
        assert r.status_code == 200, r.text
        return bearer(r.json["session_token"])

    def submit(self, spec) -> int:
        r = self.api.simulate_post("/v1/jobs", headers=self.client_h, json=spec)
        assert r.status_code == 201, r.text
        return r.json["id"]

    def post(self, h, path, body=None):
        return self.api.simulate_post(f"/v1/worker{path}", headers=h, json=body or {})

    def acquire(self, h):
        return self.post(h, "/acquire").json["task"]

    def take(self, h) -> dict:
        task = self.acquire(h)
        assert task is not None, "the worker got nothing"
        assert self.post(h, f"/tasks/{task['task_id']}/start", {"pid": 1}).status_code == 200
        return task

    def beat(self, h, *entries) -> dict:
        tasks = [{"task_id": t, "state": s, "endpoint": e, "restarts": r} for t, s, e, r in entries]
        r = self.post(h, "/heartbeat", {"tasks": tasks})
        assert r.status_code == 200, r.text
        return r.json

    def get(self, path):
        r = self.api.simulate_get(f"/v1{path}", headers=self.client_h)
        assert r.status_code == 200, r.text
        return r.json

    def endpoints(self, job_id):
        return self.get(f"/jobs/{job_id}/endpoints")

    def job(self, job_id):
        return self.get(f"/jobs/{job_id}")

    def expire_after(self, seconds, *alive):
        """Move the clock on in steps while the `alive` workers keep heartbeating; then expire."""
        for _ in range(int(seconds)):
            self.clock.advance(1)
            for h, entries in alive:
                self.beat(h, *entries)
        return self.deps.scheduler.expire()


@pytest.fixture
def sim(api, tokens, client_h, deps, clock):
    return Sim(api, tokens, client_h, deps, clock)


# -- services --------------------------------------------------------------------

def test_replicas_wait_for_enough_matching_workers(sim):
    a = sim.worker("a", labels={"pool": "web"})
    other = sim.worker("other")
    job_id = sim.submit({**SERVE, "labels": {"pool": "web"}})
    first = sim.take(a)
    assert sim.acquire(a) is None  # never two replicas of one service on one worker
    assert sim.acquire(other) is None  # labels do not match
    assert sim.endpoints(job_id) == {"endpoints": [], "ready": False}
    sim.beat(a, (first["task_id"], "running", "10.0.0.1:8000", 0))
    assert sim.endpoints(job_id) == {"endpoints": ["10.0.0.1:8000"], "ready": False}
    b = sim.worker("b", labels={"pool": "web"})
    second = sim.take(b)
    assert {first["index"], second["index"]} == {0, 1}
    sim.beat(b, (second["task_id"], "running", "10.0.0.2:8000", 0))
    assert sim.endpoints(job_id)["ready"] is True


def test_endpoint_cleared_while_restarting_and_in_the_endpoints_view(sim, deps):
    a, b = sim.worker("a"), sim.worker("b")
    job_id = sim.submit({**SERVE, "name": "web"})
    ta, tb = sim.take(a), sim.take(b)
    sim.beat(a, (ta["task_id"], "running", "10.0.0.1:8000", 0))
    sim.beat(b, (tb["task_id"], "running", "10.0.0.2:9000", 0))
    assert sim.endpoints(job_id)["ready"] is True
    sim.beat(b, (tb["task_id"], "restarting", None, 1))
    by_index = {ta["index"]: "10.0.0.1:8000", tb["index"]: None}
    assert sim.endpoints(job_id) == {"endpoints": [by_index[0] or by_index[1]], "ready": False}
    view = deps.store.read(lambda c: c.execute(
        "SELECT replica, worker_name, endpoint, restarts FROM endpoints WHERE job_id = ? ORDER BY replica",
        (job_id,)).fetchall())
    assert [(v["worker_name"], v["endpoint"], v["restarts"]) for v in view] == \
        [("a", "10.0.0.1:8000", 0), ("b", None, 1)][:: 1 if ta["index"] == 0 else -1]
    sim.beat(b, (tb["task_id"], "running", "10.0.0.2:9100", 1))
    assert sorted(sim.endpoints(job_id)["endpoints"]) == ["10.0.0.1:8000", "10.0.0.2:9100"]
    reported = [e for e in sim.get(f"/jobs/{job_id}/events")["events"] if e["kind"] == "task_reported"]
    assert [e["data"]["endpoint"] for e in reported if e["task_id"] == tb["task_id"]] == \
        ["10.0.0.2:9000", None, "10.0.0.2:9100"]


def test_an_ended_service_lists_no_endpoints(sim):
    a, b = sim.worker("a"), sim.worker("b")
    job_id = sim.submit(SERVE)
    ta, tb = sim.take(a), sim.take(b)
    sim.beat(a, (ta["task_id"], "running", "10.0.0.1:8000", 0))
    sim.beat(b, (tb["task_id"], "running", "10.0.0.2:8000", 0))
    assert sim.api.simulate_post(f"/v1/jobs/{job_id}/cancel", headers=sim.client_h).status_code == 200
    # the replicas still run until their workers' next heartbeat stops them: they no longer serve
    assert sim.endpoints(job_id) == {"endpoints": [], "ready": False}
    assert sim.beat(a, (ta["task_id"], "running", "10.0.0.1:8000", 0))["cancel_task_ids"] == [ta["task_id"]]


def test_worker_loss_replaces_only_that_replica_and_forgets_its_endpoint(sim):
    a, b, c = sim.worker("a"), sim.worker("b"), sim.worker("c")
    job_id = sim.submit(SERVE)
    ta, tb = sim.take(a), sim.take(b)
    sim.beat(a, (ta["task_id"], "running", "10.0.0.1:8000", 0))
    sim.beat(b, (tb["task_id"], "running", "10.0.0.2:8000", 0))
    result = sim.expire_after(4, (a, [(ta["task_id"], "running", "10.0.0.1:8000", 0)]), (c, []))
    assert result["tasks_lost"] == 1  # b fell silent
    info = sim.job(job_id)
    assert info["state"] == "running" and info["attempt"] == 1
    # a's replica keeps serving: not stopped, still listed
    assert sim.endpoints(job_id)["endpoints"] == ["10.0.0.1:8000"]
    assert sim.beat(a, (ta["task_id"], "running", "10.0.0.1:8000", 0))["cancel_task_ids"] == []
    nc = sim.take(c)
    assert nc["attempt"] == 1 and nc["index"] == tb["index"]
    sim.beat(c, (nc["task_id"], "running", "10.0.0.3:8000", 0))
    assert sorted(sim.endpoints(job_id)["endpoints"]) == ["10.0.0.1:8000", "10.0.0.3:8000"]
    kinds = [e["kind"] for e in sim.get(f"/jobs/{job_id}/events")["events"]]
    assert "replica_replaced" in kinds and "job_retried" not in kinds


def test_a_service_is_placed_again_at_most_ten_times_by_default(sim):
    workers = [sim.worker(f"w{i}") for i in range(2)]
    job_id = sim.submit({"command": ["serve"], "service": {"replicas": 1}})
    assert sim.job(job_id)["spec"]["retry"]["max_attempts"] == 10
    for attempt in range(1, 11):
        h = workers[attempt % 2]
        sim.beat(h)
        task = sim.take(h)
        assert task["attempt"] == attempt
        sim.expire_after(4, (workers[(attempt + 1) % 2], []))
    info = sim.job(job_id)
    assert info["state"] == "lost" and info["attempt"] == 10


# -- gangs -------------------------------------------------------------------------

def ranks_of(sim, hs):
    """Acquire on every worker; {rank: (headers, assignment)}."""
    got = {}
    for h in hs:
        task = sim.take(h)
        got[task["rank"]] = (h, task)
    return got


def test_gang_waits_for_enough_matching_workers(sim):
    hs = [sim.worker(f"g{i}", labels={"ib": "yes"}) for i in range(2)] + [sim.worker("plain")]
    gang = sim.submit({"command": ["train"], "nodes": 3, "labels": {"ib": "yes"}})
    assert all(sim.acquire(h) is None for h in hs)
    assert {t["state"] for t in sim.job(gang)["tasks"]} == {"queued"}
    late = sim.worker("g2", labels={"ib": "yes"})
    placed = ranks_of(sim, [late, *hs[:2]])
    assert sorted(placed) == [0, 1, 2] and all(t["world_size"] == 3 for _, t in placed.values())


def test_worker_lost_mid_rendezvous_places_the_whole_gang_again(sim):
    a, b, c = (sim.worker(n, advertise=f"10.0.0.{i}") for i, n in enumerate("abc", 1))
    gang = sim.submit({"command": ["train"], "nodes": 2, "retry": {"max_attempts": 2}})
    held = ranks_of(sim, [a, b])
    h0, r0 = held[0]
    assert sim.post(h0, f"/tasks/{r0['task_id']}/rendezvous", {"address": "10.0.0.1", "port": 29500}).json == \
        {"ready": False, "arrived": 1, "world_size": 2}
    lost_h = held[1][0]
    alive = [(h, [(t["task_id"], "running", None, 0)]) for h, t in held.values() if h is not lost_h] + [(c, [])]
    assert sim.expire_after(4, *alive)["tasks_lost"] == 1
    info = sim.job(gang)
    assert info["state"] == "queued" and info["attempt"] == 2
    r = sim.post(h0, f"/tasks/{r0['task_id']}/rendezvous", {"address": "10.0.0.1", "port": 29500})
    assert r.status_code == 409 and r.json["error"]["code"] == "task_not_assigned"
    survivor = h0
    assert sim.beat(survivor, (r0["task_id"], "running", None, 0))["cancel_task_ids"] == [r0["task_id"]]
    again = ranks_of(sim, [c, survivor])
    assert all(t["attempt"] == 2 for _, t in again.values())
    answers = [sim.post(h, f"/tasks/{t['task_id']}/rendezvous", {"address": f"addr{rank}", "port": 29400 + rank}).json
               for rank, (h, t) in sorted(again.items())]
    assert answers[0]["ready"] is False and answers[1]["ready"] is True
    assert answers[1]["master_addr"] == "addr0" and answers[1]["peers"] == ["addr0:29400", "addr1:29401"]
    tasks = [t for t in sim.job(gang)["tasks"] if t["attempt"] == 2]
    assert {t["address"] for t in tasks} == {"10.0.0.1", "10.0.0.3"}


def test_worker_lost_mid_rendezvous_without_retry_ends_the_gang_lost(sim):
    a, b = sim.worker("a"), sim.worker("b")
    gang = sim.submit({"command": ["train"], "nodes": 2})
    held = ranks_of(sim, [a, b])
    (h0, r0), (h1, _) = held[0], held[1]
    sim.post(h0, f"/tasks/{r0['task_id']}/rendezvous", {"address": "x", "port": 1})
    sim.expire_after(4, (h0, [(r0["task_id"], "running", None, 0)]))
    info = sim.job(gang)
    assert info["state"] == "lost" and info["reason"] == "worker_lost"
    assert sim.beat(h0, (r0["task_id"], "running", None, 0))["cancel_task_ids"] == [r0["task_id"]]
    finish = sim.post(h0, f"/tasks/{r0['task_id']}/finish", {"exit_code": None, "outcome": "cancelled"})
    assert finish.status_code == 200
    assert sim.job(gang)["state"] == "lost"


def test_failed_rank_retries_the_whole_gang_when_failed_is_in_retry_on(sim):
    a, b = sim.worker("a"), sim.worker("b")
    gang = sim.submit({"command": ["train"], "nodes": 2, "retry": {"max_attempts": 2, "retry_on": ["failed"]}})
    held = ranks_of(sim, [a, b])
    (h1, r1), (h0, r0) = held[1], held[0]
    assert sim.post(h1, f"/tasks/{r1['task_id']}/finish", {"exit_code": 3, "outcome": "failed"}).json["accepted"]
    info = sim.job(gang)
    assert info["state"] == "queued" and info["attempt"] == 2
    assert sim.beat(h0, (r0["task_id"], "running", None, 0))["cancel_task_ids"] == [r0["task_id"]]
    again = ranks_of(sim, [a, b])
    assert sorted(again) == [0, 1] and all(t["attempt"] == 2 for _, t in again.values())
    (h, t) = again[0]
    assert sim.post(h, f"/tasks/{t['task_id']}/finish", {"exit_code": 1, "outcome": "failed"}).json["accepted"]
    info = sim.job(gang)
    assert info["state"] == "failed" and info["exit_code"] == 1
