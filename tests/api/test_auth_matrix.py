"""Every route × every kind of caller; task and artifact ownership; the protocol header; OpenAPI = routes."""
from __future__ import annotations

import hashlib
import re

import pytest

from apihelpers import PROTO, bearer
from gpulayer.server.http.app import ROUTES
from gpulayer.server.http.openapi import METHODS

CALLERS = ("none", "join", "worker", "client", "revoked", "expired")
PUBLIC = {"/v1/health", "/v1/ca.pem", "/v1/ssh-host-ca.pub"}
DIGEST = "sha256:" + hashlib.sha256(b"artifact").hexdigest()


def family(template: str) -> set[str]:
    """The callers that may use a route (docs/protocol.md), written out rather than read from the code."""
    if template in PUBLIC:
        return set(CALLERS)
    if template == "/v1/workers/register":
        return {"join"}
    if template.startswith("/v1/worker/"):
        return {"worker"}
    if template.startswith("/v1/artifacts/"):
        return {"worker", "client"}
    return {"client"}


def operations():
    for template, cls, suffix in ROUTES:
        for method in METHODS:
            if hasattr(cls, f"on_{method}" + (f"_{suffix}" if suffix else "")):
                yield template, method


def concrete(template: str, task_id: int, job_id: int) -> str:
    return (template.replace("{task_id:int}", str(task_id)).replace("{job_id:int}", str(job_id))
            .replace("{jti}", "nope").replace("{name}", "SOME_SECRET").replace("{digest}", DIGEST)
            .replace("{worker}", "nobody").replace("{index:int}", "0").replace("{webhook_id:int}", "1")
            .replace("{checkpoint_id:int}", "1"))


@pytest.fixture
def callers(api, deps, tokens, client_h, worker, clock):
    """Headers for every kind of caller, plus a held task and a job."""
    return _callers(api, deps, tokens, client_h, worker, clock)


@pytest.fixture(scope="module")
def refused_callers(tmp_path_factory, state_template, module_clock):
    """`callers` on one app for the module, for the tests whose every request is refused before any handler
    runs (another protocol: 426), so no test sees another's writes; the fast loop built it per test."""
    import json
    import shutil

    import falcon.testing

    from gpulayer.server.config import ControlPlaneConfig
    from gpulayer.server.http.app import create_app, new_deps
    from gpulayer.server.security.auth import init_home
    home = tmp_path_factory.mktemp("auth-matrix") / "home"
    tokens = init_home(home)
    config = ControlPlaneConfig(home=home, heartbeat_interval_s=0.5, lease_ttl_s=3.0)
    shutil.copyfile(state_template, config.layout.state)
    clock = module_clock
    deps = new_deps(config, clock=clock)
    api = falcon.testing.TestClient(create_app(deps))

    def worker(name):
        r = api.simulate_post("/v1/workers/register", headers=bearer(tokens["join_token"]), json={
            "name": name, "labels": {}, "version": "t", "slots": 1,
            "resources": {"cpus": 8, "gpus": 0, "memory_mb": 1000, "gpu_models": []}})
        assert r.status_code == 200, r.text
        return r.json["worker_id"], bearer(r.json["session_token"])
    yield api, _callers(api, deps, tokens, bearer(tokens["client_token"]), worker, clock)
    deps.store.close()


def _callers(api, deps, tokens, client_h, worker, clock) -> dict:
    assert api.simulate_put(f"/v1/artifacts/{DIGEST}", headers=client_h, body=b"artifact").status_code == 201
    job_id = api.simulate_post("/v1/jobs", headers=client_h,
                               json={"command": ["x"], "inputs": {"in.bin": DIGEST},
                                     "outputs": ["out"]}).json["id"]
    wid, wh = worker("owner")
    task = api.simulate_post("/v1/worker/acquire", headers=wh, json={}).json["task"]
    revoked = deps.scheduler.mint_token(name="old", labels={}, expires_in_s=None)
    expiring = deps.scheduler.mint_token(name="soon", labels={}, expires_in_s=60)
    for minted in (revoked, expiring):  # used once while good, so any cache has seen them
        r = api.simulate_post("/v1/workers/register", headers=bearer(minted["token"]), json={"name": "x"})
        assert r.status_code == 200, r.text
    deps.scheduler.revoke_token(revoked["jti"])
    clock.advance(61)
    api.simulate_post("/v1/worker/heartbeat", headers=wh, json={})  # the owner keeps its lease
    return {"headers": {"none": dict(PROTO), "join": bearer(tokens["join_token"]), "worker": wh,
                        "client": client_h, "revoked": bearer(revoked["token"]),
                        "expired": bearer(expiring["token"])},
            "task_id": task["task_id"], "job_id": job_id}


