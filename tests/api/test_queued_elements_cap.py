"""Issue 22 item 2: a per-user cap on tasks (array elements) not yet ended, `--max-queued-elements`.

Past it a submit is `429 too_many_queued`, naming the cap and the user's count, and writes nothing;
the CLI says so on one `Error:` line with a non-zero exit. Other users are not held back, and
elements that ended (or are being cancelled) no longer count.
"""
from __future__ import annotations

import pytest

from apihelpers import bearer
from gpulayer.server.config import ControlPlaneConfig
from gpulayer.testing import ControlPlaneProcess

CAP = 1_000
NOWHERE = {"labels": {"pool": "nowhere"}}  # its tasks stay queued


@pytest.fixture
def config(home):
    return ControlPlaneConfig(home=home, heartbeat_interval_s=0.5, lease_ttl_s=3.0, max_queued_elements=CAP)


def _submit(api, headers, spec):
    return api.simulate_post("/v1/jobs", headers=headers, json={"command": ["true"], **NOWHERE, **spec})


def _rows(deps) -> dict:
    def read(conn):
        return {t: conn.execute(f"SELECT count(*) AS n FROM {t}").fetchall()[0]["n"]
                for t in ("jobs", "tasks", "events", "task_queue")}
    return deps.store.read(read)


def _user(api, client_h, name):
    answer = api.simulate_post("/v1/users", headers=client_h, json={"name": name})
    assert answer.status_code == 201, answer.text
    return bearer(answer.json["token"])


def test_past_the_cap_a_submit_is_429_and_changes_nothing(api, deps, client_h):
    first = _submit(api, client_h, {"array": "0-599"})
    root = _submit(api, client_h, {})
    assert first.status_code == root.status_code == 201
    waiting = _submit(api, client_h, {"array": "0-398", "after": [root.json["id"]]})  # held elements count too
    assert waiting.status_code == 201  # 600 + 1 + 399: the cap exactly
    before = _rows(deps)
    for spec in ({}, {"array": "0-9"}, {"service": {"replicas": 2}}):
        refused = _submit(api, client_h, spec)
        assert refused.status_code == 429, refused.text
        body = refused.json
        assert body["error"]["code"] == "too_many_queued"
        assert "1,000" in body["error"]["message"] and "--max-queued-elements" in body["error"]["message"]
        assert body["limit"] == CAP and body["queued"] == CAP and body["adding"] >= 1
    assert _rows(deps) == before  # nothing written

    bob = _user(api, client_h, "bob")  # another user's count is its own
    assert _submit(api, bob, {"array": "0-99"}).status_code == 201
    # Elements being cancelled no longer count: cancelling the first array makes room at once.
    assert api.simulate_post(f"/v1/jobs/{first.json['id']}/cancel", headers=client_h, json={}).status_code == 200
    assert _submit(api, client_h, {"array": "0-599"}).status_code == 201
    assert _submit(api, client_h, {}).status_code == 429


def test_a_cap_of_zero_is_no_cap(home):
    config = ControlPlaneConfig(home=home, max_queued_elements=0)
    assert not config.max_queued_elements


def test_the_cli_says_so_and_exits_non_zero(tmp_path):
    with ControlPlaneProcess(tmp_path, args=["--max-queued-elements", "10"]) as plane:
        ok = plane.cli("submit", "--label", "pool=nowhere", "--array", "0-9", "--", "true")
        assert ok.returncode == 0, ok.stderr
        refused = plane.cli("submit", "--label", "pool=nowhere", "--", "true")
        assert refused.returncode != 0
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: ") and "too_many_queued" in lines[0], refused.stderr
        assert "cap of 10" in lines[0] and "has 10 tasks" in lines[0]
        assert "Traceback" not in refused.stderr
        assert plane.sql("SELECT count(*) FROM jobs") == [(1,)]


def test_a_requeue_is_counted_by_the_next_submit(api, deps, client_h):
    """A user's submits under the cap are not each counted again (the count plus what they added since bounds the
    tasks not ended); `job requeue` brings ended tasks back outside any submit, so the next submit counts."""
    first = _submit(api, client_h, {"array": "0-499"})
    assert first.status_code == 201
    assert api.simulate_post(f"/v1/jobs/{first.json['id']}/cancel", headers=client_h, json={}).status_code == 200
    deps.scheduler.cascades.drive([], until_ended=first.json["id"], inline=0)
    assert _submit(api, client_h, {"array": "0-599"}).status_code == 201  # counted: 0 not ended, then 600
    requeued = api.simulate_post(f"/v1/jobs/{first.json['id']}/requeue", headers=client_h, json={})
    assert requeued.status_code == 200, requeued.text  # 1,100 not ended: a requeue does not ask the cap
    refused = _submit(api, client_h, {})
    assert refused.status_code == 429, refused.text
    assert refused.json["queued"] == CAP + 1  # counted again (up to just past the cap), not 600 + 1
