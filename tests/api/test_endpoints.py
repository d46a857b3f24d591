"""Every /v1 endpoint through falcon.testing: happy paths, and bad input as a 4xx that writes nothing."""
from __future__ import annotations

import hashlib
import json
import threading
import time

import pytest

from apihelpers import PROTO, bearer

from gpulayer.testing import wait_for

TABLES = ("workers", "jobs", "tasks", "events", "logs", "artifacts", "tokens", "rendezvous", "secrets")


def counts(deps) -> dict:
    return deps.store.read(lambda c: {t: c.execute(f"SELECT count(*) AS n FROM {t}").fetchall()[0]["n"]
                                      for t in TABLES})


def artifact_files(deps) -> list:
    return sorted(p.name for p in deps.artifacts.root.rglob("*") if p.is_file())


def assert_error(r, status, code=None):
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json
    assert set(body["error"]) >= {"code", "message"}, body
    assert isinstance(body["error"]["code"], str) and body["error"]["code"]
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if code:
        assert body["error"]["code"] == code, body
    assert r.headers["X-GpuLayer-Protocol"] == "1"
    return body


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture
def running(api, client_h, worker):
    """A worker holding a started task of a fresh job: (worker headers, assignment, job id)."""
    wid, wh = worker()
    job_id = api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["echo", "x"]}).json["id"]
    a = api.simulate_post("/v1/worker/acquire", headers=wh, json={}).json["task"]
    assert api.simulate_post(f"/v1/worker/tasks/{a['task_id']}/start", headers=wh, json={"pid": 7}).status_code == 200
    return wh, a, job_id


# -- happy paths ---------------------------------------------------------------

def test_health_and_openapi(api, client_h):
    r = api.simulate_get("/v1/health")
    assert r.status_code == 200 and r.json == {"ok": True, "protocol": 1}
    doc = api.simulate_get("/v1/openapi.json", headers=client_h).json
    assert doc["openapi"].startswith("3.") and "/v1/jobs" in doc["paths"]


def test_ca_pem(api, deps, tmp_path):
    assert_error(api.simulate_get("/v1/ca.pem"), 404, "not_found")
    pem = tmp_path / "ca.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n")
    deps.ca_file = pem
    r = api.simulate_get("/v1/ca.pem")
    assert r.status_code == 200 and r.text.startswith("-----BEGIN CERTIFICATE")


def test_ssh_host_ca_pub(api, deps):
    """The SSH host CA's public key: made once in the home, the same on every call, no token needed."""
    first = api.simulate_get("/v1/ssh-host-ca.pub")
    assert first.status_code == 200 and first.text.startswith("ssh-ed25519 ") and first.text.endswith(" gpulayer-ssh-host-ca\n")
    assert api.simulate_get("/v1/ssh-host-ca.pub").text == first.text
    assert (deps.config.home / "ssh_host_ca").stat().st_mode & 0o077 == 0  # the private key: the owner's only


