"""A job that requires GPUs joined by NVLink (`gpu_link` nvlink) and a gang whose ranks share a label's value
(`same`) (issue 40, point 3; docs/workers.md, "Topology"): the choice (scheduler/topology.py), the fit the claim
reads (schema.sql's shape_worker_fit), gang placement and the waiting reasons, through a real Scheduler on a
state file with workers that report the fake NVML boxes' topologies (tests/agent/fake_nvml)."""
from __future__ import annotations

import json

import pytest

from gpulayer.client import specs
from gpulayer.server.errors import InvalidRequest
from gpulayer.server.scheduler import topology
from gpulayer.server.scheduler.spec import validate_job
from helpers import add_worker, job, state_of
from test_gpu_topology import NVLINK, PCIE, add_box

DONE = dict(exit_code=0, outcome="succeeded", outputs={}, reason=None)


def test_nvlink_domains_name_each_gpus_set_by_its_lowest_index():
    assert topology.nvlink_domains(list(NVLINK.values()), 8) == [0, 0, 0, 0, 4, 4, 4, 4]
    assert topology.nvlink_domains(list(PCIE.values()), 8) == [None] * 8
    assert topology.nvlink_domains([], 2) == [None, None]


@pytest.mark.parametrize("free, n, expected", [
    (list(range(8)), 4, [0, 1, 2, 3]),
    ([0, 1, 2, 4, 5, 6, 7], 3, [0, 1, 2]),      # best fit: the set with the fewest free that holds 3
    ([0, 1, 4, 5, 6, 7], 4, [4, 5, 6, 7]),
    ([0, 1, 4, 5], 3, []),                      # 4 free, but no set holds 3
])
def test_pick_linked_takes_one_set(free, n, expected):
    assert topology.pick_linked(free, n, NVLINK, [0, 0, 0, 0, 4, 4, 4, 4]) == expected


def _run(sched, w, spec):
    sched.submit(job(**spec))
    task = sched.acquire_many(w, 0, 1)[0]
    sched.start(w, task["task_id"], 1)
    return task


def test_required_nvlink_waits_where_preferred_takes_what_is_free(sched):
    w = add_box(sched, "nv", NVLINK)
    box = {"labels": {"box": "nv"}}
    held = [_run(sched, w, {"gpus": 1, **box}) for _ in range(2)]
    assert [t["gpus"] for t in held] == [[0], [1]]  # one GPU: from the smallest set, then the fuller one
    busy = _run(sched, w, {"gpus": 4, **box})
    assert busy["gpus"] == [4, 5, 6, 7]
    needs = sched.submit(job(gpus=2, gpu_link="nvlink", **box))
    taken = sched.acquire_many(w, 0, 4)
    assert [t["gpus"] for t in taken] == [[2, 3]]  # 2 and 3 are one set's
    sched.start(w, taken[0]["task_id"], 1)
    sched.finish(w, held[0]["task_id"], **DONE)
    sched.finish(w, busy["task_id"], **DONE)
    late = sched.submit(job(gpus=3, gpu_link="nvlink", **box))
    assert [t["gpus"] for t in sched.acquire_many(w, 0, 4)] == [[4, 5, 6]]  # set 0-3 has one free (0)
    assert state_of(sched, needs)["state"] == state_of(sched, late)["state"] == "running"


def test_a_batch_claim_never_takes_two_sets_it_cannot_give(sched):
    """shape_worker_fit judges one task's room; a batch takes a `gpu_link` task only first (by_index)."""
    w = add_box(sched, "nv", NVLINK)
    box = {"labels": {"box": "nv"}}
    first = _run(sched, w, {"gpus": 4, **box})
    _run(sched, w, {"gpus": 2, **box})  # 4 and 5: free now 6, 7 and, once the first ends, 0-3
    sched.finish(w, first["task_id"], **DONE)
    jobs = [sched.submit(job(gpus=3, gpu_link="nvlink", **box)) for _ in range(2)]
    taken = sched.acquire_many(w, 0, 8)
    assert [t["gpus"] for t in taken] == [[0, 1, 2]]  # free 0-3, 6, 7: one set holds 3, once
    assert [state_of(sched, j)["state"] for j in jobs] == ["running", "queued"]
    reason = state_of(sched, jobs[1])["waiting_reason"]
    assert "3 GPUs joined by NVLink free" in reason, reason


def test_never_on_a_pcie_only_worker_and_the_reason_says_why(sched):
    w = add_box(sched, "pcie", PCIE)
    plain = add_worker(sched, "plain", gpus=8, cpus=64, memory_mb=512000)
    found = sched.submit(job(gpus=2, gpu_link="nvlink"))
    assert sched.acquire_many(w, 0, 4) == [] and sched.acquire_many(plain, 0, 4) == []
    reason = state_of(sched, found)["waiting_reason"]
    assert reason == ('no online worker has 2 GPUs joined by NVLink (`gpu_link` nvlink: of one NVLink set; '
                      'docs/workers.md, "Topology")'), reason
    preferred = sched.submit(job(gpus=2))  # the default prefers NVLink and takes what there is
    assert len(sched.acquire_many(w, 0, 4)) == 1 and state_of(sched, preferred)["state"] == "running"


