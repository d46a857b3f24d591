"""Rolling updates of a service over plain HTTP (PATCH /v1/jobs/{id}/service, promote, rollback) with simulated
workers and a pinned clock: the surge, the drain, the finish, a failed revision rolled back with every old
replica serving, a canary, a restart mid-rollout, and every bad input refused with nothing changed
(scheduler/rollout.py; docs/services.md, "Rolling updates")."""
from __future__ import annotations

import pytest

from apihelpers import bearer
from gpulayer.server.http.app import new_deps
from gpulayer.server.scheduler import ingress, rollout, service_drain

SERVE = {"command": ["serve"], "env": {"V": "1"}, "service": {"replicas": 2}}


class Fleet:
    """Simulated workers (protocol v1 through falcon.testing) serving one service."""

    def __init__(self, api, tokens, client_h, deps, clock):
        self.api, self.tokens, self.h, self.deps, self.clock = api, tokens, client_h, deps, clock
        self.workers: dict[str, dict] = {}
        self.held: dict[str, list] = {}

    def worker(self, name) -> dict:
        body = {"name": name, "labels": {}, "version": "t", "relay": {"kinds": ["tcp"]},
                "resources": {"cpus": 8, "gpus": 0, "memory_mb": 1000, "gpu_models": []}}
        r = self.api.simulate_post("/v1/workers/register", headers=bearer(self.tokens["join_token"]), json=body)
        assert r.status_code == 200, r.text
        self.workers[name], self.held[name] = bearer(r.json["session_token"]), []
        return self.workers[name]

    def post(self, name, path, body=None):
        return self.api.simulate_post(f"/v1/worker{path}", headers=self.workers[name], json=body or {})

    def take(self, name, endpoint=True) -> dict:
        task = self.post(name, "/acquire").json["task"]
        assert task is not None, f"{name} got nothing"
        assert self.post(name, f"/tasks/{task['task_id']}/start", {"pid": 1}).status_code == 200
        self.held[name].append([task["task_id"], f"10.0.0.{len(self.held)}:80" if endpoint else None, 0])
        self.beat(name)
        return task

    def beat(self, name) -> dict:
        tasks = [{"task_id": t, "state": "running", "endpoint": e, "restarts": r} for t, e, r in self.held[name]]
        r = self.post(name, "/heartbeat", {"tasks": tasks})
        assert r.status_code == 200, r.text
        for task_id in r.json["cancel_task_ids"]:   # stopped (a drain, a rollback): it ends cancelled
            self.post(name, f"/tasks/{task_id}/finish", {"exit_code": None, "outcome": "cancelled"})
            self.held[name] = [t for t in self.held[name] if t[0] != task_id]
        return r.json

    def settle(self):
        """Upkeep's steps once (drains stopped, the rollout's moves), every worker heartbeating after."""
        self.clock.advance(service_drain.SETTLE_S + 0.1)
        self.deps.store.write(service_drain.advance, self.clock.now, {})
        for name in self.workers:
            self.beat(name)
        self.deps.scheduler.advance_rollouts()

    def patch(self, job_id, body, status=200):
        r = self.api.simulate_patch(f"/v1/jobs/{job_id}/service", headers=self.h, json=body)
        assert r.status_code == status, r.text
        return r.json

    def service(self, job_id) -> dict:
        return self.api.simulate_get(f"/v1/jobs/{job_id}/service", headers=self.h).json

    def serving(self, job_id) -> list[tuple[int, int]]:
        """(index, revision) of each replica in the ingress's set."""
        found = self.deps.store.read(ingress.lookup, job_id)
        return sorted(zip([r.index for r in found.replicas], found.revisions)) if found else []

    def kinds(self, job_id) -> list[str]:
        r = self.api.simulate_get(f"/v1/jobs/{job_id}/events", headers=self.h, params={"limit": 500})
        return [e["kind"] for e in r.json["events"]]


@pytest.fixture
def fleet(api, tokens, client_h, deps, clock):
    f = Fleet(api, tokens, client_h, deps, clock)
    for name in ("a", "b", "c"):
        f.worker(name)
    return f


