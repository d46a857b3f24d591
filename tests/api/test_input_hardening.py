"""Issue 12 at the API tier: text that is not Unicode, ids past int64, patterns with a newline,
log lines without `n`, and what answers without a token. Each refusal writes nothing."""
from __future__ import annotations

import pytest

from apihelpers import PROTO, bearer
from test_endpoints import assert_error, counts

LONE = '"\\ud800"'  # a JSON string escape that decodes to a lone surrogate: not encodable as UTF-8
HUGE = "99999999999999999999999"  # past SQLite's int64
JOB_SUBS = ("", "/logs", "/events", "/endpoints", "/outputs")


def _running(api, client_h, worker):
    wid, wh = worker()
    job_id = api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["echo"]}).json["id"]
    task = api.simulate_post("/v1/worker/acquire", headers=wh, json={}).json["task"]
    return wh, task["task_id"], job_id


# -- 5: lone surrogates --------------------------------------------------------------

def test_lone_surrogate_in_register_labels_writes_nothing(api, deps, tokens, client_h):
    before = counts(deps)
    r = api.simulate_post("/v1/workers/register", headers=bearer(tokens["join_token"]),
                          body='{"name": "w", "labels": {"a": %s}}' % LONE)
    assert_error(r, 400, "invalid_field")
    assert "labels.a" in r.json["error"]["message"]
    assert counts(deps) == before
    assert api.simulate_get("/v1/workers", headers=client_h).status_code == 200


@pytest.mark.parametrize("body", [
    '{"command": ["x"], "env": {"A": %s}}' % LONE,
    '{"command": [%s]}' % LONE,
    '{"command": ["x"], "name": %s}' % LONE,
    '{"command": ["x"], "labels": {%s: "v"}}' % LONE,  # in a key
    '{"command": ["x"], "env": {"A": "\\udfff\\ud800"}}',  # reversed pair
])
def test_lone_surrogate_in_job_writes_nothing(api, deps, worker, client_h, body):
    wid, wh = worker()
    before = counts(deps)
    assert_error(api.simulate_post("/v1/jobs", headers=client_h, body=body), 400, "invalid_field")
    assert counts(deps) == before
    assert api.simulate_get("/v1/jobs", headers=client_h).status_code == 200
    assert api.simulate_post("/v1/worker/acquire", headers=wh, json={}).json == {"task": None}


def test_valid_pair_and_non_ascii_are_kept(api, client_h):
    r = api.simulate_post("/v1/jobs", headers=client_h,
                          body='{"command": ["x"], "env": {"A": "\\ud83d\\ude00 é 中"}}')
    assert r.status_code == 201, r.text
    assert r.json["spec"]["env"] == {"A": "\U0001F600 é 中"}


@pytest.mark.parametrize("path, body", [
    ("logs", '{"lines": [{"n": 0, "text": %s}]}' % LONE),
    ("finish", '{"outcome": "failed", "reason": %s}' % LONE),
    ("finish", '{"outcome": "failed", "lines": [{"n": 0, "text": %s}]}' % LONE),
    ("rendezvous", '{"address": %s, "port": 80}' % LONE),
])
def test_lone_surrogate_in_worker_calls_writes_nothing(api, deps, client_h, worker, path, body):
    wh, tid, job_id = _running(api, client_h, worker)
    before = counts(deps)
    assert_error(api.simulate_post(f"/v1/worker/tasks/{tid}/{path}", headers=wh, body=body), 400, "invalid_field")
    assert counts(deps) == before
    assert api.simulate_get(f"/v1/jobs/{job_id}/logs", headers=client_h).status_code == 200


def test_lone_surrogate_in_heartbeat_endpoint_and_tokens(api, deps, client_h, worker):
    wh, tid, _ = _running(api, client_h, worker)
    before = counts(deps)
    body = '{"tasks": [{"task_id": %d, "state": "running", "endpoint": %s}]}' % (tid, LONE)
    assert_error(api.simulate_post("/v1/worker/heartbeat", headers=wh, body=body), 400, "invalid_field")
    assert_error(api.simulate_post("/v1/tokens", headers=client_h, body='{"name": %s}' % LONE), 400, "invalid_field")
    assert_error(api.simulate_put("/v1/secrets/S", headers=client_h, body='{"value": %s}' % LONE), 400,
                 "invalid_field")
    assert counts(deps) == before