def test_worker_cycle(api, client_h, worker, deps, clock):
    wid, wh = worker(name="gpu1", gpus=2, labels={"zone": "a"})
    assert api.simulate_post("/v1/worker/acquire", headers=wh, json={}).json == {"task": None}
    assert api.simulate_post("/v1/worker/acquire", headers=wh).json == {"task": None}  # empty body is fine
    spec = {"command": ["python", "-c", "print(1)"], "gpus": 2, "labels": {"zone": "a"}, "env": {"A": "1"},
            "outputs": ["out.txt"], "name": "train", "timeout_seconds": 60}
    r = api.simulate_post("/v1/jobs", headers=client_h, json=spec)
    assert r.status_code == 201 and r.headers["Location"] == f"/v1/jobs/{r.json['id']}"
    job_id = r.json["id"]
    a = api.simulate_post("/v1/worker/acquire", headers=wh, json={"wait_s": 0}).json["task"]
    assert a["job_id"] == job_id and a["gpus"] == [0, 1] and a["attempt"] == 1 and a["env"] == {"A": "1"}
    assert a["rank"] == 0 and a["world_size"] == 1 and a["service"] is None and a["timeout_seconds"] == 60
    assert api.simulate_post("/v1/worker/acquire", headers=wh, json={}).json["task"] == a
    tid = a["task_id"]
    assert api.simulate_post(f"/v1/worker/tasks/{tid}/start", headers=wh, json={}).json == {"ok": True}
    hb = api.simulate_post("/v1/worker/heartbeat", headers=wh,
                           json={"tasks": [{"task_id": tid, "state": "running", "endpoint": None, "restarts": 0}]})
    answer = dict(hb.json)
    assert 0.5 <= answer.pop("heartbeat_interval_s") <= 0.6  # the base interval, jittered up to 20%
    assert answer == {"cancel_task_ids": [], "revoked": False, "lease_expires_at": clock.now + 3.0,
                       "requests_renew_lease": True}
    lines = [{"n": i, "stream": "stdout", "text": f"line {i}", "at": clock.now} for i in range(3)]
    assert api.simulate_post(f"/v1/worker/tasks/{tid}/logs", headers=wh, json={"lines": lines}).json == \
        {"ok": True, "accepted": 3}
    assert api.simulate_post(f"/v1/worker/tasks/{tid}/logs", headers=wh, json={"lines": lines}).json["accepted"] == 0
    out = sha(b"result")
    api.simulate_put(f"/v1/artifacts/{out}", headers=wh, body=b"result")
    r = api.simulate_post(f"/v1/worker/tasks/{tid}/finish", headers=wh,
                          json={"exit_code": 0, "outcome": "succeeded", "outputs": {"out.txt": out}})
    assert r.json == {"accepted": True}
    job = api.simulate_get(f"/v1/jobs/{job_id}", headers=client_h).json
    assert job["state"] == "succeeded" and job["exit_code"] == 0 and job["name"] == "train"
    assert job["spec"]["gpus"] == 2
    t = job["tasks"][0]
    assert t["task_id"] == tid and t["worker_id"] == wid and t["state"] == "succeeded" and t["index"] == 0
    assert {"endpoint", "restarts", "started_at", "finished_at", "exit_code", "attempt"} <= set(t)
    logs = api.simulate_get(f"/v1/jobs/{job_id}/logs", headers=client_h).json
    assert [x["text"] for x in logs["lines"]] == ["line 0", "line 1", "line 2"] and logs["next"] == logs["lines"][-1]["seq"]
    more = api.simulate_get(f"/v1/jobs/{job_id}/logs", headers=client_h, params={"after": logs["lines"][0]["seq"],
                                                                               "limit": 1}).json
    assert [x["text"] for x in more["lines"]] == ["line 1"]
    assert logs["ended"] is True and more["ended"] is False  # the job has ended; a line follows that page
    assert api.simulate_get(f"/v1/jobs/{job_id}/logs", headers=client_h,
                            params={"after": logs["next"]}).json == {"lines": [], "next": logs["next"], "ended": True}
    evs = api.simulate_get(f"/v1/jobs/{job_id}/events", headers=client_h).json["events"]
    assert [e["kind"] for e in evs] == ["job_submitted", "task_assigned", "task_started", "task_finished",
                                        "job_finished"]
    assert all({"seq", "at", "kind", "task_id", "worker_id", "data"} <= set(e) for e in evs)
    assert api.simulate_get(f"/v1/jobs/{job_id}/outputs", headers=client_h).json == {"outputs": {"out.txt": out}}
    assert api.simulate_get(f"/v1/jobs/{job_id}/endpoints", headers=client_h).json == \
        {"endpoints": [], "ready": False}
    ws = api.simulate_get("/v1/workers", headers=client_h).json["workers"]
    assert len(ws) == 1 and ws[0]["id"] == wid and ws[0]["state"] == "online" and ws[0]["labels"] == {"zone": "a"}
    assert ws[0]["free"]["gpus"] == 2 and ws[0]["resources"]["gpus"] == 2
    assert api.simulate_post("/v1/worker/deregister", headers=wh).json["ok"] is True
    assert api.simulate_get("/v1/workers", headers=client_h).json["workers"] == []
    assert len(api.simulate_get("/v1/workers", headers=client_h, params={"all": "true"}).json["workers"]) == 1