def _running_service(fleet, spec=None) -> int:
    r = fleet.api.simulate_post("/v1/jobs", headers=fleet.h, json={**SERVE, "service": {"replicas": 2, "ingress": {}},
                                                                   **(spec or {})})
    assert r.status_code == 201, r.text
    fleet.take("a")
    fleet.take("b")
    return r.json["id"]


def test_a_rolling_update_surges_one_then_drains_one_until_every_replica_runs_the_new_revision(fleet):
    job_id = _running_service(fleet)
    shown = fleet.patch(job_id, {"env": {"V": "2"}})
    assert shown["rollout"]["state"] == "rolling" and shown["rollout"]["revision"] == 2
    assert shown["revision"] == 1 and shown["rollout"]["changes"] == {"env": {"V": "2"}}
    new = fleet.take("c")                    # the surge: a third replica, of revision 2, on the free worker
    assert new["env"]["V"] == "2" and new["index"] == 0
    assert fleet.serving(job_id) == [(0, 1), (0, 2), (1, 1)]
    fleet.deps.scheduler.advance_rollouts()  # it serves: the old replica at index 0 drains (out of the set)
    assert fleet.serving(job_id) == [(0, 2), (1, 1)]
    fleet.settle()                           # stopped once nothing is in flight; the next surge goes out
    second = fleet.take("a")
    assert (second["env"]["V"], second["index"]) == ("2", 1)
    fleet.deps.scheduler.advance_rollouts()
    fleet.settle()
    fleet.settle()
    shown = fleet.service(job_id)
    assert shown["revision"] == 2 and shown["rollout"] is None and shown["updates"][0]["state"] == "finished"
    assert fleet.serving(job_id) == [(0, 2), (1, 2)]
    job = fleet.api.simulate_get(f"/v1/jobs/{job_id}", headers=fleet.h).json
    assert job["state"] == "running" and job["spec"]["env"] == {"V": "2"}
    kinds = fleet.kinds(job_id)
    assert kinds.count("replica_surged") == 2 and kinds.count("replica_drained") == 2
    assert "service_update_started" in kinds and "service_update_finished" in kinds


def test_a_new_revision_that_crash_loops_is_rolled_back_and_every_old_replica_serves_throughout(fleet):
    job_id = _running_service(fleet)
    fleet.patch(job_id, {"command": ["serve", "--broken"]})
    new = fleet.take("c", endpoint=False)    # started, never ready
    assert new["command"] == ["serve", "--broken"]
    fleet.held["c"][0][2] = 1                # it restarted: a crash loop
    fleet.beat("c")
    assert fleet.serving(job_id) == [(0, 1), (1, 1)]
    fleet.deps.scheduler.advance_rollouts()
    assert fleet.serving(job_id) == [(0, 1), (1, 1)]
    fleet.settle()
    shown = fleet.service(job_id)
    assert shown["revision"] == 1 and shown["rollout"] is None
    assert shown["updates"][0]["state"] == "rolled_back" and shown["updates"][0]["reason"].startswith("crash_loop")
    assert fleet.held["c"] == [] and fleet.serving(job_id) == [(0, 1), (1, 1)]
    kinds = fleet.kinds(job_id)
    assert "service_update_rolling_back" in kinds and "service_update_rolled_back" in kinds
    assert fleet.api.simulate_get(f"/v1/jobs/{job_id}", headers=fleet.h).json["state"] == "running"


def test_a_new_replica_that_fails_for_good_rolls_back_and_ends_nothing(fleet):
    job_id = _running_service(fleet, {"service": {"replicas": 2, "ingress": {}, "max_restarts": 0}})
    fleet.patch(job_id, {"command": ["serve", "--exit"]})
    new = fleet.take("c", endpoint=False)
    r = fleet.post("c", f"/tasks/{new['task_id']}/finish", {"exit_code": 1, "outcome": "failed"})
    assert r.status_code == 200, r.text
    fleet.held["c"] = []
    assert fleet.service(job_id)["updates"][0]["reason"].startswith("replica_failed")
    fleet.settle()
    assert fleet.service(job_id)["updates"][0]["state"] == "rolled_back"
    assert fleet.api.simulate_get(f"/v1/jobs/{job_id}", headers=fleet.h).json["state"] == "running"
    assert fleet.serving(job_id) == [(0, 1), (1, 1)]


