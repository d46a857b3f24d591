"""Idle GPUs taken back, end to end (issue 40, point 2): a real control plane and a real worker process whose
GPUs are the fake pynvml of tests/agent/fake_nvml (GPU 0 at 0%, GPU 1 at 6%), so the samples come through the
agent's telemetry and the real heartbeat path into gpu_samples; the policy is given through the CLI (submit,
project set). The task on the idle GPU is requeued as a preemption victim (reason idle, same attempt), the one
at 6% is never touched, and bad policies are refused with an Error line, changing nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import gpulayer
from gpulayer.testing import wait_for

from integration_cluster import Cluster

FAKE_DIR = Path(__file__).resolve().parents[1] / "agent" / "fake_nvml"
SOURCE_ROOT = Path(gpulayer.__file__).resolve().parents[1]
HOLD = ["--", "sh", "-c", "sleep 120"]


def gpu(n: int, utilization: int) -> dict:
    return {"name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{n}", "mig_supported": True, "mig": None,
            "ecc_uncorrected": 0, "remap_failed": False, "utilization": utilization, "memory_used_mb": 10,
            "memory_total_mb": 81559}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("idle-gpus")
    c = Cluster(root)
    c.args = ["--idle-check-interval", "0.5", "--preempt-grace", "2"]
    c.start_server()
    path = root / "nvml.json"
    path.write_text(json.dumps({"gpus": [gpu(0, 0), gpu(1, 6)], "xids": []}))
    try:
        c.start_worker("g", gpus=None, parallel=2, env={"PYTHONPATH": f"{FAKE_DIR}:{SOURCE_ROOT}",
                                                         "FAKE_NVML_STATE": str(path)})
        yield c
    finally:
        c.close()


def submitted(c: Cluster, *args: str) -> int:
    rc, out, err = c.cli("submit", "--gpus", "1", *args, *HOLD)
    assert rc == 0, err
    return int(out.split()[0])


def test_the_idle_gpus_task_is_requeued_and_the_busy_one_never_touched(cluster):
    policy = ("--idle-timeout", "3s", "--idle-below", "5%", "--idle-action", "requeue")
    jobs = [submitted(cluster, *policy), submitted(cluster, *policy)]

    def gpu_of(job_id):
        found = cluster.sql("SELECT gpu_indices FROM tasks WHERE job_id = ? AND state = 'running'", (job_id,))
        return json.loads(found[0][0])[0] if found else None

    wait_for(lambda: all(gpu_of(j) is not None for j in jobs), 60, "both tasks running", details=cluster.logs)
    idle_job, busy_job = sorted(jobs, key=gpu_of)   # GPU 0 is idle (0%), GPU 1 busy at 6%

    def preempted():
        return cluster.sql("SELECT data FROM events WHERE job_id = ? AND kind = 'task_preempted'", (idle_job,))

    (event,) = wait_for(preempted, 60, "the idle task requeued", details=cluster.logs)[:1]
    assert json.loads(event[0])["reason"] == "idle"
    (idle,) = [json.loads(r[0]) for r in cluster.sql(
        "SELECT data FROM events WHERE job_id = ? AND kind = 'task_idle' ORDER BY seq LIMIT 1", (idle_job,))]
    assert idle["action"] == "requeue" and idle["below_pct"] == 5 and idle["timeout_s"] == 3
    (seen,) = idle["gpus"]
    assert seen["index"] == 0 and seen["peak_pct"] == 0 and seen["samples"] >= 2 and seen["series"]
    info = cluster.job(idle_job)
    assert info["attempt"] == 1 and info["state"] in ("queued", "running")   # not a failed attempt
    # the busy one: never acted on, though it ran past its timeout many times over
    assert cluster.sql("SELECT count(*) FROM events WHERE job_id = ? AND kind = 'task_idle'", (busy_job,))[0][0] == 0
    assert cluster.job(busy_job)["state"] == "running"
    rc, out, _ = cluster.cli("job", "events", str(idle_job))
    assert rc == 0 and "task_idle" in out
    for job_id in jobs:
        cluster.cli("job", "cancel", str(job_id))


def test_bad_policies_get_an_error_and_change_nothing(cluster):
    before = cluster.sql("SELECT count(*) FROM jobs")[0][0]
    rc, _, err = cluster.cli("submit", "--idle-below", "150%", *HOLD)
    assert rc != 0 and "--idle-below" in err and "0-100%" in err
    rc, _, err = cluster.cli("submit", "--idle-timeout", "0.2", *HOLD)
    assert rc != 0 and re.search(r"Error: .*under one GPU sample interval", err), err
    rc, _, err = cluster.cli("project", "set", "default", "--idle-timeout", "0.1")
    assert rc != 0 and "under one GPU sample interval" in err
    assert cluster.sql("SELECT count(*) FROM jobs")[0][0] == before
    assert cluster.sql("SELECT idle_timeout_s FROM projects WHERE name = 'default'") == [(None,)]
    rc, out, err = cluster.cli("project", "set", "default", "--idle-timeout", "30m", "--idle-action", "cancel", "--json")
    assert rc == 0, err
    shown = json.loads(out)
    assert (shown["idle_timeout_seconds"], shown["idle_below_pct"], shown["idle_action"]) == (1800, None, "cancel")