def test_service_endpoints_and_cancel(api, client_h, worker):
    wid, wh = worker("a")
    wid2, wh2 = worker("b")
    job_id = api.simulate_post("/v1/jobs", headers=client_h,
                               json={"command": ["serve"], "service": {"replicas": 2}}).json["id"]
    held = []
    for h in (wh, wh2):
        a = api.simulate_post("/v1/worker/acquire", headers=h, json={}).json["task"]
        api.simulate_post(f"/v1/worker/tasks/{a['task_id']}/start", headers=h, json={"pid": 1})
        held.append((h, a))
    h, a = held[0]
    api.simulate_post("/v1/worker/heartbeat", headers=h, json={"tasks": [
        {"task_id": a["task_id"], "state": "running", "endpoint": "10.0.0.1:8000", "restarts": 0}]})
    assert api.simulate_get(f"/v1/jobs/{job_id}/endpoints", headers=client_h).json == \
        {"endpoints": ["10.0.0.1:8000"], "ready": False}
    h2, a2 = held[1]
    api.simulate_post("/v1/worker/heartbeat", headers=h2, json={"tasks": [
        {"task_id": a2["task_id"], "state": "running", "endpoint": "10.0.0.2:8000", "restarts": 1}]})
    assert api.simulate_get(f"/v1/jobs/{job_id}/endpoints", headers=client_h).json["ready"] is True
    r = api.simulate_post(f"/v1/jobs/{job_id}/cancel", headers=client_h)
    assert r.status_code == 200 and r.json["state"] == "cancelled"
    hb = api.simulate_post("/v1/worker/heartbeat", headers=h, json={"tasks": [
        {"task_id": a["task_id"], "state": "running", "endpoint": "10.0.0.1:8000", "restarts": 0}]}).json
    assert hb["cancel_task_ids"] == [a["task_id"]]
    assert api.simulate_post(f"/v1/jobs/{job_id}/cancel", headers=client_h).json["state"] == "cancelled"


def test_rendezvous_endpoint(api, client_h, worker):
    ws = [worker(f"w{i}") for i in range(2)]
    api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["torchrun"], "nodes": 2})
    held = [(h, api.simulate_post("/v1/worker/acquire", headers=h, json={}).json["task"]) for _, h in ws]
    assert sorted(a["rank"] for _, a in held) == [0, 1] and all(a["world_size"] == 2 for _, a in held)
    (h0, a0), (h1, a1) = sorted(held, key=lambda x: x[1]["rank"])
    r = api.simulate_post(f"/v1/worker/tasks/{a0['task_id']}/rendezvous", headers=h0,
                          json={"address": "10.0.0.1", "port": 29500})
    assert r.status_code == 200 and r.json["ready"] is False
    r = api.simulate_post(f"/v1/worker/tasks/{a1['task_id']}/rendezvous", headers=h1,
                          json={"address": "10.0.0.2", "port": 29501}).json
    assert r["ready"] and r["rank"] == 1 and r["master_addr"] == "10.0.0.1" and r["master_port"] == 29500
    assert r["peers"] == ["10.0.0.1:29500", "10.0.0.2:29501"]


def test_job_listing(api, client_h, worker):
    ids = [api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["x"], "name": f"j{i}"}).json["id"]
           for i in range(5)]
    api.simulate_post(f"/v1/jobs/{ids[1]}/cancel", headers=client_h)
    listed = api.simulate_get("/v1/jobs", headers=client_h).json["jobs"]
    assert [j["id"] for j in listed] == ids[::-1]
    assert [j["id"] for j in api.simulate_get("/v1/jobs", headers=client_h, params={"limit": 2}).json["jobs"]] == \
        ids[:-3:-1]
    assert [j["id"] for j in api.simulate_get("/v1/jobs", headers=client_h,
                                              params={"before": ids[2]}).json["jobs"]] == ids[1::-1]
    assert [j["id"] for j in api.simulate_get("/v1/jobs", headers=client_h,
                                              params={"state": "cancelled"}).json["jobs"]] == [ids[1]]
    for params in ({"limit": "0"}, {"limit": "1001"}, {"limit": "abc"}, {"state": "sleeping"}, {"before": "x"}):
        assert_error(api.simulate_get("/v1/jobs", headers=client_h, params=params), 400, "invalid_field")
    assert_error(api.simulate_get("/v1/jobs/999", headers=client_h), 404, "not_found")
    for sub in ("logs", "events", "endpoints", "outputs"):
        assert_error(api.simulate_get(f"/v1/jobs/999/{sub}", headers=client_h), 404, "not_found")
    assert_error(api.simulate_post("/v1/jobs/999/cancel", headers=client_h), 404, "not_found")
    assert_error(api.simulate_get(f"/v1/jobs/{ids[0]}/logs", headers=client_h, params={"wait_s": "99"}), 400)


