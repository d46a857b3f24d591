"""EASY backfill end to end (issue 38): a real control plane and two fake-GPU workers (`worker start --gpus 8`). A
16-GPU gang waits behind a long task; a stream of 4-GPU jobs that would outlast its reservation does not take the
room it needs, a short job is backfilled in front of it, and the reservation survives a restart of the plane."""
from __future__ import annotations

import time

import pytest

from gpulayer.testing import ControlPlaneProcess, wait_for


@pytest.fixture
def plane(tmp_path):
    with ControlPlaneProcess(tmp_path, heartbeat_interval=0.5, lease_ttl=5) as plane:
        for name in ("gpu-01", "gpu-02"):
            plane.start_worker(name, gpus=8, parallel=8)
        yield plane


def _sleep(seconds: float, limit: float, gpus: int = 4, **spec) -> dict:
    return {"command": ["sleep", str(seconds)], "gpus": gpus, "timeout_seconds": limit, **spec}


def _started(plane, job_id: int) -> float | None:
    starts = [t["started_at"] for t in plane.job(job_id)["tasks"] if t.get("started_at")]
    return min(starts) if starts else None


def test_a_gang_is_protected_from_small_jobs_and_a_short_one_backfills(plane):
    blocker = plane.submit(_sleep(25, 120, gpus=8))          # one worker, busy for 25 s (limit 120)
    plane.wait_task_running(blocker)
    pair = [plane.submit(_sleep(2, 6)) for _ in range(2)]    # the other, busy for 2 s
    for j in pair:
        plane.wait_task_running(j)
    gang = plane.submit({"command": ["sleep", "1"], "gpus": 8, "nodes": 2, "timeout_seconds": 30})
    held = wait_for(lambda: plane.job(gang)["reservation"], 15, "the gang's reservation")
    assert sorted(held["workers"]) == ["gpu-01", "gpu-02"]
    status = plane.cli("job", "status", str(gang))
    assert status.returncode == 0 and "reserved: gpu-01, gpu-02 from " in status.stdout, status.stdout

    stream = [plane.submit(_sleep(2, 600)) for _ in range(4)]  # each would still run at the gang's start
    for j in pair:
        plane.wait_job(j, timeout=30)
    short = plane.submit(_sleep(1, 10))                      # ends long before the reservation's start
    plane.wait_job(short, timeout=30)
    assert all(_started(plane, j) is None for j in stream), [plane.job(j)["state"] for j in stream]

    plane.restart()                                          # the reservation is planned again from the file
    assert wait_for(lambda: plane.job(gang)["reservation"], 15, "the reservation after a restart")["workers"] == held["workers"]
    for j in stream:
        assert plane.job(j)["state"] == "queued"

    plane.wait_job(gang, timeout=90)
    gang_start = _started(plane, gang)
    assert gang_start is not None and _started(plane, short) < gang_start
    assert plane.wait_job(gang)["state"] == "succeeded"
    for j in stream:
        plane.wait_job(j, timeout=60)
        assert _started(plane, j) >= gang_start                # none of the stream went before the gang
    assert plane.job(gang)["reservation"] is None


def test_backfill_off_is_greedy(tmp_path):
    with ControlPlaneProcess(tmp_path, heartbeat_interval=0.5, lease_ttl=5, args=["--backfill", "off"]) as plane:
        plane.start_worker("gpu-01", gpus=8, parallel=8)
        blocker = plane.submit(_sleep(20, 120))
        plane.wait_task_running(blocker)
        big = plane.submit(_sleep(1, 30, gpus=8))
        time.sleep(2)                                        # a few ticks: no reservation is planned
        assert plane.job(big)["reservation"] is None
        long = plane.submit(_sleep(1, 600))
        plane.wait_job(long, timeout=30)                     # greedy: it takes the free GPUs at once
        assert _started(plane, big) is None
        plane.cli("job", "cancel", str(blocker), str(big))