@pytest.mark.parametrize("template, method", list(operations()))
def test_route_by_caller(api, callers, template, method):
    allowed = family(template)
    path = concrete(template, callers["task_id"], callers["job_id"])
    # the worker last: some of its calls (deregister) end its session
    for caller in sorted(CALLERS, key=lambda c: c == "worker"):
        r = api.simulate_request(method.upper(), path, headers=callers["headers"][caller], json={})
        got = r.status_code
        if caller in allowed:
            assert got not in (401, 403, 426), (caller, method, path, got, r.text)
        elif caller in ("none", "revoked", "expired"):
            assert got == 401, (caller, method, path, got, r.text)
        else:
            assert got == 403, (caller, method, path, got, r.text)
        assert got < 500
        if got in (401, 403) and method != "head":
            assert r.json["error"]["code"] == ("unauthorized" if got == 401 else "forbidden")


def test_openapi_served_to_anyone(api, callers):
    for caller in ("join", "worker", "client", "none", "revoked", "expired"):
        assert api.simulate_get("/v1/openapi.json", headers=callers["headers"][caller]).status_code == 200


def test_garbage_tokens_are_401(api):
    for header in ("Bearer", "Bearer ", "Basic abc", "Bearer glc_", "Bearer glc_" + "a" * 300, "Bearer xyz_abc",
                   "Bearer glw_nope", "Bearer glj_nope", "Bearer glm_nope"):
        r = api.simulate_get("/v1/jobs", headers={"Authorization": header})
        assert r.status_code == 401 and r.json["error"]["code"] == "unauthorized", header


def test_expired_token_refused_even_after_use(api, deps, clock):
    minted = deps.scheduler.mint_token(name="t", labels={}, expires_in_s=10)
    assert api.simulate_post("/v1/workers/register", headers=bearer(minted["token"]),
                             json={"name": "w"}).status_code == 200
    clock.advance(10)
    r = api.simulate_post("/v1/workers/register", headers=bearer(minted["token"]), json={"name": "w"})
    assert r.status_code == 401


def test_deregistered_worker_session_is_401(api, worker):
    _, wh = worker()
    assert api.simulate_post("/v1/worker/deregister", headers=wh).status_code == 200
    assert api.simulate_post("/v1/worker/acquire", headers=wh, json={}).status_code == 401
    hb = api.simulate_post("/v1/worker/heartbeat", headers=wh, json={})
    assert hb.status_code == 200 and hb.json["revoked"] is False and hb.json["lease_expires_at"] is None


# -- one worker cannot touch another's task -------------------------------------

def test_worker_a_cannot_touch_worker_b_task(api, client_h, worker, deps):
    data = b"the inputs"
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    other = b"not named by any task"
    other_digest = "sha256:" + hashlib.sha256(other).hexdigest()
    for blob, d in ((data, digest), (other, other_digest)):
        assert api.simulate_put(f"/v1/artifacts/{d}", headers=client_h, body=blob).status_code == 201
    _, a = worker("a")
    _, b = worker("b")
    api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["x"], "inputs": {"in.txt": digest},
                                                         "labels": {}, "outputs": ["out"]})
    task = api.simulate_post("/v1/worker/acquire", headers=b, json={}).json["task"]
    tid = task["task_id"]
    assert api.simulate_post("/v1/worker/acquire", headers=a, json={}).json["task"] is None
    before = deps.store.read(lambda c: c.execute("SELECT state, pid FROM tasks WHERE id = ?", (tid,)).fetchall())
    for sub, body in (("start", {"pid": 1}), ("logs", {"lines": [{"n": 0, "text": "x"}]}),
                      ("rendezvous", {"address": "10.0.0.1", "port": 1234}),
                      ("finish", {"outcome": "succeeded", "exit_code": 0})):
        r = api.simulate_post(f"/v1/worker/tasks/{tid}/{sub}", headers=a, json=body)
        assert r.status_code == 409 and r.json["error"]["code"] == "task_not_assigned", (sub, r.text)
    assert deps.store.read(lambda c: c.execute("SELECT state, pid FROM tasks WHERE id = ?",
                                               (tid,)).fetchall()) == before
    assert deps.store.read(lambda c: c.execute("SELECT count(*) AS n FROM logs").fetchall())[0]["n"] == 0
    # artifacts: B reads what its task names; A reads nothing; nobody reads what no task names
    assert api.simulate_get(f"/v1/artifacts/{digest}", headers=b).content == data
    assert api.simulate_head(f"/v1/artifacts/{digest}", headers=b).status_code == 200
    assert api.simulate_get(f"/v1/artifacts/{digest}", headers=a).status_code == 403
    assert api.simulate_head(f"/v1/artifacts/{digest}", headers=a).status_code == 403
    assert api.simulate_get(f"/v1/artifacts/{other_digest}", headers=b).status_code == 403
    # uploads: only while holding a task that declares outputs
    out = b"output"
    out_digest = "sha256:" + hashlib.sha256(out).hexdigest()
    assert api.simulate_put(f"/v1/artifacts/{out_digest}", headers=a, body=out).status_code == 403
    assert api.simulate_put(f"/v1/artifacts/{out_digest}", headers=b, body=out).status_code == 201


