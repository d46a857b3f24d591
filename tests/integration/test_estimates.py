"""Start-time estimates and what-if (issue 38 points 2, 3) with a real server process and a real worker process
of 8 faked GPUs (`worker start --gpus 8`): a waiting job's estimate shows in `job status` and `job list --start`
and it starts near it; `submit --test-only` answers without submitting, and says why a spec could never run."""

from __future__ import annotations

import re

import pytest

from gpulayer.testing import wait_for
from integration_cluster import Cluster

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("estimates"))
    c.args = ["--estimate-interval", "1"]
    c.start_server()
    try:
        c.start_worker("gpu-01", gpus=8, parallel=4)
        yield c
    finally:
        c.close()


def cli_ok(c: Cluster, *args: str) -> str:
    result = c.cli(*args)
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result.stdout


def submitted(c: Cluster, *args: str) -> int:
    return int(cli_ok(c, "submit", *args).split()[0])


def test_a_waiting_job_is_told_when_it_starts_and_starts_near_it(cluster):
    first = submitted(cluster, "--gpus", "8", "--time", "0:12", "--", "sleep", "10")
    wait_for(lambda: cluster.job(first)["state"] == "running" and cluster.job(first)["tasks"][0]["started_at"],
             60, "the first job to run")
    started = cluster.job(first)["tasks"][0]["started_at"]
    waiting = submitted(cluster, "--gpus", "8", "--time", "0:05", "--", "true")
    found = wait_for(lambda: cluster.job(waiting)["estimated_start_at"], 30, "an estimate of the waiting job")
    assert abs(found - (started + 12)) < 2, (found, started)  # the first job's time limit

    status = cli_ok(cluster, "job", "status", str(waiting))
    assert re.search(r"^starts about (\d\d:\d\d, in \d+ min|now)$", status, re.MULTILINE), status
    listed = cli_ok(cluster, "job", "list", "--start").splitlines()
    assert listed[0].split()[:5] == ["ID", "STATE", "NAME", "PRIO", "START"]
    row = next(line for line in listed if line.split()[0] == str(waiting))
    assert "N/A" not in row and "queued" in row

    would = cluster.cli("submit", "--gpus", "4", "--test-only", "--", "true")
    assert would.returncode == 0 and re.fullmatch(r"would start (about \d\d:\d\d \(in \d+ min\)|now) on gpu-01\n",
                                                  would.stdout), would
    never = cluster.cli("submit", "--gpus", "16", "--test-only", "--", "true")
    assert never.returncode == 1 and never.stdout == ""
    assert never.stderr.startswith("Error: no worker could ever run it: no online worker has"), never.stderr
    assert [j["id"] for j in cluster.api("/jobs")["jobs"]] == [waiting, first]  # --test-only submitted nothing

    ran = wait_for(lambda: cluster.job(waiting)["tasks"][0]["started_at"], 60, "the waiting job to start")
    # it started when the first job ended (about 10 s after its start), the estimate said its limit (12 s)
    assert abs(ran - found) < 5, (ran, found)
    assert cluster.job(waiting)["estimated_start_at"] is None
