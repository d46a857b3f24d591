"""Setting a secret wakes parked acquires: a job waiting for it starts at once, not at the next poll."""
from __future__ import annotations

import threading

from gpulayer.testing import wait_for

POLL_WAIT_S = 30.0   # the worker's long-poll: far longer than the answer may take
PROMPT_S = 5.0


def test_secret_set_wakes_a_parked_acquire(api, deps, client_h, worker, clock):
    put = api.simulate_put("/v1/secrets/X", headers=client_h, json={"value": "v1", "labels": {}})
    assert put.status_code == 200
    job = api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["x"], "secrets": ["X"]})
    assert api.simulate_delete("/v1/secrets/X", headers=client_h).status_code == 200  # the job now waits for X
    _, wh = worker()
    assert api.simulate_post("/v1/worker/acquire", headers=wh, json={}).json["task"] is None

    answer = {}
    acquire = threading.Thread(target=lambda: answer.update(api.simulate_post(
        "/v1/worker/acquire", headers=wh, json={"wait_s": POLL_WAIT_S}).json))
    acquire.start()
    wait_for(lambda: deps.scheduler.parked_acquires == 1, PROMPT_S, "the acquire to park")
    clock.advance(7)
    assert api.simulate_put("/v1/secrets/X", headers=client_h, json={"value": "v2", "labels": {}}).status_code == 200
    acquire.join(PROMPT_S)
    assert not acquire.is_alive(), "the parked acquire was not woken by `secret set`"
    assert answer["task"]["job_id"] == job.json["id"] and answer["task"]["env"] == {"X": "v2"}
    # The change is stamped by the injected clock, not the wall clock.
    stamped = deps.store.read(lambda c: c.execute(
        "SELECT at FROM events WHERE kind = 'secret_set' ORDER BY seq DESC LIMIT 1").fetchall()[0]["at"])
    assert stamped == clock()