def test_tokens(api, client_h, tokens, clock):
    r = api.simulate_post("/v1/tokens", headers=client_h,
                          json={"name": "rack1", "labels": {"rack": "1"}, "expires_in_s": 3600})
    assert r.status_code == 201
    minted = r.json
    assert minted["token"].startswith("glj_") and minted["expires_at"] == clock.now + 3600
    listed = api.simulate_get("/v1/tokens", headers=client_h).json["tokens"]
    assert [t["jti"] for t in listed] == [minted["jti"]]
    assert "token" not in listed[0] and "token_hash" not in listed[0]
    reg = api.simulate_post("/v1/workers/register", headers=bearer(minted["token"]),
                            json={"name": "ignored", "labels": {"rack": "1"}, "version": "t"})
    assert reg.status_code == 200 and reg.json["name"] == "rack1" and reg.json["labels"] == {"rack": "1"}
    assert_error(api.simulate_post("/v1/workers/register", headers=bearer(minted["token"]),
                                   json={"name": "x", "labels": {"rack": "2"}}), 403, "label_not_allowed")
    r = api.simulate_post(f"/v1/tokens/{minted['jti']}/revoke", headers=client_h)
    assert r.status_code == 200 and r.json["revoked_at"] == clock.now and r.json["workers_revoked"] == [reg.json["worker_id"]]
    hb = api.simulate_post("/v1/worker/heartbeat", headers=bearer(reg.json["session_token"]), json={})
    assert hb.status_code == 200 and hb.json["revoked"] is True
    assert_error(api.simulate_post("/v1/tokens/nope/revoke", headers=client_h), 404, "not_found")
    assert_error(api.simulate_post("/v1/tokens", headers=client_h, json={"name": "x", "kind": "worker"}), 400)
    assert_error(api.simulate_post("/v1/tokens", headers=client_h, json={"name": "x", "user": "admin"}), 400)
    mine = api.simulate_post("/v1/tokens", headers=client_h, json={"name": "x", "kind": "client"})
    assert mine.status_code == 201 and mine.json["user"] == "admin" and mine.json["token"].startswith("glc_")
    assert_error(api.simulate_post("/v1/tokens", headers=client_h, json={"name": "x", "bogus": 1}), 400)


def test_secrets(api, client_h, worker):
    assert api.simulate_get("/v1/secrets", headers=client_h).json == {"secrets": [], "next": None}
    r = api.simulate_put("/v1/secrets/HF_TOKEN", headers=client_h, json={"value": "s3cret", "labels": {}})
    assert r.status_code == 200 and r.json == {"name": "HF_TOKEN", "labels": {}}
    listed = api.simulate_get("/v1/secrets", headers=client_h).json["secrets"]
    assert [s["name"] for s in listed] == ["HF_TOKEN"] and "value" not in listed[0]
    wid, wh = worker()
    api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["x"], "secrets": ["HF_TOKEN"]})
    a = api.simulate_post("/v1/worker/acquire", headers=wh, json={}).json["task"]
    assert a["env"] == {"HF_TOKEN": "s3cret"}
    assert_error(api.simulate_put("/v1/secrets/bad-name", headers=client_h, json={"value": "v"}), 400)
    assert_error(api.simulate_put("/v1/secrets/X", headers=client_h, json={"value": 1}), 400)
    assert_error(api.simulate_put("/v1/secrets/X", headers=client_h, json={"value": "v", "more": 1}), 400)
    assert api.simulate_delete("/v1/secrets/HF_TOKEN", headers=client_h).json == {"ok": True}
    assert_error(api.simulate_delete("/v1/secrets/HF_TOKEN", headers=client_h), 404, "not_found")
    assert_error(api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["x"], "secrets": ["HF_TOKEN"]}),
                 400, "unknown_secret")