def test_needs_upgrade_listing_ignores_undecodable_name(api, tokens, client_h):
    headers = {**bearer(tokens["join_token"]), "X-GpuLayer-Protocol": "2"}
    r = api.simulate_post("/v1/workers/register", headers=headers, body='{"name": %s}' % LONE)
    assert r.status_code == 426
    assert api.simulate_get("/v1/workers", headers=client_h, params={"all": "true"}).status_code == 200


# -- 7: ids past int64 ---------------------------------------------------------------

def test_oversized_ids_are_404_never_500(api, client_h, worker):
    wh, tid, job_id = _running(api, client_h, worker)
    for sub in JOB_SUBS:
        assert_error(api.simulate_get(f"/v1/jobs/{HUGE}{sub}", headers=client_h), 404)
    assert_error(api.simulate_post(f"/v1/jobs/{HUGE}/cancel", headers=client_h), 404)
    for action, body in (("start", {}), ("logs", {"lines": []}), ("rendezvous", {"address": "a", "port": 1}),
                         ("finish", {"outcome": "failed"})):
        assert_error(api.simulate_post(f"/v1/worker/tasks/{HUGE}/{action}", headers=wh, json=body), 404)
    # the largest int64 is a well-formed id that names nothing
    assert_error(api.simulate_get(f"/v1/jobs/{(1 << 63) - 1}", headers=client_h), 404)


@pytest.mark.parametrize("param", ["after", "limit", "wait_s"])
def test_oversized_query_numbers_are_400(api, client_h, worker, param):
    wh, tid, job_id = _running(api, client_h, worker)
    for value in (HUGE, "9" * 5000, "1e999", "nan", "-" + HUGE):
        assert_error(api.simulate_get(f"/v1/jobs/{job_id}/logs", headers=client_h, params={param: value}), 400)
    for name in ("limit", "before"):
        assert_error(api.simulate_get("/v1/jobs", headers=client_h, params={name: HUGE}), 400)
    assert_error(api.simulate_get("/v1/provisioners", headers=client_h, params={"limit": HUGE}), 400)


def test_oversized_ids_inside_bodies_are_400(api, client_h, worker):
    wh, tid, _ = _running(api, client_h, worker)
    body = '{"tasks": [{"task_id": %s}]}' % HUGE
    assert_error(api.simulate_post("/v1/worker/heartbeat", headers=wh, body=body), 400, "invalid_field")


# -- 8: a trailing newline is not part of a pattern's match ---------------------------

def test_trailing_newline_is_refused_by_patterns(api, deps, client_h, tokens):
    digest = "sha256:" + "0" * 64
    before = counts(deps)
    r = api.simulate_put(f"/v1/artifacts/{digest}%0A", headers=client_h, body=b"x")
    assert_error(r, 400, "invalid_digest")
    r = api.simulate_post("/v1/workers/register", headers=bearer(tokens["join_token"]),
                          json={"name": "w", "labels": {"gpu\n": "a"}})
    assert_error(r, 400, "invalid_field")
    for spec in ({"command": ["x"], "env": {"A\n": "1"}}, {"command": ["x"], "source": digest + "\n"},
                 {"command": ["x"], "secrets": ["S\n"]}):
        assert_error(api.simulate_post("/v1/jobs", headers=client_h, json=spec), 400, "invalid_field")
    assert_error(api.simulate_put("/v1/secrets/S%0A", headers=client_h, json={"value": "v"}), 400)
    assert counts(deps) == before


