"""Placement that knows the wiring end to end (issue 40, point 3): a real control plane and a real worker
process on a fake 8-GPU box whose NVLink joins GPUs 0-3 and 4-7 (tests/agent/fake_nvml `nvlink_box`). The
agent reads the topology from NVML and reports it at register; with GPU 0 held by a 1-GPU task, a 4-GPU task
gets the one NVLink set still free (4-7), not the lowest indices (1-4); the next gets 0-3 once 0 is free. A job
that requires NVLink (`gpu_link`) waits while 1-3 are free, saying so, and then gets one set."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

import gpulayer
from gpulayer.testing import wait_for

from integration_cluster import Cluster

pytestmark = pytest.mark.slow

FAKE_NVML = Path(__file__).resolve().parents[1] / "agent" / "fake_nvml"
SOURCE_ROOT = Path(gpulayer.__file__).resolve().parents[1]


def nvlink_box() -> dict:
    spec = importlib.util.spec_from_file_location("fake_pynvml_box", FAKE_NVML / "pynvml.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.nvlink_box()


def test_four_gpu_tasks_get_one_nvlink_set(tmp_path):
    c = Cluster(tmp_path).start_server()
    try:
        state = tmp_path / "nvml.json"
        state.write_text(json.dumps(nvlink_box()))
        c.start_worker("box", gpus=None, parallel=3, args=["--sandbox", "none"],
                       env={"PYTHONPATH": f"{FAKE_NVML}:{SOURCE_ROOT}", "FAKE_NVML_STATE": str(state)})
        stored = json.loads(c.sql("SELECT gpu_topology FROM workers")[0][0])
        assert [r["nvlink_peers"] for r in stored][:2] == [[1, 2, 3], [0, 2, 3]], stored
        hold = tmp_path / "hold"
        script = ["sh", "-c", f"while [ ! -e {hold} ]; do sleep 0.1; done"]
        one = c.submit({"command": script, "gpus": 1})
        wait_for(lambda: c.sql(f"SELECT 1 FROM tasks WHERE job_id = {one} AND state = 'running'"), 30, "1-GPU task")
        four = c.submit({"command": script, "gpus": 4})
        held = wait_for(lambda: c.sql(f"SELECT gpu_indices FROM tasks WHERE job_id = {four} AND state = 'running'"),
                        30, "4-GPU task running")
        assert json.loads(held[0][0]) == [4, 5, 6, 7]
        # `gpu_link` nvlink (docs/workers.md, "Topology"): 1-3 are free, no set of 4: it waits; 8 never fit a set
        linked = c.submit({"command": ["true"], "gpus": 4, "gpu_link": "nvlink"})
        eight = c.submit({"command": ["true"], "gpus": 8, "gpu_link": "nvlink"})
        said = c.job(eight)["waiting_reason"]
        assert said.startswith("no online worker has 8 GPUs joined by NVLink"), said
        assert "4 GPUs joined by NVLink free" in c.job(linked)["waiting_reason"]
        (tmp_path / "hold").write_text("")
        for job_id in (one, four, linked):
            assert c.wait_job(job_id, timeout=30)["state"] == "succeeded"
        got = set(json.loads(c.sql(f"SELECT gpu_indices FROM tasks WHERE job_id = {linked}")[0][0]))
        assert got <= {0, 1, 2, 3} or got <= {4, 5, 6, 7}, got
        again = c.submit({"command": ["true"], "gpus": 4})
        assert c.wait_job(again, timeout=30)["state"] == "succeeded"
        assert json.loads(c.sql(f"SELECT gpu_indices FROM tasks WHERE job_id = {again}")[0][0]) == [0, 1, 2, 3]
    finally:
        c.close()
