"""Fractions of a GPU (issue 40, point 1; docs/workers.md "Sharing a GPU"), against a real state file: the
JobSpec's `gpu_fraction` / `gpu_memory_mb` and their bad input, best-fit packing onto the fewest GPUs, no
share on a GPU a whole-GPU task holds (nor the reverse), quotas and the usage ledger counting the share."""
from __future__ import annotations

import pytest

from gpulayer.server.errors import InvalidRequest
from gpulayer.server.scheduler import teams, workers as workers_mod
from gpulayer.server.scheduler.placement import best_fit
from helpers import SERVER_JOIN, job, state_of


def add_shared(sched, name="w", *, gpus=4, sharing="mps", gpu_memory_mb=81920, slots=32):
    body = {"name": name, "labels": {}, "slots": slots, "version": "test",
            "resources": {"cpus": 64, "gpus": gpus, "memory_mb": 512000, "gpu_models": [],
                          "gpu_sharing": sharing, "gpu_memory_mb": gpu_memory_mb}}
    return sched.register(body=body, token=SERVER_JOIN, session_hash=f"hash-{name}",
                          peer_address="127.0.0.1")["worker_id"]


def take(sched, w, most=1):
    """Acquire up to `most` tasks on w and start them (an acquire hands out its unstarted ones again)."""
    taken = sched.acquire_many(w, 0, most)
    for a in taken:
        sched.start(w, a["task_id"], 1)
    return taken


def jobs_count(sched) -> int:
    return sched.store.read(lambda c: c.execute("SELECT count(*) AS n FROM jobs").fetchall()[0]["n"])


@pytest.mark.parametrize("spec, field", [
    ({"gpu_fraction": 0}, "gpu_fraction"),
    ({"gpu_fraction": 1}, "gpu_fraction"),
    ({"gpu_fraction": 1.5}, "gpu_fraction"),
    ({"gpu_fraction": -0.1}, "gpu_fraction"),
    ({"gpu_fraction": "half"}, "gpu_fraction"),
    ({"gpu_fraction": 0.5, "gpus": 2}, "gpu_fraction"),
    ({"gpu_memory_mb": 1024, "gpus": 4}, "gpu_memory_mb"),
    ({"gpu_memory_mb": 0}, "gpu_memory_mb"),
    ({"gpu_fraction": 0.5, "nodes": 2}, "gpu_fraction"),
])
def test_bad_shares_are_refused_and_change_nothing(sched, spec, field):
    before = jobs_count(sched)
    with pytest.raises(InvalidRequest) as caught:
        sched.submit(job(**spec))
    assert str(caught.value).startswith(field)
    assert jobs_count(sched) == before


def test_a_share_is_stored_with_no_whole_gpu(sched):
    j = sched.submit(job(gpu_fraction=0.25, gpus=1))
    spec = state_of(sched, j)["spec"]
    assert (spec["gpus"], spec["gpu_fraction"], spec["accelerator"]) == (0, 0.25, "cuda")


def test_sixteen_quarters_run_at_once_on_exactly_four_gpus(sched):
    w = add_shared(sched, gpus=4)
    for _ in range(16):
        sched.submit(job(gpu_fraction=0.25))
    taken = take(sched, w, 16)
    assert len(taken) == 16
    by_gpu: dict[int, int] = {}
    for a in taken:
        assert len(a["gpus"]) == 1 and a["gpu_share"] == 0.25 and a["gpu_fraction"] == 0.25
        by_gpu[a["gpus"][0]] = by_gpu.get(a["gpus"][0], 0) + 1
    assert by_gpu == {0: 4, 1: 4, 2: 4, 3: 4}
    sched.submit(job(gpu_fraction=0.25))
    assert sched.acquire(w) is None  # every GPU full
    listed = sched.store.read(workers_mod.listing)[0]
    assert listed["gpu_shares"] == {"gpus": 4, "used": 4.0} and listed["free"]["gpus"] == 0


def test_best_fit_fills_the_fullest_gpu_and_keeps_whole_ones_free(sched):
    w = add_shared(sched, gpus=4)
    for fraction in (0.5, 0.25):
        sched.submit(job(gpu_fraction=fraction))
    first = take(sched, w, 2)
    assert [a["gpus"] for a in first] == [[0], [0]]  # 0.25 joins the 0.5, not GPU 1
    whole = sched.submit(job(gpus=3))
    a = take(sched, w)[0]
    assert a["job_id"] == whole and a["gpus"] == [1, 2, 3]  # never GPU 0, which shares hold
    sched.submit(job(gpu_fraction=0.5))
    assert sched.acquire(w) is None  # 0.25 left on GPU 0; the others are a whole-GPU task's
    sched.submit(job(gpu_fraction=0.25))
    assert take(sched, w)[0]["gpus"] == [0]  # fills GPU 0


def test_whole_gpu_waits_while_shares_hold_every_gpu(sched):
    w = add_shared(sched, gpus=1)
    sched.submit(job(gpu_fraction=0.1))
    assert take(sched, w)[0]["gpus"] == [0]
    sched.submit(job(gpus=1))
    assert sched.acquire(w) is None


def test_memory_share_and_workers_that_do_not_share(sched):
    off = add_shared(sched, "off", sharing="off")
    small = add_shared(sched, "small", gpu_memory_mb=16384)
    big = sched.submit(job(gpu_memory_mb=40960))
    assert sched.acquire(off) is None and sched.acquire(small) is None
    assert "a share of one GPU (40960 MB" in (state_of(sched, big).get("waiting_reason") or "")
    large = add_shared(sched, "large", gpu_memory_mb=81920)
    a = sched.acquire(large)
    assert a["job_id"] == big and a["gpu_share"] == 0.5 and a["gpu_memory_mb"] == 40960


def test_quota_and_usage_count_the_share(sched, clock):
    sched.change_teams(teams.add_project, {"name": "p", "gpus": 1})
    w = add_shared(sched, gpus=4)
    first = sched.submit(job(gpu_fraction=0.5), project="p")
    sched.submit(job(gpu_fraction=0.5), project="p")
    sched.submit(job(gpu_fraction=0.5), project="p")
    taken = take(sched, w, 3)
    assert len(taken) == 2  # 1.0 of a quota of 1 GPU: the third waits for quota
    clock.advance(100)
    sched.finish(w, taken[0]["task_id"], exit_code=0, outcome="succeeded", outputs={}, reason=None)
    usage = sched.store.read(lambda c: c.execute("SELECT gpu_seconds, gpus FROM usage WHERE job_id = ?",
                                                 (first,)).fetchall())
    assert usage == [{"gpu_seconds": pytest.approx(50.0), "gpus": 0}]


@pytest.mark.parametrize("held, free, share, expected", [
    ({}, [0, 1], 0.25, 0),
    ({0: 0.5, 1: 0.75}, [2], 0.25, 1),     # the fullest that holds it
    ({0: 0.5, 1: 0.9}, [2], 0.25, 0),      # 1 has too little room
    ({0: 0.9}, [], 0.25, None),
    ({0: 0.7}, [3], 0.3, 0),               # 0.7 + 0.3 fills it exactly, up to rounding
])
def test_best_fit(held, free, share, expected):
    assert best_fit(held, free, share) == expected


def test_a_batch_claim_stops_after_a_share_which_may_take_a_whole_gpu(sched):
    w = add_shared(sched, gpus=1)
    share = sched.submit(job(gpu_fraction=0.5))
    sched.submit(job(gpus=1))
    taken = take(sched, w, 4)  # several at once: the whole GPU the share took is no running sum's
    assert [a["job_id"] for a in taken] == [share]