def test_artifacts(api, client_h, deps):
    data = b"\x00bytes" * 1000
    digest = sha(data)
    assert api.simulate_head(f"/v1/artifacts/{digest}", headers=client_h).status_code == 404
    assert_error(api.simulate_get(f"/v1/artifacts/{digest}", headers=client_h), 404, "not_found")
    r = api.simulate_put(f"/v1/artifacts/{digest}", headers={**client_h, "Content-Type": "application/octet-stream"},
                         body=data)
    assert r.status_code == 201 and r.json == {"digest": digest, "size": len(data)}
    assert api.simulate_head(f"/v1/artifacts/{digest}", headers=client_h).status_code == 200
    got = api.simulate_get(f"/v1/artifacts/{digest}", headers=client_h)
    assert got.status_code == 200 and got.content == data
    assert counts(deps)["artifacts"] == 1


# -- bad input: a 4xx with the error shape, and nothing written -------------------

@pytest.fixture
def unchanged(deps):
    """Assert that the state file's rows and the artifact files are the same after the block."""
    class Guard:
        def __enter__(self):
            self.before = (counts(deps), artifact_files(deps))

        def __exit__(self, *exc):
            if exc[0] is None:
                assert (counts(deps), artifact_files(deps)) == self.before
    return Guard()


BAD_JOBS = [
    ("{nope", 400, "invalid_json"),
    ("", 400, "invalid_json"),
    ("[1, 2]", 400, "invalid_json"),
    ('"command"', 400, "invalid_json"),
    ("\xff\xfe", 400, "invalid_json"),
    (json.dumps({"command": "echo"}), 400, "invalid_field"),
    (json.dumps({"command": []}), 400, "invalid_field"),
    (json.dumps({"command": ["x"], "gpus": "2"}), 400, "invalid_field"),
    (json.dumps({"command": ["x"], "cpus": -1}), 400, "invalid_field"),
    (json.dumps({"command": ["x"], "labels": {"a": 1}}), 400, "invalid_field"),
    (json.dumps({"command": ["x"], "surprise": True}), 400, "invalid_field"),
    (json.dumps({"command": ["x"], "service": {"replicas": "two"}}), 400, "invalid_field"),
    (json.dumps({"command": ["x"], "retry": []}), 400, "invalid_field"),
    (json.dumps({"command": ["x"], "inputs": {"../x": "sha256:" + "0" * 64}}), 400, "invalid_field"),
    (json.dumps({"command": ["x"], "priority": 10**30}), 400, "invalid_field"),
    ('{"command": ["x"], "cpus": NaN}', 400, None),
    ('{"command": ["x"], "cpus": Infinity}', 400, None),
    (json.dumps({"command": ["x" * 100] * 11_000}), 413, "body_too_large"),
]


@pytest.mark.parametrize("body, status, code", BAD_JOBS)
def test_bad_jobs_refused_and_nothing_written(api, client_h, unchanged, body, status, code):
    with unchanged:
        assert_error(api.simulate_post("/v1/jobs", headers=client_h, body=body), status, code)


def test_unknown_field_named(api, client_h, unchanged):
    with unchanged:
        body = assert_error(api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["x"], "gpu": 1}), 400)
        assert "gpu" in body["error"]["message"]


def test_oversized_declared_length(api, client_h, unchanged):
    with unchanged:
        r = api.simulate_post("/v1/jobs", headers={**client_h, "Content-Length": str(5 * 1024 * 1024)}, body="{}")
        assert_error(r, 413, "body_too_large")


