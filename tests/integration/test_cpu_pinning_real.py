"""`worker start --pin-cpus` end to end (issue 40, point 3): a real control plane and a real worker process, its
tasks in bubblewrap sandboxes, on a fake 2-GPU box whose GPUs sit on two NUMA nodes, CPU 0 local to GPU 0 and
CPU 1 to GPU 1 (tests/agent/fake_nvml: `cpus`). Each task prints the real affinity of its process
(/proc/self/status's Cpus_allowed_list, read by a child of its shell) and its GPULAYER_CPUS. While a 1-GPU task
holds GPU 0, a task without GPUs (started in a sandbox made ahead) and a 2-element array (forked by the job's
launcher) run on CPU 1, the one no GPU task holds, and `gpulayer exec` into the 1-GPU task runs on CPU 0; a 2-GPU
task then runs on both nodes' CPUs."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

import gpulayer
from gpulayer.testing import wait_for

from integration_cluster import Cluster

pytestmark = pytest.mark.slow

FAKE_NVML = Path(__file__).resolve().parents[1] / "agent" / "fake_nvml"
SOURCE_ROOT = Path(gpulayer.__file__).resolve().parents[1]
SHOW = "grep Cpus_allowed_list /proc/self/status; echo GPULAYER_CPUS=$GPULAYER_CPUS"


def _box() -> dict:
    return {"xids": [], "gpus": [{"name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{i}", "mig": None,
                                  "numa_node": i, "cpus": [i]} for i in range(2)]}


def _seen(c: Cluster, job_id: int) -> list[tuple[str, str]]:
    """(Cpus_allowed_list, GPULAYER_CPUS) of each of the job's tasks, from its log."""
    lines = c.log_text(job_id).splitlines()
    allowed = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Cpus_allowed_list")]
    told = [line.split("=", 1)[1] for line in lines if line.startswith("GPULAYER_CPUS=")]
    return list(zip(allowed, told))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None, reason="sandboxes made ahead need a root agent and bwrap")
def test_tasks_run_on_their_gpus_cpus_and_the_rest_on_the_others(tmp_path):
    hold = Path(tempfile.mkdtemp(prefix="gpulayer-pin-"))  # bound into the sandboxes: the task user reads it
    hold.chmod(0o755)
    c = Cluster(tmp_path).start_server()
    try:
        state = tmp_path / "nvml.json"
        state.write_text(json.dumps(_box()))
        c.start_worker("numa", gpus=None, parallel=4, args=["--pin-cpus", "--sandbox", "bwrap", "--sandbox-bind", str(hold)],
                       env={"PYTHONPATH": f"{FAKE_NVML}:{SOURCE_ROOT}", "FAKE_NVML_STATE": str(state)})
        held = c.submit({"command": ["sh", "-c", f"{SHOW}; while [ ! -e {hold}/go ]; do sleep 0.05; done"], "gpus": 1})
        wait_for(lambda: _seen(c, held), 30, "the 1-GPU task's affinity in its log")
        assert json.loads(c.sql(f"SELECT gpu_indices FROM tasks WHERE job_id = {held}")[0][0]) == [0]
        assert _seen(c, held) == [("0", "0")]
        rc, out, err = c.cli("exec", str(held), "--", "grep", "Cpus_allowed_list", "/proc/self/status")
        assert rc == 0 and out.split(":")[1].strip() == "0", (out, err)  # what exec starts in it runs there too
        array = c.submit({"command": ["sh", "-c", SHOW], "array": "0-1"})
        plain = [c.submit({"command": ["sh", "-c", SHOW]})]  # a bwrap of its own; the next asks for a spare
        assert c.wait_job(plain[0])["state"] == "succeeded"
        plain.append(c.submit({"command": ["sh", "-c", SHOW]}))
        for job_id in (*plain, array):
            assert c.wait_job(job_id)["state"] == "succeeded"
        assert [_seen(c, job_id) for job_id in plain] == [[("1", "1")], [("1", "1")]]
        assert _seen(c, array) == [("1", "1"), ("1", "1")]
        (hold / "go").write_text("")
        assert c.wait_job(held)["state"] == "succeeded"
        both = c.submit({"command": ["sh", "-c", SHOW], "gpus": 2})
        assert c.wait_job(both)["state"] == "succeeded"
        assert _seen(c, both) == [("0-1", "0-1")]
        assert "pinned to CPUs 0-1" in c.log_text(both)
    finally:
        c.close()
        shutil.rmtree(hold, ignore_errors=True)
