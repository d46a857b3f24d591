"""`gpulayer submit --service` gives up on a service that keeps crashing (issue 36 item 20), against a real
server and workers: it waited for ever (25 restarts in 10 minutes of `exited with code 127`, never
returning); now it stops waiting after `--max-failed-starts` (default 5) failed starts or `--wait-timeout`,
prints the service's last log lines and why, and exits non-zero, while the service keeps its restart
policy."""
from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.timeout(180)


def _cancel(cluster, job_id: int) -> None:
    cluster.request("POST", f"/v1/jobs/{job_id}/cancel", json={})


def test_a_crash_looping_service_is_given_up_on_after_its_failed_starts(cluster):
    began = time.monotonic()
    done = cluster.cli("submit", "--service", "--no-port", "--max-failed-starts", "2", "--",
                       "sh", "-c", "echo booting-crasher; exec no-such-binary-here", timeout=120)
    job_id = int(done.stdout.split()[0])
    try:
        assert done.returncode == 1, done
        assert "failed to start 2 times" in done.stderr and "booting-crasher" in done.stderr, done
        assert f"gpulayer job cancel {job_id}" in done.stderr and time.monotonic() - began < 60, done
        assert cluster.job(job_id)["state"] in ("queued", "running")  # it keeps its restart policy
    finally:
        _cancel(cluster, job_id)


def test_a_service_that_never_comes_up_is_given_up_on_at_its_wait_timeout(cluster):
    done = cluster.cli("submit", "--service", "--health-path", "/never", "--wait-timeout", "3", "--",
                       "sh", "-c", "echo listening-never; sleep 600", timeout=60)
    job_id = int(done.stdout.split()[0])
    try:
        assert done.returncode == 124, done
        assert "listening-never" in done.stderr and "goes on restarting" in done.stderr, done
        assert cluster.job(job_id)["state"] == "running"
    finally:
        _cancel(cluster, job_id)


def test_the_wait_options_go_with_a_service(cluster):
    for flag, value in (("--wait-timeout", "3"), ("--max-failed-starts", "2")):
        done = cluster.cli("submit", flag, value, "--", "true")
        assert done.returncode == 2 and flag in done.stderr and "add --service" in done.stderr, done
