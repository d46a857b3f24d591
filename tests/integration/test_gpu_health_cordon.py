"""GPU health, cordon and drain end to end: a real server, real workers, the CLI, real task processes.

The worker's GPUs are the fake pynvml of tests/agent/fake_nvml (first on its
PYTHONPATH, driven by a JSON file): agent/gpu/nvml.py, the health watcher, the
heartbeat, the server and placement above it are the real ones.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import gpulayer
from gpulayer.testing import wait_for

from integration_cluster import Cluster

FAKE_DIR = Path(__file__).resolve().parents[1] / "agent" / "fake_nvml"
SOURCE_ROOT = Path(gpulayer.__file__).resolve().parents[1]
HOLD = ["sh", "-c", "sleep 60"]


def write_state(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(path)


def gpu(n: int) -> dict:
    return {"name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{n}", "mig_supported": True, "mig": None,
            "ecc_uncorrected": 0, "remap_failed": False}


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path).start_server()
    try:
        yield c
    finally:
        c.close()


def start_fake_gpu_worker(cluster: Cluster, name: str, state: dict, tmp_path: Path, **options):
    path = tmp_path / f"{name}-nvml.json"
    write_state(path, state)
    cluster.start_worker(name, gpus=None, env={"PYTHONPATH": f"{FAKE_DIR}:{SOURCE_ROOT}",
                                                "FAKE_NVML_STATE": str(path)}, **options)
    return path


def current(cluster: Cluster, job_id: int) -> list[dict]:
    return cluster.current_tasks(job_id)


def listed(cluster: Cluster, name: str) -> dict:
    rc, out, err = cluster.cli("worker", "list", "--json")
    assert rc == 0, err
    return next(w for w in json.loads(out) if w["name"] == name and w["state"] != "gone")


def test_xid_takes_a_gpu_out_and_its_task_is_retried_on_another(cluster, tmp_path):
    state = {"gpus": [gpu(0), gpu(1)], "xids": []}
    path = start_fake_gpu_worker(cluster, "g", state, tmp_path, parallel=2)
    w = listed(cluster, "g")
    assert w["resources"]["gpus"] == 2
    assert [(g["uuid"], g["healthy"]) for g in w["gpus"]] == [("GPU-0", True), ("GPU-1", True)]
    job_id = cluster.submit({"command": HOLD, "gpus": 1, "retry": {"max_attempts": 2}})
    task = wait_for(lambda: next((t for t in current(cluster, job_id) if t["state"] == "running"), None), 30,
                    "the task running")
    index = cluster.sql("SELECT gpu_indices FROM tasks WHERE id = ?", (task["task_id"],))[0][0]
    bad = json.loads(index)[0]
    # An application's own Xid first (ignored), then a GPU that fell off the bus.
    state["xids"] = [{"uuid": f"GPU-{bad}", "xid": 13}, {"uuid": f"GPU-{bad}", "xid": 79}]
    write_state(path, state)
    wait_for(lambda: cluster.job(job_id)["attempt"] == 2, 30, "the retry", details=lambda: cluster.logs())
    first = [t for t in cluster.job(job_id)["tasks"] if t["attempt"] == 1][0]
    assert first["state"] == "lost"
    assert cluster.sql("SELECT reason FROM tasks WHERE id = ?", (first["task_id"],))[0][0] == "gpu_unhealthy"
    again = wait_for(lambda: next((t for t in current(cluster, job_id) if t["state"] == "running"), None), 30,
                     "the retry running on the other GPU")
    assert cluster.sql("SELECT gpu_indices FROM tasks WHERE id = ?", (again["task_id"],))[0][0] == f"[{1 - bad}]"
    w = listed(cluster, "g")
    assert [g["healthy"] for g in w["gpus"]] == [i != bad for i in (0, 1)]
    assert w["gpus"][bad]["reason"] == "Xid 79" and w["free"]["gpus"] == 0
    wait_for(lambda: "task_cancel_requested" in cluster.workers["g"].log(), 15, "the agent told to stop it")
    assert "gpu_xid_ignored" in cluster.workers["g"].log()
    # The operator brings it back: the control plane and the agent forget the fault.
    rc, out, err = cluster.cli("worker", "gpu-reset", "g", "--gpu", str(bad))
    assert rc == 0 and "marked healthy" in out, err
    wait_for(lambda: "gpu_reset" in cluster.workers["g"].log(), 15, "the agent told of the reset")
    assert all(g["healthy"] for g in listed(cluster, "g")["gpus"])
    assert listed(cluster, "g")["free"]["gpus"] == 1
    cluster.cli("job", "cancel", str(job_id))


def test_cordon_drain_uncordon_through_the_cli(cluster):
    cluster.start_worker("w", parallel=1)
    rc, out, err = cluster.cli("worker", "cordon", "w", "--reason", "bad fan")
    assert rc == 0 and "cordoned: bad fan" in out, err
    job_id = cluster.submit({"command": ["echo", "hi"]})
    rc, out, _ = cluster.cli("job", "status", str(job_id))
    assert "only cordoned workers fit it: w (cordoned: bad fan)" in out
    rc, out, _ = cluster.cli("worker", "list")
    assert "online+cordoned" in out and "bad fan" in out
    assert cluster.cli("worker", "uncordon", "w").returncode == 0
    assert cluster.wait_job(job_id)["state"] == "succeeded"

    held = cluster.submit({"command": HOLD})  # one attempt, the default: the drain must not use it up
    wait_for(lambda: any(t["state"] == "running" for t in current(cluster, held)), 30, "the task running")
    rc, out, err = cluster.cli("worker", "drain", "w", "--reason", "reboot", "--timeout", "1")
    assert rc == 0 and "draining: reboot" in out, err
    wait_for(lambda: listed(cluster, "w")["cordon"] == "drained", 30, "the drain's timeout")
    info = cluster.job(held)
    assert info["state"] == "queued" and info["attempt"] == 1  # stopped and requeued, the same attempt
    assert listed(cluster, "w")["state"] == "online"  # still registered and heartbeating
    wait_for(lambda: "task_cancel_requested" in cluster.workers["w"].log(), 15, "the agent told to stop it")
    rc, out, _ = cluster.cli("job", "status", str(held))
    assert "only cordoned workers fit it: w (drained: reboot)" in out
    cluster.cli("worker", "uncordon", "w")
    wait_for(lambda: any(t["state"] == "running" for t in current(cluster, held)), 30, "placed again")
    cluster.cli("job", "cancel", str(held))


def test_cli_refusals(cluster):
    cluster.start_worker("w", parallel=1)
    rc, out, err = cluster.cli("worker", "cordon", "nobody", "--reason", "x")
    assert rc != 0 and "no worker 'nobody'" in err and "Traceback" not in err
    rc, out, err = cluster.cli("worker", "drain", "w")
    assert rc == 2 and "--reason" in err
    rc, out, err = cluster.cli("worker", "drain", "w", "--reason", "x", "--timeout", "soon")
    assert rc == 2
    rc, out, err = cluster.cli("worker", "gpu-reset", "w", "--gpu", "0")
    assert rc != 0 and "reported no GPU 0" in err
    assert listed(cluster, "w")["cordon"] is None


def test_mig_instances_are_scheduled_as_gpus(cluster, tmp_path):
    mig = {**gpu(0), "name": "NVIDIA A100-SXM4-80GB",
           "mig": [{"profile": "1g.10gb", "uuid": "MIG-0-a", "gi": 7}, {"profile": "3g.40gb", "uuid": "MIG-0-b", "gi": 2}]}
    start_fake_gpu_worker(cluster, "m", {"gpus": [mig, gpu(1)], "xids": []}, tmp_path,
                          labels={"mig": "mixed"})
    w = listed(cluster, "m")
    assert w["resources"]["gpus"] == 3
    assert w["resources"]["gpu_models"] == ["1g.10gb", "3g.40gb", "NVIDIA H100 80GB HBM3"]
    assert [g["uuid"] for g in w["gpus"]] == ["MIG-0-a", "MIG-0-b", "GPU-1"]
    # Two GPUs are never two MIG instances (a CUDA process would see only one): this worker has one whole GPU.
    two = cluster.submit({"command": ["true"], "gpus": 2, "labels": {"mig": "mixed"}})
    rc, out, _ = cluster.cli("job", "status", str(two))
    assert "no online worker with its labels has 2 whole GPUs" in out
    cluster.cli("job", "cancel", str(two))
    job_id = cluster.submit({"command": ["sh", "-c", 'echo "CVD=$CUDA_VISIBLE_DEVICES"'], "gpus": 1,
                             "labels": {"mig": "mixed"}})
    assert cluster.wait_job(job_id)["state"] == "succeeded"
    assert "CVD=MIG-0-a" in cluster.log_text(job_id)
    # A profile asked by model on this worker of mixed profiles: the task gets the instance of that profile.
    rc, out, err = cluster.cli("submit", "--gpus", "1", "--gpu-model", "3g.40gb", "--", "sh", "-c",
                               'echo "CVD=$CUDA_VISIBLE_DEVICES"')
    assert rc == 0, err
    by_model = int(out.split()[0])
    assert cluster.job(by_model)["spec"]["labels"] == {"gpu_model": "3g.40gb"}
    assert cluster.wait_job(by_model)["state"] == "succeeded"
    assert "CVD=MIG-0-b" in cluster.log_text(by_model)
    rc, out, err = cluster.cli("submit", "--gpu-model", "2g.20gb", "--", "true")
    assert rc == 0, err
    rc, out, _ = cluster.cli("job", "status", out.split()[0])
    assert 'no online worker has the labels {"gpu_model": "2g.20gb"}' in out


def test_health_is_watched_when_the_count_is_given(cluster, tmp_path):
    """--gpus N sets the count; NVML still says how the devices are (gap: it used to watch nothing)."""
    path = tmp_path / "p-nvml.json"
    state = {"gpus": [gpu(0), gpu(1)], "xids": []}
    write_state(path, state)
    cluster.start_worker("p", gpus=1, env={"PYTHONPATH": f"{FAKE_DIR}:{SOURCE_ROOT}", "FAKE_NVML_STATE": str(path)})
    w = listed(cluster, "p")
    assert w["resources"]["gpus"] == 1
    assert [(g["uuid"], g["healthy"]) for g in w["gpus"]] == [("GPU-0", True)]
    state["gpus"][0]["remap_failed"] = True
    write_state(path, state)
    wait_for(lambda: not listed(cluster, "p")["gpus"][0]["healthy"], 30, "GPU 0 unhealthy",
             details=lambda: cluster.logs())
    assert listed(cluster, "p")["gpus"][0]["reason"] == "row remapping failed (remapped-row failure)"