# -- the protocol header -------------------------------------------------------

@pytest.mark.parametrize("template, method", list(operations()))
def test_other_protocol_is_426(refused_callers, template, method):
    api, callers = refused_callers
    path = concrete(template, callers["task_id"], callers["job_id"])
    caller = "worker" if "worker" in family(template) and template.startswith("/v1/worker") else "client"
    if template == "/v1/workers/register":
        caller = "join"
    headers = {**callers["headers"][caller], "X-GpuLayer-Protocol": "2"}
    r = api.simulate_request(method.upper(), path, headers=headers, json={})
    assert r.status_code == 426, (method, path, r.status_code)
    if method != "head":
        assert r.json["error"]["code"] == "protocol_mismatch"
        assert r.json["protocol"] == 1 and r.json["client_protocol"] == "2"
    assert r.headers["X-GpuLayer-Protocol"] == "1"


def test_worker_routes_require_the_header(api, callers):
    for template, method in operations():
        path = concrete(template, callers["task_id"], callers["job_id"])
        caller = "join" if template == "/v1/workers/register" else "worker" if template.startswith("/v1/worker/") \
            else "client"
        headers = {k: v for k, v in callers["headers"][caller].items() if k != "X-GpuLayer-Protocol"}
        r = api.simulate_request(method.upper(), path, headers=headers, json={})
        if caller in ("join", "worker"):
            assert r.status_code == 426, (path, r.status_code)
            assert r.json["client_protocol"] is None
        else:
            assert r.status_code != 426, (path, r.status_code)


def test_register_with_another_protocol_lists_needs_upgrade(api, tokens, client_h):
    r = api.simulate_post("/v1/workers/register", headers={**bearer(tokens["join_token"]), "X-GpuLayer-Protocol": "2"},
                          json={"name": "old-agent", "version": "0.0.1"})
    assert r.status_code == 426
    listed = api.simulate_get("/v1/workers", headers=client_h).json["workers"]
    assert [(w["name"], w["state"]) for w in listed] == [("old-agent", "needs_upgrade")]


# -- OpenAPI -------------------------------------------------------------------

def test_openapi_paths_equal_the_routes(api, client_h, deps, tmp_path):
    doc = api.simulate_get("/v1/openapi.json", headers=client_h).json
    expected: dict[str, set] = {"/v1/openapi.json": {"get"}}
    for template, method in operations():
        expected.setdefault(re.sub(r"\{(\w+):\w+\}", r"{\1}", template), set()).add(method)
    assert {p: set(ops) for p, ops in doc["paths"].items()} == expected
    # and every documented operation is served (not 404/405) at its path
    pem = tmp_path / "ca.pem"
    pem.write_text("pem")
    deps.ca_file = pem
    for path, ops in doc["paths"].items():
        real = (path.replace("{task_id}", "1").replace("{job_id}", "1").replace("{jti}", "x")
                .replace("{name}", "X").replace("{digest}", DIGEST).replace("{worker}", "w").replace("{index}", "0")
                .replace("{webhook_id}", "1").replace("{checkpoint_id}", "1"))
        for method in ops:
            r = api.simulate_request(method.upper(), real)
            assert r.status_code not in (404, 405), (method, path, r.status_code)
    for path in doc["paths"]:
        assert path.startswith("/v1/")
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert "default" in op["responses"], (method, path)
