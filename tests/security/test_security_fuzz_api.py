"""Schemathesis against /v1/openapi.json with each kind of token: no 5xx, answers match the schema.

The control plane runs in this process (ControlPlane: the real app behind
cheroot on 127.0.0.1), the document is fetched with a client token, and every
operation is fuzzed with positive and negative cases (schemathesis decides
what "negative" means: wrong types, missing fields, out-of-range values) as:
no token, the join token, a worker session token, the client token, a revoked
and an expired token. Bounded by EXAMPLES cases per operation, mode and token.
"""
from __future__ import annotations

import json
import time

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import (content_type_conformance, not_a_server_error, response_schema_conformance,
                                 status_code_conformance)

from gpulayer.server.security.auth import init_home
from gpulayer.server.config import ControlPlaneConfig
from gpulayer.server.process import ControlPlane

pytestmark = pytest.mark.timeout(240)

EXAMPLES = {"client": 30, "worker": 20, "join": 10, "none": 3, "revoked": 3, "expired": 3}
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
TRIED: dict[str, int] = {}


class _Clock:
    """Wall time that the test can move forward (to expire a token)."""

    def __init__(self):
        self.offset = 0.0

    def __call__(self):
        return time.time() + self.offset


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    home = tmp_path_factory.mktemp("fuzz") / "home"
    tokens = init_home(home)
    clock = _Clock()
    cp = ControlPlane(ControlPlaneConfig(home=home, port=0, heartbeat_interval_s=0.5, lease_ttl_s=30.0,
                                         max_parked_acquires=2), clock=clock)
    cp.start()
    http = requests.Session()
    http.trust_env = False
    client = {"Authorization": f"Bearer {tokens['client_token']}"}
    doc = http.get(f"{cp.url}/v1/openapi.json", headers=client, timeout=10).json()
    revoked = http.post(f"{cp.url}/v1/tokens", json={"name": "revoked"}, headers=client, timeout=10).json()
    http.post(f"{cp.url}/v1/tokens/{revoked['jti']}/revoke", headers=client, timeout=10).raise_for_status()
    expiring = http.post(f"{cp.url}/v1/tokens", json={"name": "soon", "expires_in_s": 5}, headers=client,
                         timeout=10).json()
    clock.offset = 3600.0            # the expiring token is now an hour past its end
    # One schema for the file's 414 tests: reading the document is ~0.2 s, an operation's lookup ~3 ms.
    yield {"cp": cp, "url": cp.url, "doc": doc, "schema": schemathesis.openapi.from_dict(doc), "http": http,
           "tokens": tokens,
           "revoked": revoked["token"], "expired": expiring["token"]}
    cp.stop()
    by_token: dict[str, int] = {}
    for label, n in TRIED.items():
        by_token[label.rsplit(" as ", 1)[1]] = by_token.get(label.rsplit(" as ", 1)[1], 0) + n
    print(f"\nfuzz: {sum(TRIED.values())} cases over {len({l.rsplit(' as ', 1)[0] for l in TRIED})} operations; "
          f"by token: {json.dumps(by_token, sort_keys=True)}")


def _token(plane, kind: str) -> str | None:
    """A fresh token of `kind` (a new worker per operation, as deregister ends a session)."""
    if kind == "worker":
        r = plane["http"].post(f"{plane['url']}/v1/workers/register", timeout=10, json={
            "name": "fuzz", "version": "t", "resources": {"cpus": 1, "gpus": 0, "memory_mb": 10, "gpu_models": []}},
            headers={"Authorization": f"Bearer {plane['tokens']['join_token']}", "X-GpuLayer-Protocol": "1"})
        return r.json()["session_token"]
    return {"client": plane["tokens"]["client_token"], "join": plane["tokens"]["join_token"], "none": None,
            "revoked": plane["revoked"], "expired": plane["expired"]}[kind]


def _bounded(case) -> None:
    """Long-polls (acquire wait_s, logs wait_s) cut to a fraction of a second so the fuzz stays quick."""
    if isinstance(case.body, dict) and isinstance(case.body.get("wait_s"), (int, float)) \
            and not isinstance(case.body.get("wait_s"), bool) and case.body["wait_s"] > 0.1:
        case.body["wait_s"] = 0.1
    if isinstance(case.query, dict) and "wait_s" in case.query:
        case.query["wait_s"] = "0.1"


def _operations():
    # collected before the server starts: the document is the route table's (gpulayer.server.http.openapi)
    from gpulayer.server.http.app import ROUTES
    from gpulayer.server.http.openapi import document
    doc = document(ROUTES)
    return [(path, method) for path, ops in doc["paths"].items() for method in ops]


@pytest.mark.parametrize("kind", list(EXAMPLES))
@pytest.mark.parametrize("path, method", _operations())
def test_fuzz(plane, path, method, kind):
    operation = plane["schema"][path][method.upper()]
    token = _token(plane, kind)
    headers = {"X-GpuLayer-Protocol": "1"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    strategy = operation.as_strategy(GenerationMode.POSITIVE) | operation.as_strategy(GenerationMode.NEGATIVE)
    label = f"{method.upper()} {path} as {kind}"
    session = requests.Session()
    session.trust_env = False

    @settings(max_examples=EXAMPLES[kind], deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def run(case):
        _bounded(case)
        TRIED[label] = TRIED.get(label, 0) + 1
        response = case.call(base_url=plane["url"], session=session, headers=headers, timeout=15)
        assert response.status_code < 500, (label, case.body, response.status_code, response.text[:500])
        case.validate_response(response, checks=CHECKS)

    run()