WORKER_BAD = [
    ("/v1/worker/heartbeat", {"tasks": "all"}),
    ("/v1/worker/heartbeat", {"tasks": [{"task_id": "one"}]}),
    ("/v1/worker/heartbeat", {"tasks": [{"task_id": 1, "restarts": -1}]}),
    ("/v1/worker/acquire", {"wait_s": "soon"}),
    ("/v1/worker/acquire", {"wait_s": -1}),
    ("/v1/worker/tasks/{tid}/start", {"pid": "x"}),
    ("/v1/worker/tasks/{tid}/logs", {"lines": "x"}),
    ("/v1/worker/tasks/{tid}/logs", {}),
    ("/v1/worker/tasks/{tid}/logs", {"lines": [{"n": 0, "stream": "tty", "text": "x"}]}),
    ("/v1/worker/tasks/{tid}/logs", {"lines": [{"n": -1, "text": "x"}]}),
    ("/v1/worker/tasks/{tid}/logs", {"lines": [{"n": 0, "text": 5}]}),
    ("/v1/worker/tasks/{tid}/logs", {"lines": [{"n": None, "text": None}]}),
    ("/v1/worker/tasks/{tid}/rendezvous", {"address": "a", "port": 0}),
    ("/v1/worker/tasks/{tid}/rendezvous", {"address": 1, "port": 80}),
    ("/v1/worker/tasks/{tid}/finish", {"outcome": "exploded"}),
    ("/v1/worker/tasks/{tid}/finish", {"outcome": "failed", "exit_code": "1"}),
    ("/v1/worker/tasks/{tid}/finish", {"outcome": "succeeded", "outputs": {"/abs": "sha256:" + "0" * 64}}),
    ("/v1/worker/tasks/{tid}/finish", {"outcome": "succeeded", "outputs": {"a": "md5:x"}}),
]


@pytest.mark.parametrize("path, body", WORKER_BAD)
def test_bad_worker_bodies_refused_and_nothing_written(api, running, unchanged, path, body):
    wh, a, _ = running
    path = path.format(tid=a["task_id"])
    with unchanged:
        assert_error(api.simulate_post(path, headers=wh, json=body), 400, "invalid_field")
        assert_error(api.simulate_post(path, headers=wh, body="{not json"), 400, "invalid_json")


def test_bad_register_bodies(api, tokens, unchanged):
    join = bearer(tokens["join_token"])
    with unchanged:
        for body in ({"labels": {}}, {"name": 5}, {"name": "w", "labels": {"a": 1}},
                     {"name": "w", "resources": {"gpus": -1}}, {"name": "w", "resources": {"gpus": "2"}},
                     {"name": "w", "resources": []}, {"name": "w", "slots": 0},
                     {"name": "w", "resources": {"gpu_models": "A100"}}):
            assert_error(api.simulate_post("/v1/workers/register", headers=join, json=body), 400, "invalid_field")
        assert_error(api.simulate_post("/v1/workers/register", headers=join, body="nope"), 400, "invalid_json")


def test_log_body_limit(api, running, unchanged):
    wh, a, _ = running
    big = {"lines": [{"n": i, "text": "x" * 1000} for i in range(9000)]}
    with unchanged:
        assert_error(api.simulate_post(f"/v1/worker/tasks/{a['task_id']}/logs", headers=wh, json=big), 413,
                     "body_too_large")


def test_task_not_assigned_is_409(api, running, worker, unchanged):
    wh, a, _ = running
    _, other = worker("other")
    with unchanged:
        assert_error(api.simulate_post(f"/v1/worker/tasks/{a['task_id']}/start", headers=other, json={}), 409,
                     "task_not_assigned")
        assert_error(api.simulate_post("/v1/worker/tasks/424242/start", headers=wh, json={}), 409,
                     "task_not_assigned")


def test_artifact_digest_mismatch_stores_nothing(api, client_h, deps, unchanged):
    data = b"some bytes"
    wrong = sha(b"other bytes")
    with unchanged:
        assert_error(api.simulate_put(f"/v1/artifacts/{wrong}", headers=client_h, body=data), 400, "digest_mismatch")
    assert api.simulate_head(f"/v1/artifacts/{wrong}", headers=client_h).status_code == 404
    assert list((deps.artifacts.root / "tmp").iterdir()) == []


@pytest.mark.parametrize("digest", [
    "sha256:..%2F..%2Fetc%2Fpasswd",
    "..%2F..%2Fserver-secret",
    "sha256:" + "A" * 64,
    "sha256:" + "0" * 63,
    "md5:" + "0" * 32,
    "sha256:" + "0" * 62 + "%2F" + "0",
    "sha256:%00" + "0" * 63,
])
def test_path_character_digests_refused(api, client_h, deps, unchanged, digest):
    with unchanged:
        for method in ("PUT", "GET"):
            r = api.simulate_request(method, f"/v1/artifacts/{digest}", headers=client_h, body=b"x")
            assert 400 <= r.status_code < 500 and r.status_code != 401, r.status_code
            if r.status_code != 404:
                assert_error(r, 400, "invalid_digest")
        assert api.simulate_head(f"/v1/artifacts/{digest}", headers=client_h).status_code in (400, 404)


