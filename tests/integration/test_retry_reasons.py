"""Every reason `retry.retry_on` names runs the job again, end to end (issue 36 item 18).

A real server and real workers: `gpulayer submit --retry 3 --retry-on failed -- sh -c 'exit 1'` runs three
attempts (it ran one: the finish stored the agent's words, "exit code 1", where the retry policy looked
for `failed`); `--timeout 2 --retry-on timed_out` the same; over plain HTTP, and an array's elements, each
retried alone; a worker SIGKILLed mid-task (`worker_lost`) and one whose join token is revoked
(`worker_revoked`); the seed's default (`worker_lost` only) still ends a failing job after its first
attempt. `start_timeout` (a gang rank whose rendezvous timed out) is judged by the control plane from
the rendezvous it holds: tests/unit/test_retry_judged.py, since the agent's rendezvous timeout (300 s)
is not a setting a test can shorten.
"""
from __future__ import annotations

import pytest

from gpulayer.testing import wait_for

pytestmark = pytest.mark.timeout(240)

FINAL = ("succeeded", "failed", "cancelled", "lost")


def _ended(cluster, job_id: int, timeout: float = 90) -> dict:
    return wait_for(lambda: (j := cluster.job(job_id))["state"] in FINAL and j, timeout, f"job {job_id} to end",
                    details=lambda: cluster.logs())


def _kinds(cluster, job_id: int) -> list[str]:
    return [e["kind"] for e in cluster.events(job_id)]


def _submitted_id(out: str) -> int:
    return int(out.split()[-1])  # `submit` prints the job's id alone


def test_submit_retry_on_failed_runs_three_attempts(cluster):
    done = cluster.cli("submit", "--retry", "3", "--retry-on", "failed", "--", "sh", "-c", "exit 1")
    assert done.returncode == 0, done
    job = _ended(cluster, _submitted_id(done.stdout.strip()))
    assert job["state"] == "failed" and job["attempt"] == 3, job
    assert _kinds(cluster, job["id"]).count("job_retried") == 2
    assert job["exit_code"] == 1 and "exit code 1" in (job["reason"] or ""), job  # the agent's words kept


def test_submit_retry_on_timed_out_runs_three_attempts(cluster):
    done = cluster.cli("submit", "--timeout", "2", "--retry", "3", "--retry-on", "timed_out", "--", "sleep", "10")
    assert done.returncode == 0, done
    job = _ended(cluster, _submitted_id(done.stdout.strip()))
    assert job["state"] == "failed" and job["attempt"] == 3, job
    assert _kinds(cluster, job["id"]).count("job_retried") == 2


def test_http_retry_on_failed_and_an_array_retry_each_element(cluster):
    plain = cluster.submit({"command": ["sh", "-c", "exit 1"], "retry": {"max_attempts": 3, "retry_on": ["failed"]}})
    array = cluster.submit({"command": ["sh", "-c", 'test "$GPULAYER_ARRAY_INDEX" = 0'], "array": "0-1",
                            "retry": {"max_attempts": 3, "retry_on": ["failed"]}})
    assert _ended(cluster, plain)["attempt"] == 3
    job = _ended(cluster, array)
    assert job["state"] == "failed", job
    assert _kinds(cluster, array).count("element_retried") == 2  # element 1 alone, twice; element 0 succeeded


def test_the_default_retries_only_a_lost_worker(cluster):
    job = _ended(cluster, cluster.submit({"command": ["sh", "-c", "exit 1"], "retry": {"max_attempts": 3}}))
    assert job["state"] == "failed" and job["attempt"] == 1, job


def _running(cluster, spec: dict) -> int:
    job_id = cluster.submit(spec)
    wait_for(lambda: cluster.job(job_id)["state"] == "running", 60, "the job to run", details=lambda: cluster.logs())
    return job_id


def test_worker_lost_retries_by_default(cluster):
    doomed = cluster.start_worker("lost-1", labels={"pool": "lost"})
    job_id = _running(cluster, {"command": ["sleep", "600"], "labels": {"pool": "lost"}, "retry": {"max_attempts": 2}})
    doomed.kill()
    cluster.workers.pop("lost-1")  # SIGKILLed on purpose: not an unclean stop for the fixture
    wait_for(lambda: cluster.job(job_id)["attempt"] == 2, 60, "attempt 2", details=lambda: cluster.logs())
    assert "job_retried" in _kinds(cluster, job_id) and cluster.job(job_id)["state"] == "queued"
    cluster.request("POST", f"/v1/jobs/{job_id}/cancel", json={})


def test_worker_revoked_retries_when_named(cluster):
    minted = cluster.request("POST", "/v1/tokens", json={"name": "rev-1", "labels": {"pool": "revoked"}}).json()
    worker = cluster.start_worker("rev-1", join_token=minted["token"], listed_as="rev-1")
    job_id = _running(cluster, {"command": ["sleep", "600"], "labels": {"pool": "revoked"},
                                "retry": {"max_attempts": 2, "retry_on": ["worker_revoked"]}})
    assert cluster.request("POST", f"/v1/tokens/{minted['jti']}/revoke", json={}).status_code == 200
    wait_for(lambda: cluster.job(job_id)["attempt"] == 2, 30, "attempt 2", details=lambda: cluster.logs())
    assert cluster.job(job_id)["state"] == "queued"
    cluster.request("POST", f"/v1/jobs/{job_id}/cancel", json={})
    wait_for(lambda: not worker.running, 30, "the revoked worker to exit")
    cluster.workers.pop("rev-1")  # it exits 3 (revoked), as it should


REQUEUE = r"""
import os, signal, sys, time
state = os.path.join(os.environ["GPULAYER_CHECKPOINT_DIR"], "state")
if os.path.exists(state):
    print("resumed from", open(state).read(), flush=True)
    sys.exit(0)
def save(*_):
    open(state, "w").write("step 7")
    print("saved", flush=True)
signal.signal(signal.SIGUSR1, save)
time.sleep(60)
"""


def test_the_checkpoint_and_requeue_workflow_of_docs_training_starts_attempt_two(cluster):
    """docs/training.md: `--time ... --signal USR1@... --retry N --retry-on timed_out`: warned, saved,
    stopped at the limit, and resumed from the checkpoint by attempt 2."""
    done = cluster.cli("submit", "--time", "0:04", "--signal", "USR1@2", "--retry", "2", "--retry-on", "timed_out",
                       "--", "python3", "-c", REQUEUE)
    assert done.returncode == 0, done
    job = _ended(cluster, _submitted_id(done.stdout.strip()))
    text = cluster.log_text(job["id"])
    assert job["state"] == "succeeded" and job["attempt"] == 2, (job, text)
    assert "saved" in text and "resumed from step 7" in text, text
