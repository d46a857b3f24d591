"""A /v1 read past `--read-timeout` answers 503 read_timeout in the error shape; the next request is served."""
from __future__ import annotations

import time


def test_a_request_whose_read_runs_past_the_deadline_answers_503_read_timeout(api, deps, client_h):
    for _ in range(3):
        assert api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["true"], "array": "0-99"}).status_code == 201
    assert len(api.simulate_get("/v1/jobs", headers=client_h).json["jobs"]) == 3
    # Every read's deadline is past at its first check (every 1000 steps of SQLite's VM): a page of jobs is stopped.
    deps.store.read_timeout_s = 0.0
    started = time.monotonic()
    answer = api.simulate_get("/v1/jobs", headers=client_h)
    assert answer.status_code == 503, answer.text
    assert answer.json["error"]["code"] == "read_timeout"
    assert "--read-timeout" in answer.json["error"]["message"]
    assert time.monotonic() - started < 5
    deps.store.read_timeout_s = 10.0
    assert len(api.simulate_get("/v1/jobs", headers=client_h).json["jobs"]) == 3
