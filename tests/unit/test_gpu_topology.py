"""Placement that knows the wiring (issue 40, point 3; docs/workers.md, "Topology"): the choice of GPUs by
NVLink set, PCIe switch and NUMA node (scheduler/topology.py), and through a real Scheduler on a state file,
a worker that reports the topology of an 8-GPU box with two NVLink sets of 4 (tests/agent/fake_nvml)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from gpulayer.server.errors import InvalidRequest
from gpulayer.server.http import wire
from gpulayer.server.scheduler import topology
from helpers import SERVER_JOIN, job

FAKE = Path(__file__).resolve().parents[1] / "agent" / "fake_nvml" / "pynvml.py"


def _fake():
    spec = importlib.util.spec_from_file_location("fake_pynvml_topology", FAKE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wiring_of(box: dict) -> dict[int, dict]:
    """The topology the agent reads from a fake box (agent/gpu/topology.py, checked in tests/agent)."""
    return {i: {"index": i, "nvlink_peers": sorted(set(g.get("nvlink") or [])), "pcie_switch": g.get("pcie_switch"),
                "numa_node": g.get("numa_node")} for i, g in enumerate(box["gpus"])}


FAKE_NVML = _fake()
NVLINK = wiring_of(FAKE_NVML.nvlink_box())
PCIE = {i: {**r, "pcie_switch": i - i % 2} for i, r in wiring_of(FAKE_NVML.pcie_box()).items()}


@pytest.mark.parametrize("free, n, wiring, expected, how", [
    (list(range(8)), 4, NVLINK, [0, 1, 2, 3], "nvlink"),
    ([1, 2, 3, 4, 5, 6, 7], 4, NVLINK, [4, 5, 6, 7], "nvlink"),         # set 0-3 is broken: the other set
    ([0, 2, 3, 4, 5, 6, 7], 2, NVLINK, [0, 2], "nvlink"),               # best fit: the fuller set keeps 4-7 whole
    ([0, 1, 4, 5, 6, 7], 2, NVLINK, [0, 1], "nvlink"),
    ([0, 1, 4, 6], 3, NVLINK, [0, 1, 4], "none"),                       # no set, switch or socket holds 3
    ([0, 1, 2, 5, 6], 3, NVLINK, [0, 1, 2], "nvlink"),
    ([1, 3, 5, 7], 2, PCIE, [1, 3], "numa_node"),                       # no switch holds 2: one socket
    ([1, 2, 3, 5], 2, PCIE, [2, 3], "pcie_switch"),
    ([1, 5], 2, PCIE, [1, 5], "none"),
    ([3, 1, 2], 2, {}, [1, 2], "none"),                                 # no topology: the lowest, as before
    ([0, 1, 2, 3, 7], 1, NVLINK, [7], "none"),                          # one GPU: from the smallest set
    ([0, 1, 2], 1, PCIE, [0], "none"),
])
def test_pick(free, n, wiring, expected, how):
    picked, joined = topology.pick(free, n, wiring)
    assert (picked, joined) == (expected, how)


def test_reported_keeps_what_names_the_workers_gpus():
    raw = [{"index": 1, "nvlink_peers": [0, 1, 9], "pcie_switch": 0, "numa_node": 0},
           {"index": 1, "nvlink_peers": [], "pcie_switch": None, "numa_node": None},
           {"index": 5, "nvlink_peers": [0]}, {"index": 0, "nvlink_peers": [1]}]
    assert topology.reported(raw, 2) == [
        {"index": 0, "nvlink_peers": [1], "pcie_switch": None, "numa_node": None},
        {"index": 1, "nvlink_peers": [0], "pcie_switch": 0, "numa_node": 0}]
    assert topology.reported(None, 8) == []


def add_box(sched, name, wiring: dict[int, dict] | None):
    body = {"name": name, "labels": {"box": name}, "slots": 8, "version": "test",
            "resources": {"cpus": 64, "gpus": 8, "memory_mb": 512000, "gpu_models": []}}
    if wiring is not None:
        body["gpu_topology"] = list(wiring.values())
    return sched.register(body=body, token=SERVER_JOIN, session_hash=f"hash-{name}",
                          peer_address="127.0.0.1")["worker_id"]


def test_four_gpu_tasks_take_one_nvlink_set_whenever_one_is_free(sched):
    w = add_box(sched, "nv", NVLINK)
    sched.submit(job(gpus=1, labels={"box": "nv"}))
    first = sched.acquire_many(w, 0, 1)[0]
    sched.start(w, first["task_id"], 1)
    assert first["gpus"] == [0]
    for _ in range(2):
        sched.submit(job(gpus=4, labels={"box": "nv"}))
    taken = sched.acquire_many(w, 0, 1)
    assert taken[0]["gpus"] == [4, 5, 6, 7]  # 0 is held: set 4-7 is the one set free, not 1, 2, 3, 4
    sched.start(w, taken[0]["task_id"], 1)
    assert sched.acquire(w) is None  # b waits: 3 free GPUs
    sched.finish(w, first["task_id"], exit_code=0, outcome="succeeded", outputs={}, reason=None)
    taken = sched.acquire_many(w, 0, 1)
    assert taken[0]["gpus"] == [0, 1, 2, 3]


def test_a_worker_without_topology_gets_the_lowest_indices(sched):
    w = add_box(sched, "plain", None)
    sched.submit(job(gpus=2, labels={"box": "plain"}))
    assert sched.acquire_many(w, 0, 1)[0]["gpus"] == [0, 1]
    stored = sched.store.read(lambda c: c.execute("SELECT gpu_topology FROM workers WHERE id = ?", (w,)).fetchall())
    assert json.loads(stored[0]["gpu_topology"]) == []


@pytest.mark.parametrize("bad, says", [
    ("nvlink", "gpu_topology: must be a list"),
    ([{"nvlink_peers": []}], "gpu_topology[0].index"),
    ([{"index": 0, "nvlink_peers": [1, "two"]}], "gpu_topology[0].nvlink_peers[1]"),
    ([{"index": 0, "nvlink_peers": 3}], "gpu_topology[0].nvlink_peers: must be a list"),
    ([{"index": 0, "numa_node": -1}], "gpu_topology[0].numa_node"),
    ([{"index": 0, "pcie_switch": "a"}], "gpu_topology[0].pcie_switch"),
])
def test_a_bad_topology_is_refused_naming_the_field(bad, says):
    body = {"name": "w", "resources": {"cpus": 1, "gpus": 1, "memory_mb": 1}, "gpu_topology": bad}
    with pytest.raises(InvalidRequest) as caught:
        wire.register(body)
    assert str(caught.value).startswith(says), str(caught.value)
    body["gpu_topology"] = [{"index": 0, "nvlink_peers": [1]}]
    assert wire.register(body)["gpu_topology"] == [{"index": 0, "nvlink_peers": [1], "pcie_switch": None,
                                                    "numa_node": None}]
