"""GET /v1/usage?by=label:KEY: KEY is a label key, bound as data, never a JSON path (issue 22 item 9).

`by=label:%00` and `label:a\\` answered 500 `bad JSON path` once usage rows existed, for members too.
"""
from __future__ import annotations

from urllib.parse import quote

import pytest

from apihelpers import bearer


@pytest.fixture
def usage_rows(api, worker, client_h):
    """One run of a member's job labelled team=a, ended: the ledger has a row. The member's headers."""
    made = api.simulate_post("/v1/users", headers=client_h, json={"name": "mia"})
    assert made.status_code == 201, made.text
    member_h = bearer(made.json["token"])
    _, wh = worker(labels={"team": "a"})
    job = api.simulate_post("/v1/jobs", headers=member_h, json={"command": ["true"], "labels": {"team": "a"}})
    assert job.status_code == 201, job.text
    task = api.simulate_post("/v1/worker/acquire", headers=wh, json={}).json["task"]
    finished = api.simulate_post(f"/v1/worker/tasks/{task['task_id']}/finish", headers=wh,
                                 json={"exit_code": 0, "outcome": "succeeded", "pid": 4242})
    assert finished.json == {"accepted": True}
    return member_h


@pytest.mark.parametrize("key", ["\x00", "a\\", 'a"', "a\n", "", "$.x", "a b", "-a", "x" * 64])
def test_a_bad_label_key_is_400_for_admins_and_members(api, client_h, usage_rows, key):
    for headers in (client_h, usage_rows):
        r = api.simulate_get("/v1/usage", headers=headers, query_string=f"by={quote('label:' + key)}")
        assert r.status_code == 400, (key, r.text)
        assert r.json["error"]["code"] and "label key" in r.json["error"]["message"]


def test_a_label_key_sums_by_that_labels_value(api, client_h, usage_rows):
    for headers in (client_h, usage_rows):
        r = api.simulate_get("/v1/usage", headers=headers, query_string="by=label:team")
        assert r.status_code == 200, r.text
        assert [(row["key"], row["runs"]) for row in r.json["rows"]] == [("a", 1)]
    r = api.simulate_get("/v1/usage", headers=client_h, query_string="by=label:nosuch")
    assert [(row["key"], row["runs"]) for row in r.json["rows"]] == [(None, 1)]
