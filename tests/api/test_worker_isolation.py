"""A worker's `isolation` (issue 24): what its register call says is stored and listed; a bad one is a 400
that writes nothing; an older agent that says nothing is listed with {}."""
from __future__ import annotations

import pytest

from apihelpers import bearer
from test_endpoints import assert_error, counts

RESOURCES = {"cpus": 2, "gpus": 0, "memory_mb": 1024, "gpu_models": []}


def _register(api, tokens, name: str, **extra):
    return api.simulate_post("/v1/workers/register", headers=bearer(tokens["join_token"]),
                             json={"name": name, "resources": RESOURCES, "version": "t", **extra})


def _listed(api, client_h, name: str) -> dict:
    workers = api.simulate_get("/v1/workers", headers=client_h).json["workers"]
    return next(w for w in workers if w["name"] == name)


def test_isolation_is_stored_and_listed(api, tokens, client_h):
    said = {"sandbox": "bwrap", "user": "gpulayer-task", "root_tasks": False,
            "limits": "cgroup limits not enforced: no cgroup v2 hierarchy at /sys/fs/cgroup"}
    assert _register(api, tokens, "boxed", isolation=said).status_code == 200
    assert _listed(api, client_h, "boxed")["isolation"] == said
    assert _register(api, tokens, "older").status_code == 200
    assert _listed(api, client_h, "older")["isolation"] == {}


@pytest.mark.parametrize("isolation, words", [
    ("bwrap", "isolation: must be an object"),
    ({"sandbox": 3}, "isolation.sandbox: must be a string"),
    ({"root_tasks": "yes"}, "isolation.root_tasks: must be true or false"),
    ({"kernel": "x"}, "isolation.kernel: unknown"),
    ({"warning": "x" * 600}, "isolation.warning: must be a string of at most 512"),
])
def test_a_bad_isolation_is_refused_and_writes_nothing(api, deps, tokens, isolation, words):
    before = counts(deps)
    answer = _register(api, tokens, "bad", isolation=isolation)
    assert_error(answer, 400, "invalid_field")
    assert words in answer.json["error"]["message"], answer.json
    assert counts(deps) == before