def test_a_box_whose_sets_are_too_small_waits_for_one_that_is_not(sched):
    nv = add_box(sched, "nv", NVLINK)
    found = sched.submit(job(gpus=8, gpu_link="nvlink"))
    assert sched.acquire_many(nv, 0, 1) == []
    assert "8 GPUs joined by NVLink" in state_of(sched, found)["waiting_reason"]
    stored = sched.store.read(lambda c: c.execute("SELECT gpu_nvlink FROM workers WHERE id = ?", (nv,)).fetchall())
    assert json.loads(stored[0]["gpu_nvlink"]) == [0, 0, 0, 0, 4, 4, 4, 4]


def _ranks(sched, workers: dict[str, int], polls: list[str]) -> dict[str, int]:
    """Poll with the named workers in order; {worker name: rank} of what each got."""
    got = {}
    for name in polls:
        for task in sched.acquire_many(workers[name], 0, 1):
            got[name] = task["rank"]
    return got


def test_a_gang_with_same_takes_workers_of_one_value(sched):
    racks = {"a": "r1", "b": "r1", "c": "r2", "d": "r2", "e": "r2", "x": None}
    workers = {n: add_worker(sched, n, labels={"rack": r} if r else {}) for n, r in racks.items()}
    gang = sched.submit(job(nodes=3, same=["rack"]))
    assert _ranks(sched, workers, ["a", "x"]) == {}  # r1 has 2, x no rack
    assert state_of(sched, gang)["waiting_reason"] is None  # r2's workers would take it now
    got = _ranks(sched, workers, ["c", "d", "e", "a", "b"])
    assert sorted(got) == ["c", "d", "e"] and sorted(got.values()) == [0, 1, 2]
    again = sched.submit(job(nodes=3, same=["rack"]))  # r2 is busy now, r1 too small: busy, not never
    reason = state_of(sched, again)["waiting_reason"]
    assert reason.startswith("waiting for capacity") and "3 workers" in reason, reason


def test_a_gang_with_same_says_when_no_value_has_enough(sched):
    for n, r in [("a", "r1"), ("b", "r1"), ("c", "r2"), ("d", None)]:
        add_worker(sched, n, labels={"rack": r} if r else {})
    gang = sched.submit(job(nodes=3, same=["rack"]))
    reason = state_of(sched, gang)["waiting_reason"]
    assert reason == ("needs 3 workers that share the value of rack (`same`), but at most 2 online that fit it do "
                      "(rack=r1: 2; rack=r2: 1)"), reason
    plain = sched.submit(job(nodes=3))  # without `same`, 4 workers fit
    assert "needs" not in (state_of(sched, plain)["waiting_reason"] or "")


@pytest.mark.parametrize("bad, field", [
    ({"gpus": 2, "gpu_link": "pcie"}, "gpu_link"),
    ({"gpus": 1, "gpu_link": "nvlink"}, "gpu_link"),
    ({"accelerator": "cuda", "gpu_link": "nvlink"}, "gpu_link"),
    ({"gpu_fraction": 0.5, "gpu_link": "nvlink"}, "gpu_link"),
    ({"same": ["rack"]}, "same"),                      # one node: nothing to share
    ({"nodes": 2, "same": [""]}, "same"),
    ({"nodes": 2, "same": ["rack=r1"]}, "same"),       # a value is pinned by labels
    ({"nodes": 2, "same": ["rack", "rack"]}, "same"),
    ({"nodes": 2, "same": "rack"}, "same"),
    ({"nodes": 2, "same": ["r"] * 9}, "same"),
])
def test_bad_wiring_is_refused_naming_the_field(sched, bad, field):
    with pytest.raises(InvalidRequest) as caught:
        validate_job(job(**bad))
    assert str(caught.value).startswith(field), str(caught.value)
    with pytest.raises(InvalidRequest):
        sched.submit(job(**bad))
    assert sched.store.read(lambda c: c.execute("SELECT count(*) AS n FROM jobs").fetchall())[0]["n"] == 0


def test_the_client_splits_same_and_checks_what_the_server_would():
    spec = specs.job("train", nodes=2, same=["rack", "ib=s1"], labels={"pool": "a"})
    assert spec["same"] == ["rack", "ib"] and spec["labels"] == {"pool": "a", "ib": "s1"}
    assert specs.job("train", nodes=2, same="rack")["same"] == ["rack"]
    assert specs.job("train", gpus=2, gpu_link="nvlink")["gpu_link"] == "nvlink"
    for bad in [dict(gpus=1, gpu_link="nvlink"), dict(gpus=2, gpu_link="pcie"), dict(same="rack"),
                dict(nodes=2, same=["=r1"]), dict(nodes=2, same=["rack=r1", "rack=r2"])]:
        with pytest.raises(ValueError):
            specs.job("train", **bad)
