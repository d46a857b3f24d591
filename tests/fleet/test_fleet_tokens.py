"""Minted join tokens: labels bind, foreign labels are refused, revocation cuts a worker off mid-task,
and `server rotate-join-token` retires the old join token."""
from __future__ import annotations

import hashlib
import json
import time

from gpulayer.testing import wait_for


def mint(fleet, name: str, labels: dict) -> dict:
    out = fleet.cli("token", "create", "--name", name, *[f"--label={k}={v}" for k, v in labels.items()],
                    "--expires", "1h", "--json")
    assert out.returncode == 0, out.stderr
    token = json.loads(out.stdout)
    assert token["token"].startswith("glj_") and token["name"] == name and token["labels"] == labels
    return token


def test_token_labels_bind_the_worker_and_foreign_labels_are_refused(fleet):
    token = mint(fleet, "pool-a", {"pool": "a100", "site": "x"})
    # The worker carries the token's name and exactly its labels, whatever it asked for.
    proc = fleet.start_worker("asks-subset", listed_as="pool-a", join_token=token["token"], labels={"pool": "a100"})
    try:
        assert fleet.online_worker("pool-a")["labels"] == {"pool": "a100", "site": "x"}
    finally:
        assert proc.stop() == 0, proc.log()

    refused = fleet.register(token["token"], labels={"pool": "h100"})
    assert refused.status_code == 403
    error = refused.json()["error"]
    assert error["code"] == "label_not_allowed" and "pool=h100" in error["message"]

    proc = fleet.spawn_worker("asks-other", join_token=token["token"], labels={"gpu": "h100"})
    code = proc.wait(20)
    assert code != 0
    assert "label" in proc.log() and "gpu=h100" in proc.log(), proc.log()

    listed = fleet.cli("token", "list", "--json")
    assert listed.returncode == 0 and token["token"] not in listed.stdout
    assert any(t["jti"] == token["jti"] for t in json.loads(listed.stdout))


def _upload(fleet, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    answer = __import__("requests").put(f"{fleet.url}/v1/artifacts/{digest}", data=data, timeout=10,
                                        headers={"Authorization": f"Bearer {fleet.client_token}"})
    assert answer.status_code in (200, 201), answer.text
    return digest


def _leases_expired(fleet) -> float:
    from prometheus_client.parser import text_string_to_metric_families
    text = fleet.get("/metrics").text
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == "gpulayer_leases_expired_total")


def test_revoke_mid_task_requeues_and_cuts_the_worker_off(fleet):
    token = mint(fleet, "revokable", {"pool": "rev"})
    retry = {"max_attempts": 2, "retry_on": ["worker_revoked"]}
    digest = _upload(fleet, b"input of the revoked task " + str(time.time()).encode())
    # One task runs in a real agent, one is held by a hand-driven session (to test its artifact GET).
    held = fleet.submit({"command": ["sleep", "30"], "labels": {"pool": "rev"}, "retry": retry,
                         "inputs": {"in.txt": digest}, "name": "held-by-hand"})
    raw = fleet.register(token["token"], name="by-hand", labels={"pool": "rev"})
    assert raw.status_code == 200, raw.text
    session = raw.json()["session_token"]
    task = fleet.worker_call(session, "/v1/worker/acquire", {"wait_s": 5}).json()["task"]
    assert task["job_id"] == held
    assert fleet.worker_call(session, f"/v1/worker/tasks/{task['task_id']}/start", {}).status_code == 200
    assert fleet.get(f"/v1/artifacts/{digest}", token=session).status_code == 200

    running = fleet.submit({"command": ["sleep", "30"], "labels": {"pool": "rev"}, "retry": retry,
                            "name": "runs-in-agent"})
    proc = fleet.start_worker("rev-agent", listed_as="revokable", join_token=token["token"])
    wait_for(lambda: fleet.job(running)["tasks"][0]["state"] == "running", 15, "the task to run")

    expired_before = _leases_expired(fleet)
    out = fleet.cli("token", "revoke", token["jti"])
    assert out.returncode == 0, out.stderr

    # The hand-driven session: heartbeat says revoked; everything else is 401 at once.
    beat = fleet.worker_call(session, "/v1/worker/heartbeat", {"tasks": []})
    assert beat.status_code == 200 and beat.json()["revoked"] is True
    assert fleet.worker_call(session, "/v1/worker/acquire", {}).status_code == 401
    assert fleet.get(f"/v1/artifacts/{digest}", token=session).status_code == 401

    # The agent exits with a message; both jobs are requeued for a second attempt.
    code = proc.wait(15)
    assert code == 3, proc.log()
    assert "revoked" in proc.log()
    for job_id in (held, running):
        job = fleet.job(job_id)
        assert job["state"] == "queued" and job["attempt"] == 2, job
        first = [t for t in job["tasks"] if t["attempt"] == 1][0]
        assert first["state"] == "lost" and first["reason"] == "worker_revoked", first
    # Tasks lost to a revocation are not leases that expired.
    assert _leases_expired(fleet) == expired_before
    # A revoked join token cannot register again.
    assert fleet.register(token["token"], labels={"pool": "rev"}).status_code == 401
    for job_id in (held, running):
        fleet.post(f"/v1/jobs/{job_id}/cancel")


def test_rotate_join_token(own_fleet):
    old = own_fleet.join_token
    joined = own_fleet.register(old, name="before")
    assert joined.status_code == 200
    out = own_fleet.cli("server", "rotate-join-token", "--home", str(own_fleet.home))
    assert out.returncode == 0, out.stderr
    new = out.stdout.strip()
    assert new.startswith("glj_") and new != old
    began = time.monotonic()
    wait_for(lambda: own_fleet.register(old, name="old").status_code == 401, 3, "the old join token to fail")
    assert time.monotonic() - began < 2.0
    answer = own_fleet.register(new, name="after")
    assert answer.status_code == 200, answer.text
    # A worker that joined with the old token keeps its session.
    beat = own_fleet.worker_call(joined.json()["session_token"], "/v1/worker/heartbeat", {"tasks": []})
    assert beat.status_code == 200 and beat.json()["revoked"] is False