def test_no_validating_pattern_tolerates_a_newline():
    from agent.artifacts import cache
    from gpulayer.server.provisioning import config as provisioner
    from gpulayer.server import validators
    from gpulayer.server.scheduler import spec
    for pattern, good in ((validators.DIGEST, "sha256:" + "0" * 64), (validators.LABEL_KEY, "gpu"), (spec.ENV_NAME, "A"),
                          (provisioner._NAME, "p1"), (cache._DIGEST, "sha256:" + "0" * 64)):
        assert pattern.match(good) and not pattern.match(good + "\n"), pattern.pattern


# -- 17: log lines without n -----------------------------------------------------------

def test_log_lines_without_n_are_appended_after_the_last(api, client_h, worker):
    wh, tid, job_id = _running(api, client_h, worker)
    post = lambda lines: api.simulate_post(f"/v1/worker/tasks/{tid}/logs", headers=wh, json={"lines": lines})  # noqa: E731
    assert post([{"stream": "stdout", "text": "a", "at": 1.0}, {"stream": "stderr", "text": "b", "at": 2.0}]).json \
        == {"ok": True, "accepted": 2}
    assert post([{"n": 5, "text": "numbered"}]).json["accepted"] == 1
    assert post([{"text": "c"}]).json["accepted"] == 1
    r = api.simulate_post(f"/v1/worker/tasks/{tid}/finish", headers=wh,
                          json={"outcome": "succeeded", "exit_code": 0, "lines": [{"text": "last"}]})
    assert r.json["accepted"] is True
    lines = api.simulate_get(f"/v1/jobs/{job_id}/logs", headers=client_h).json["lines"]
    assert [(x["stream"], x["text"]) for x in lines] == [("stdout", "a"), ("stderr", "b"), ("stdout", "numbered"),
                                                         ("stdout", "c"), ("stdout", "last")]


# -- health and the OpenAPI document answer without a token ---------------------------

def test_health_and_openapi_need_no_token(api):
    health = api.simulate_get("/v1/health")
    assert health.status_code == 200 and health.json["ok"] is True and health.json["protocol"] == 1
    r = api.simulate_get("/v1/openapi.json", headers=PROTO)
    assert r.status_code == 200 and r.json["openapi"] == "3.1.0"
    assert "security" not in r.json["paths"]["/v1/openapi.json"]["get"]
    assert api.simulate_get("/v1/openapi.json", headers={"Authorization": "Bearer glc_nope"}).status_code == 200


# -- 14: a worker uploads only what its running tasks declare as outputs ---------------

def test_worker_uploads_only_while_it_holds_a_task(api, deps, client_h, worker):
    """Every task has a checkpoint folder (docs/training.md), so a worker holding any task may upload; one
    holding none may not."""
    import hashlib
    data = b"not an output"
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    _, idle = worker("idle")
    assert_error(api.simulate_put(f"/v1/artifacts/{digest}", headers=idle, body=data), 403, "forbidden")
    assert not deps.artifacts.exists(digest)
    wh, tid, job_id = _running(api, client_h, worker)  # its job declares no outputs: a checkpoint's file
    assert api.simulate_put(f"/v1/artifacts/{digest}", headers=wh, body=data).status_code == 201


def test_worker_upload_size_is_capped(api, deps, config, client_h, worker):
    import hashlib
    config.max_output_bytes = 10
    wid, wh = worker()
    api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["x"], "outputs": ["out"]})
    api.simulate_post("/v1/worker/acquire", headers=wh, json={})
    small, big = b"0123456789", b"0123456789A"
    for data, status in ((big, 413), (small, 201)):
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        assert api.simulate_put(f"/v1/artifacts/{digest}", headers=wh, body=data).status_code == status
        chunked = api.simulate_put(f"/v1/artifacts/{digest}", headers={**wh, "Transfer-Encoding": "chunked"},
                                   body=data)
        assert chunked.status_code == status, chunked.text
        assert deps.artifacts.exists(digest) == (status == 201)
    # a client's upload is not a worker's output: the store's own limit applies
    assert api.simulate_put("/v1/artifacts/sha256:" + hashlib.sha256(big).hexdigest(), headers=client_h,
                            body=big).status_code == 201
