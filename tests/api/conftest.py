"""API tier: the real app over a real state file, through falcon.testing."""
from __future__ import annotations

import json

import falcon.testing
import pytest

from apihelpers import PROTO, bearer  # noqa: F401 - tests import them from here too
from gpulayer.server.http.app import create_app, new_deps


@pytest.fixture
def deps(config, clock):
    d = new_deps(config, clock=clock)
    yield d
    d.store.close()


@pytest.fixture
def api(deps):
    return falcon.testing.TestClient(create_app(deps))


@pytest.fixture
def tokens(home):
    return json.loads((home / "tokens.json").read_text())


@pytest.fixture
def client_h(tokens):
    return bearer(tokens["client_token"])


@pytest.fixture
def worker(api, tokens):
    """Register a worker; returns (worker_id, headers)."""
    def make(name="w1", gpus=0, labels=None, slots=1):
        r = api.simulate_post("/v1/workers/register", headers=bearer(tokens["join_token"]), json={
            "name": name, "labels": labels or {}, "version": "t", "slots": slots,
            "resources": {"cpus": 8, "gpus": gpus, "memory_mb": 1000, "gpu_models": []}})
        assert r.status_code == 200, r.text
        return r.json["worker_id"], bearer(r.json["session_token"])
    return make