GARBAGE = ["{nope", "[]", "null", "1e999999", '{"a": ' * 5000, json.dumps({"tasks": [None]}),
           json.dumps({"lines": [None]}), json.dumps({"name": None, "labels": None, "resources": None}),
           '{"\\ud800": 1}', '{"name": "\\ud800", "labels": {"a": "\\udfff"}, "command": ["\\ud800"], '
           '"lines": [{"text": "\\ud800"}], "outcome": "failed", "reason": "\\ud800", "value": "\\ud800"}']


def test_no_5xx_for_garbage_anywhere(api, client_h, tokens, running, unchanged):
    from gpulayer.server.http.app import ROUTES
    wh, a, job_id = running
    join = bearer(tokens["join_token"])
    headers_for = {"/v1/workers/register": join}
    with unchanged:
        for template, cls, suffix in ROUTES:
            path = (template.replace("{task_id:int}", str(a["task_id"])).replace("{job_id:int}", "999999")
                    .replace("{jti}", "nope").replace("{name}", "NOPE").replace("{digest}", "sha256:" + "1" * 64))
            h = headers_for.get(template, wh if template.startswith("/v1/worker/") else client_h)
            for method in ("post", "put"):
                if not hasattr(cls, f"on_{method}" + (f"_{suffix}" if suffix else "")):
                    continue
                for body in GARBAGE:
                    if template in ("/v1/artifacts/{digest}", "/v1/worker/deregister"):
                        continue  # raw bytes (a digest mismatch, tested above); no body at all
                    r = api.simulate_request(method.upper(), path, headers=h, body=body)
                    assert r.status_code < 500, (method, path, body[:40], r.status_code, r.text)
                    if r.status_code >= 400:
                        assert_error(r, r.status_code)


def test_protocol_header_on_every_answer(api, client_h):
    for path in ("/v1/health", "/v1/jobs", "/v1/nope", "/v1/jobs/1"):
        assert api.simulate_get(path, headers=client_h).headers["X-GpuLayer-Protocol"] == "1"
    assert api.simulate_get("/v1/jobs").headers["X-GpuLayer-Protocol"] == "1"
    assert PROTO == {"X-GpuLayer-Protocol": "1"}


def test_a_log_long_poll_ends_with_the_job(api, deps, client_h, running):
    """The job's last line comes before its finish: a follower waiting after it is answered at the finish."""
    wh, a, job_id = running
    lines = [{"n": 0, "stream": "system", "text": "finished: succeeded", "at": 1.0}]
    api.simulate_post(f"/v1/worker/tasks/{a['task_id']}/logs", headers=wh, json={"lines": lines})
    after = api.simulate_get(f"/v1/jobs/{job_id}/logs", headers=client_h).json["next"]
    answer = {}

    def follow():
        began = time.monotonic()
        answer["page"] = api.simulate_get(f"/v1/jobs/{job_id}/logs", headers=client_h,
                                          params={"after": after, "wait_s": 20}).json
        answer["waited_s"] = time.monotonic() - began
    follower = threading.Thread(target=follow)
    follower.start()
    wait_for(lambda: deps.scheduler.parked_log_polls == 1, 5, "the follower to park on the long-poll")
    api.simulate_post(f"/v1/worker/tasks/{a['task_id']}/finish", headers=wh,
                      json={"exit_code": 0, "outcome": "succeeded"})
    follower.join(10)
    assert not follower.is_alive(), "the parked follower was not answered at the finish"
    assert answer["page"] == {"lines": [], "next": after, "ended": True} and answer["waited_s"] < 5, answer
    began = time.monotonic()
    page = api.simulate_get(f"/v1/jobs/{job_id}/logs", headers=client_h, params={"after": after, "wait_s": 20}).json
    assert page["lines"] == [] and time.monotonic() - began < 1, "an ended job's long-poll answers at once"