def test_a_new_replica_not_ready_within_its_health_checks_rolls_back(fleet):
    job_id = _running_service(fleet, {"service": {"replicas": 2, "ingress": {},
                                                  "health": {"http_path": "/h", "interval_s": 1, "failures": 3}}})
    shown = fleet.patch(job_id, {"env": {"V": "2"}})
    assert shown["rollout"]["ready_timeout_s"] == 3   # failures x interval
    fleet.take("c", endpoint=False)
    scheduler = fleet.deps.scheduler
    scheduler.advance_rollouts()
    assert scheduler.rollout_due_in() == 3   # upkeep's next tick comes at the new replica's deadline
    fleet.clock.advance(2)
    scheduler.advance_rollouts()
    assert fleet.service(job_id)["rollout"]["state"] == "rolling" and scheduler.rollout_due_in() == 1
    fleet.clock.advance(1)                   # exactly at the deadline: it turns around then, not a tick later
    scheduler.advance_rollouts()
    assert fleet.service(job_id)["rollout"]["state"] == "rolling_back" and scheduler.rollout_due_in() is None
    fleet.settle()
    assert fleet.service(job_id)["updates"][0]["reason"].startswith("not_ready")
    assert fleet.serving(job_id) == [(0, 1), (1, 1)]


def test_a_worker_lost_mid_rollout_gets_its_new_replica_placed_again_and_the_rollout_finishes(fleet):
    job_id = _running_service(fleet)
    fleet.patch(job_id, {"env": {"V": "2"}})
    fleet.take("c")
    fleet.deps.scheduler.advance_rollouts()
    fleet.settle()                           # old index 0 (on a) drained and stopped
    fleet.take("a")                          # the surge for index 1
    for _ in range(4):                       # c stops heartbeating: lost with its new replica at index 0
        fleet.clock.advance(1)
        fleet.beat("a")
        fleet.beat("b")
    fleet.deps.scheduler.expire()
    fleet.held["c"] = []
    kinds = fleet.kinds(job_id)
    assert "replica_replaced" not in kinds and "job_retried" not in kinds   # the rollout places it again
    fleet.deps.scheduler.advance_rollouts()
    fleet.settle()                           # a's new index 1 serves: b's old index 1 drains and stops
    again = fleet.take("b")                  # index 0 placed again, of the new revision
    assert (again["index"], again["env"]["V"]) == (0, "2")
    fleet.deps.scheduler.advance_rollouts()
    fleet.settle()
    shown = fleet.service(job_id)
    assert shown["revision"] == 2 and shown["updates"][0]["state"] == "finished"
    assert fleet.serving(job_id) == [(0, 2), (1, 2)]


def test_a_one_replica_service_losing_its_new_replica_keeps_the_old_one_serving(fleet):
    r = fleet.api.simulate_post("/v1/jobs", headers=fleet.h, json={**SERVE, "service": {"replicas": 1, "ingress": {}}})
    job_id = r.json["id"]
    fleet.take("a")
    fleet.patch(job_id, {"env": {"V": "2"}})
    fleet.take("b", endpoint=False)
    for _ in range(4):                       # b is lost with the new replica, before it was ready
        fleet.clock.advance(1)
        fleet.beat("a")
        fleet.beat("c")
    fleet.deps.scheduler.expire()
    fleet.held["b"] = []
    job = fleet.api.simulate_get(f"/v1/jobs/{job_id}", headers=fleet.h).json
    assert job["attempt"] == 1 and fleet.serving(job_id) == [(0, 1)]   # no retry of the attempt: it serves on
    fleet.deps.scheduler.advance_rollouts()  # surged again
    again = fleet.take("c")
    assert again["env"]["V"] == "2"
    fleet.deps.scheduler.advance_rollouts()
    fleet.settle()
    assert fleet.service(job_id)["revision"] == 2 and fleet.serving(job_id) == [(0, 2)]


