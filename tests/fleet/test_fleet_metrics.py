"""/metrics: parses with prometheus-client, matches SQL over the state file; the metrics token reads
/metrics and nothing else."""
from __future__ import annotations

import json

from prometheus_client.parser import text_string_to_metric_families

from gpulayer.testing import wait_for


def scrape(fleet, token=None) -> dict:
    answer = fleet.get("/metrics", token=token)
    assert answer.status_code == 200, answer.text
    families = {f.name: f for f in text_string_to_metric_families(answer.text)}
    assert all(name.startswith("gpulayer_") for name in families)
    return families


def by_label(family, label: str) -> dict:
    return {s.labels[label]: s.value for s in family.samples if label in s.labels}


def test_metrics_match_the_state_file(fleet):
    proc = fleet.start_worker("metrics-w", labels={"role": "metrics"}, parallel=2)
    done = [fleet.submit({"command": ["true"], "labels": {"role": "metrics"}}) for _ in range(2)]
    failed = fleet.submit({"command": ["false"], "labels": {"role": "metrics"}})
    waiting = fleet.submit({"command": ["true"], "labels": {"role": "nobody"}})
    for job_id in [*done, failed]:
        fleet.wait_job(job_id)
    assert proc.stop() == 0
    try:
        families = scrape(fleet)
        jobs = by_label(families["gpulayer_jobs"], "state")
        assert jobs == {s: float(n) for s, n in fleet.sql("SELECT state, count(*) FROM jobs GROUP BY state")}
        assert jobs["succeeded"] >= 2 and jobs["failed"] >= 1 and jobs["queued"] >= 1
        workers = by_label(families["gpulayer_workers"], "state")
        assert workers == {s: float(n) for s, n in fleet.sql("SELECT state, count(*) FROM workers GROUP BY state")}
        queue = by_label(families["gpulayer_queue_depth"], "labels")
        expected = {}
        for labels, n in fleet.sql("SELECT j.labels, count(*) FROM tasks t JOIN jobs j ON j.id = t.job_id "
                                   "WHERE t.state = 'queued' GROUP BY j.labels"):
            key = ",".join(f"{k}={v}" for k, v in sorted(json.loads(labels).items()))
            expected[key] = expected.get(key, 0) + float(n)
        assert queue == expected and queue["role=nobody"] >= 1
        (n, size), = fleet.sql("SELECT count(*), coalesce(sum(size), 0) FROM artifacts")
        assert families["gpulayer_artifacts"].samples[0].value == n
        assert families["gpulayer_artifact_store_bytes"].samples[0].value == size
        expired = families["gpulayer_leases_expired"].samples[0]
        assert expired.name == "gpulayer_leases_expired_total"
        assert expired.value == fleet.sql("SELECT count(*) FROM events WHERE kind = 'task_lost' "
                                          "AND json_extract(data, '$.lease_expired')")[0][0]
        assert "gpulayer_request_seconds" in families and "gpulayer_acquire_seconds" in families
        acquires = [s for s in families["gpulayer_acquire_seconds"].samples if s.name.endswith("_count")]
        assert acquires and acquires[0].value >= 3
        def upkeep_runs() -> dict:  # upkeep ticks on its own thread: its first round may still be under way
            family = scrape(fleet).get("gpulayer_upkeep_runs")
            return {s.labels["job"]: s.value for s in family.samples if s.name == "gpulayer_upkeep_runs_total"} if family else {}
        wait_for(lambda: all(upkeep_runs().get(job, 0) >= 1 for job in ("expire", "begin_due", "fairshare")), 30,
                 "a round of upkeep in /metrics", details=lambda: str(upkeep_runs()))
        families = scrape(fleet)
        assert by_label(families["gpulayer_upkeep_failures"], "job")["expire"] == 0
        assert "expire" in by_label(families["gpulayer_upkeep_last_duration_seconds"], "job")
    finally:
        fleet.post(f"/v1/jobs/{waiting}/cancel")


def test_metrics_token_reads_metrics_only(fleet):
    answer = fleet.post("/v1/tokens", {"kind": "metrics", "name": "prometheus"})
    assert answer.status_code == 201, answer.text
    token = answer.json()["token"]
    assert token.startswith("glm_")
    scrape(fleet, token)
    assert fleet.get("/v1/jobs", token=token).status_code == 403
    assert fleet.get("/v1/workers", token=token).status_code == 403
    assert fleet.post("/v1/jobs", {"command": ["true"]}, token=token).status_code == 403
    assert fleet.register(token).status_code == 403
    explorer = fleet.get("/explorer/", token=token, allow_redirects=False)
    assert explorer.status_code in (302, 303, 401, 403), explorer.status_code
    assert "prometheus" not in explorer.text or explorer.status_code != 200


def test_an_expired_lease_counts(fleet):
    before = _expired(fleet)
    proc = fleet.start_worker("killed", labels={"role": "killed"})
    job_id = fleet.submit({"command": ["sleep", "6"], "labels": {"role": "killed"}})
    wait_for(lambda: fleet.job(job_id)["tasks"][0]["state"] == "running", 10, "the task to run")
    proc.kill()  # no deregister: only the lease can tell
    job = fleet.wait_job(job_id, states=("lost",), timeout=10)
    assert job["tasks"][0]["reason"] == "worker_lost"
    assert _expired(fleet) == before + 1


def _expired(fleet) -> float:
    return next(s.value for s in scrape(fleet)["gpulayer_leases_expired"].samples)
