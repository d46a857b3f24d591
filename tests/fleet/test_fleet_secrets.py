"""Secrets: reach a job only on a worker whose join token carries their labels; elsewhere the job
waits with a visible reason; the value appears in no log, event, API answer or explorer page."""
from __future__ import annotations

import json
import time

from gpulayer.testing import wait_for

VALUE = "s3cr3t-fleet-Value-9f2c"
# The command checks the value without printing it, and without spelling it whole (its argv is in the spec).
CHECK = (f'test "$FLEET_SECRET" = "$(printf %s {VALUE[:8]})$(printf %s {VALUE[8:]})" '
         '&& echo secret-has-${#FLEET_SECRET}-chars')


def mint(fleet, name: str, labels: dict) -> str:
    answer = fleet.post("/v1/tokens", {"name": name, "labels": labels})
    assert answer.status_code == 201, answer.text
    return answer.json()["token"]


def test_secret_reaches_only_labelled_workers_and_never_shows(fleet):
    out = fleet.cli("secret", "set", "FLEET_SECRET", "--label", "vault=sec", input=VALUE + "\n")
    assert out.returncode == 0, out.stderr
    listed = fleet.cli("secret", "list", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout)[0]["labels"] == {"vault": "sec"}

    spec = {"command": ["sh", "-c", CHECK], "labels": {"role": "secrets"}, "secrets": ["FLEET_SECRET"]}
    without = fleet.start_worker("no-vault", listed_as="no-vault-token",
                                 join_token=mint(fleet, "no-vault-token", {"role": "secrets"}))
    job_id = fleet.submit(spec)
    try:
        reason = wait_for(lambda: fleet.job(job_id).get("waiting_reason"), 5, "a waiting reason")
        assert "FLEET_SECRET" in reason and "vault" in reason, reason
        assert fleet.job(job_id)["state"] == "queued"
        status = fleet.cli("job", "status", str(job_id))
        assert status.returncode == 0 and f"waiting: {reason}" in status.stdout, status.stdout
        # Two heartbeats later it still waits: the worker without the labels never gets it.
        time.sleep(1.0)
        job = fleet.job(job_id)
        assert job["state"] == "queued" and job["tasks"][0]["worker_id"] is None, job
    finally:
        assert without.stop() == 0

    with_vault = fleet.start_worker("vault", listed_as="vault-token",
                                    join_token=mint(fleet, "vault-token", {"role": "secrets", "vault": "sec"}))
    try:
        job = fleet.wait_job(job_id)
        assert job["state"] == "succeeded", (job, with_vault.log())
        assert job["waiting_reason"] is None
    finally:
        assert with_vault.stop() == 0
    lines = fleet.get(f"/v1/jobs/{job_id}/logs").json()["lines"]
    assert any(f"secret-has-{len(VALUE)}-chars" in line["text"] for line in lines), lines

    # Nowhere to be read.
    answers = [fleet.get(path).text for path in
               (f"/v1/jobs/{job_id}", f"/v1/jobs/{job_id}/events", f"/v1/jobs/{job_id}/logs", "/v1/jobs",
                "/v1/secrets", "/v1/workers", "/v1/tokens", "/metrics")]
    answers += [fleet.cli(*args).stdout for args in (("secret", "list"), ("job", "status", str(job_id), "--json"),
                                                     ("job", "events", str(job_id)), ("job", "logs", str(job_id)))]
    answers += [fleet.log(), with_vault.log(), without.log()]
    for path in ("/explorer/", f"/explorer/-/queries/job_timeline?job_id={job_id}", "/explorer/secrets",
                 "/explorer/events", "/explorer/jobs", f"/explorer/-/jobs/{job_id}"):
        page = fleet.get(path)
        assert page.status_code == 200, (path, page.status_code)
        answers.append(page.text)
    refused = fleet.get("/explorer/-/query?sql=select+*+from+secrets")  # the ciphertext column is not readable
    assert refused.status_code == 400
    answers.append(refused.text)
    for text in answers:
        assert VALUE not in text
    rows = fleet.sql("SELECT data FROM events UNION ALL SELECT text FROM logs UNION ALL SELECT spec FROM jobs")
    assert all(VALUE not in (r[0] or "") for r in rows)
    assert VALUE.encode() not in fleet.state.read_bytes()


def test_a_job_whose_secret_was_deleted_waits_until_it_is_set_again(store, sched):
    from gpulayer.server.scheduler import views
    from gpulayer.server.scheduler import secrets
    from gpulayer.server.http import wire
    from gpulayer.server.security.auth import Principal

    store.write(secrets.put, sched.secret_box, "GONE_SOON", "v1", {}, sched.clock())
    job_id = sched.submit({"command": ["env"], "secrets": ["GONE_SOON"]})
    store.write(secrets.delete, "GONE_SOON", sched.clock())
    body = wire.register({"name": "w", "resources": {"cpus": 1}})
    worker = sched.register(body=body, token=Principal(kind="join", jti="server-join"), session_hash="h",
                            peer_address="127.0.0.1")["worker_id"]
    assert sched.acquire(worker) is None
    assert store.read(views.render, job_id)["waiting_reason"] == "secret GONE_SOON is not set"
    store.write(secrets.put, sched.secret_box, "GONE_SOON", "v2", {}, sched.clock())
    task = sched.acquire(worker)
    assert task["job_id"] == job_id and task["env"]["GONE_SOON"] == "v2"