def test_a_canary_waits_with_every_old_replica_until_promoted(fleet):
    job_id = _running_service(fleet)
    fleet.patch(job_id, {"env": {"V": "2"}, "canary": 25})
    fleet.take("c")
    for _ in range(2):
        fleet.settle()
    assert fleet.serving(job_id) == [(0, 1), (0, 2), (1, 1)]
    found = fleet.deps.store.read(ingress.lookup, job_id)
    assert found.canary == (2, 25)
    new = [i for i, r in enumerate(found.revisions) if r == 2]
    assert ingress.canary_share(found, [0, 1, 2], 0.2) == new
    assert 2 not in [found.revisions[i] for i in ingress.canary_share(found, [0, 1, 2], 0.3)]
    r = fleet.api.simulate_post(f"/v1/jobs/{job_id}/service/promote", headers=fleet.h)
    assert r.status_code == 200 and r.json["rollout"]["promoted_at"] is not None
    assert fleet.serving(job_id) == [(0, 2), (1, 1)]   # promote: the rollout goes on (index 0's old drains)
    r = fleet.api.simulate_post(f"/v1/jobs/{job_id}/service/promote", headers=fleet.h)
    assert r.status_code == 409 and r.json["error"]["code"] == "not_canary"


def test_a_canary_rolled_back_by_hand_leaves_the_old_revision(fleet):
    job_id = _running_service(fleet)
    fleet.patch(job_id, {"image": {"ref": "serve:2"}, "canary": 10})
    fleet.take("c")
    fleet.deps.scheduler.advance_rollouts()
    r = fleet.api.simulate_post(f"/v1/jobs/{job_id}/service/rollback", headers=fleet.h)
    assert r.status_code == 200 and r.json["rollout"]["state"] == "rolling_back"
    for _ in range(2):
        fleet.settle()
    shown = fleet.service(job_id)
    assert shown["updates"][0]["state"] == "rolled_back" and shown["updates"][0]["reason"] == "requested"
    assert fleet.serving(job_id) == [(0, 1), (1, 1)] and fleet.held["c"] == []
    r = fleet.api.simulate_post(f"/v1/jobs/{job_id}/service/rollback", headers=fleet.h)
    assert r.status_code == 409 and r.json["error"]["code"] == "no_update"


def test_a_control_plane_restarted_mid_rollout_carries_on_from_the_state_file(fleet, config, clock):
    job_id = _running_service(fleet)
    fleet.patch(job_id, {"env": {"V": "2"}})
    fleet.take("c")
    fleet.deps.store.close()                 # the plane stops: only the state file is left
    fleet.deps = new_deps(config, clock=clock)
    from gpulayer.server.http.app import create_app
    import falcon.testing
    fleet.api = falcon.testing.TestClient(create_app(fleet.deps))
    fleet.deps.scheduler.advance_rollouts()
    fleet.settle()
    fleet.take("a")
    fleet.deps.scheduler.advance_rollouts()
    fleet.settle()
    fleet.settle()
    assert fleet.service(job_id)["revision"] == 2 and fleet.serving(job_id) == [(0, 2), (1, 2)]
    fleet.deps.store.close()


@pytest.mark.parametrize("body, code", [
    ({}, "invalid_field"),
    ({"env": {"V": "1"}}, "no_change"),
    ({"env": {"V": "2"}, "canary": 0}, "invalid_field"),
    ({"env": {"V": "2"}, "canary": 100}, "invalid_field"),
    ({"env": {"V": "2"}, "max_surge": 0, "max_unavailable": 0}, "invalid_field"),
    ({"env": {"V": "2"}, "max_unavailable": 2}, "invalid_field"),
    ({"env": {"V": "2"}, "replicas": 3}, "invalid_field"),
    ({"env": {"1BAD": "x"}}, "invalid_field"),
    ({"command": []}, "invalid_field"),
    ({"image": {"manifest": "nope"}}, "invalid_field"),
])
def test_a_bad_update_is_refused_and_changes_nothing(fleet, body, code):
    job_id = _running_service(fleet)
    before = fleet.kinds(job_id)
    answer = fleet.patch(job_id, body, status=400)
    assert answer["error"]["code"] == code, answer
    assert fleet.service(job_id)["updates"] == [] and fleet.kinds(job_id) == before


def test_a_canary_without_an_ingress_is_refused(fleet):
    r = fleet.api.simulate_post("/v1/jobs", headers=fleet.h, json=SERVE)
    fleet.take("a")
    fleet.take("b")
    answer = fleet.patch(r.json["id"], {"env": {"V": "2"}, "canary": 10}, status=400)
    assert answer["error"]["code"] == "canary_needs_ingress" and fleet.service(r.json["id"])["updates"] == []


def test_updates_a_batch_job_an_ended_service_or_one_rolling_are_409_and_change_nothing(fleet):
    batch = fleet.api.simulate_post("/v1/jobs", headers=fleet.h, json={"command": ["true"]}).json["id"]
    assert fleet.patch(batch, {"env": {"V": "2"}}, status=409)["error"]["code"] == "not_a_service"
    job_id = _running_service(fleet)
    fleet.patch(job_id, {"env": {"V": "2"}})
    busy = fleet.patch(job_id, {"env": {"V": "3"}}, status=409)["error"]
    assert busy["code"] == "update_in_progress"
    assert [u["revision"] for u in fleet.service(job_id)["updates"]] == [2]
    fleet.api.simulate_post(f"/v1/jobs/{job_id}/cancel", headers=fleet.h)
    for name in fleet.workers:
        fleet.beat(name)
    assert fleet.patch(job_id, {"env": {"V": "3"}}, status=409)["error"]["code"] == "job_ended"
    fleet.deps.scheduler.advance_rollouts()
    assert fleet.service(job_id)["updates"][0]["state"] == "ended"
    assert fleet.api.simulate_patch("/v1/jobs/999/service", headers=fleet.h, json={"env": {"V": "2"}}).status_code == 404


def test_the_moves_keep_surge_and_unavailability_within_their_bounds():
    def t(i, index, rev, ready=True, state="running"):
        return {"id": i, "index": index, "revision": rev, "state": state, "endpoint": "h:1" if ready else None,
                "drain_deadline": None, "cancel_requested": 0}
    old = [t(1, 0, 1), t(2, 1, 1), t(3, 2, 1)]
    assert rollout.moves(old, 2, 1, 0) == rollout.Plan(add=(0,))
    assert rollout.moves(old + [t(4, 0, 2, ready=False)], 2, 1, 0) == rollout.Plan()
    assert rollout.moves(old + [t(4, 0, 2)], 2, 1, 0) == rollout.Plan(drain=(1,), add=(1,))
    assert rollout.moves(old, 2, 0, 1) == rollout.Plan(drain=(3,), add=(2,))
    assert rollout.moves(old, 2, 2, 0) == rollout.Plan(add=(0, 1))
    assert rollout.moves(old + [t(4, 0, 2)], 2, 1, 0, held=True) == rollout.Plan()
    assert rollout.moves([t(4, 0, 2), t(5, 1, 2), t(6, 2, 2)], 2, 1, 0).done
    # an autoscaled service's indices are those its live replicas hold (its count follows its load): one more
    # replica is rolled too, one drained by a scale-down is not brought back, none left is done; a fixed
    # service's are 0 to its width - 1 whatever is live (a new replica lost with its worker is surged again)
    assert rollout.moves(old + [t(7, 3, 1)], 2, 1, 0) == rollout.Plan(add=(0,))
    four = [t(4, 0, 2), t(5, 1, 2), t(6, 2, 2), t(7, 3, 1)]
    assert rollout.moves(four, 2, 1, 0) == rollout.Plan(add=(3,))
    assert rollout.moves([*four[:3], {**t(7, 3, 1), "drain_deadline": 1.0}], 2, 1, 0).done
    assert rollout.moves([], 2, 1, 0).done
    assert rollout.moves([t(4, 1, 2), t(5, 2, 2)], 2, 1, 0, width=3) == rollout.Plan(add=(0,))
