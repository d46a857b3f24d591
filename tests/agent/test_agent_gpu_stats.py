"""agent/gpu/stats.py over the fake pynvml: utilization and memory read, downsampled, sent with heartbeats.

Only `pynvml` is replaced (tests/agent/fake_nvml); agent/gpu/nvml.py, the sampler and, in the last tests, a
real worker against the fake control plane run for real. The real probe on a real GPU: `gpu`-marked.
"""

from __future__ import annotations

import time

import pytest

from agenthelpers import a100_mig, h100
from gpulayer.testing import wait_for


class Clock:
    def __init__(self):
        self.now = 1_000.0

    def __call__(self):
        return self.now


def stats_over(nvml, interval_s=2.0):
    from agent.gpu.stats import GpuStats
    from agent.gpu.inventory import detect

    inventory = detect(env={}, probe=nvml.devices)
    clock = Clock()
    return GpuStats(nvml, inventory.nvml_devices, lambda: interval_s, clock=clock), clock


def open_nvml():
    from agent.gpu.nvml import Nvml

    nvml = Nvml.open()
    assert nvml is not None
    return nvml


def test_a_heartbeat_carries_the_mean_utilization_and_the_peak_memory(fake_nvml):
    fake_nvml(gpus=[h100(0, utilization=20, memory_used_mb=1000), h100(1, utilization=0, memory_used_mb=0)])
    stats, clock = stats_over(open_nvml())
    stats.sample()
    fake_nvml(gpus=[h100(0, utilization=80, memory_used_mb=3000), h100(1, utilization=0, memory_used_mb=0)])
    clock.now += 1
    stats.sample()
    fake_nvml(gpus=[h100(0, utilization=50, memory_used_mb=2000), h100(1, utilization=0, memory_used_mb=0)])
    stats.sample()
    clock.now += 1
    sent = stats.take()
    assert sent == [
        {"index": 0, "at": 1002.0, "utilization_pct": 50.0, "memory_used_mb": 3000, "memory_total_mb": 81559},
        {"index": 1, "at": 1002.0, "utilization_pct": 0.0, "memory_used_mb": 0, "memory_total_mb": 81559},
    ]
    # Not answered yet: the next heartbeat carries them again, with the next interval's.
    stats.sample()
    again = stats.take()
    assert again[:2] == sent and len(again) == 4
    stats.sent(again)
    assert stats.take() == []  # answered, and nothing read since


def test_what_nvml_does_not_support_is_null_and_mig_instances_send_nothing(fake_nvml):
    fake_nvml(gpus=[h100(0, utilization=None, memory_used_mb=512), a100_mig(1), h100(2, memory_used_mb=None)])
    stats, _ = stats_over(open_nvml())
    stats.sample()
    by_index = {s["index"]: s for s in stats.take()}
    assert set(by_index) == {0, 3}  # the MIG instances (devices 1 and 2) are left out
    assert by_index[0]["utilization_pct"] is None and by_index[0]["memory_used_mb"] == 512
    assert by_index[3]["utilization_pct"] == 0.0 and by_index[3]["memory_used_mb"] is None


def test_a_lost_gpu_sends_nothing_and_the_others_go_on(fake_nvml):
    fake_nvml(gpus=[h100(0, utilization=10), h100(1, utilization=30)])
    stats, _ = stats_over(open_nvml())
    fake_nvml(gpus=[h100(0, lost=True), h100(1, utilization=30)])
    stats.sample()
    assert [s["index"] for s in stats.take()] == [1]


def test_unanswered_summaries_are_bounded_and_due_after_send_every(fake_nvml):
    from agent.gpu import stats as gpu_stats

    fake_nvml(gpus=[h100(0, utilization=5)])
    stats, clock = stats_over(open_nvml(), interval_s=2.0)
    for _ in range(gpu_stats.MAX_PENDING + 5):
        assert not stats.due() or clock.now - stats.pending[0]["at"] >= gpu_stats.SEND_EVERY * 2.0
        stats.sample()
        stats.take()
        clock.now += 2.0
    assert len(stats.pending) == gpu_stats.MAX_PENDING  # the oldest went first
    assert stats.due()
    stats.sent(stats.take())
    assert not stats.due()


def test_the_sampling_thread_reads_every_interval_and_stops(fake_nvml):
    fake_nvml(gpus=[h100(0, utilization=70, memory_used_mb=100)])
    stats, _ = stats_over(open_nvml(), interval_s=0.05)
    stats.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and stats.current.get(0) is None or stats.current[0].readings < 3:
        time.sleep(0.02)
    stats.stop()
    assert not stats.thread.is_alive()
    assert stats.take()[0]["utilization_pct"] == 70.0


def test_the_agent_sends_its_gpus_use_with_heartbeats(fake_nvml, plane, start_worker):
    """A real worker on the fake pynvml: the values the fake reports reach the heartbeats' `gpu_samples`;
    a heartbeat refused (400) does not send the same samples again."""
    fake_nvml(gpus=[h100(0, utilization=42, memory_used_mb=4096), h100(1, utilization=7, memory_used_mb=10)])
    bodies, refused = [], {"n": 1}
    route = plane.route

    def answering(method, path, body, token):
        if path == "/v1/worker/heartbeat" and body.get("gpu_samples"):
            bodies.append(body)
            if refused["n"]:
                refused["n"] -= 1
                return 400, {"error": {"code": "invalid_field", "message": "gpu_samples: no"}}
        return route(method, path, body, token)

    plane.route = answering
    worker = start_worker(gpu_probe=None, gpus=None)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(bodies) < 3:
        time.sleep(0.05)
    worker.stop()
    assert len(bodies) >= 3
    first, second = bodies[0]["gpu_samples"], bodies[1]["gpu_samples"]
    assert {(s["index"], s["utilization_pct"], s["memory_used_mb"], s["memory_total_mb"]) for s in first} == {
        (0, 42.0, 4096, 81559),
        (1, 7.0, 10, 81559),
    }
    assert not {s["at"] for s in first} & {s["at"] for s in second}  # the refused ones were not sent again
    assert all(s["at"] > time.time() - 60 for s in second)


def test_an_idle_agent_that_skips_its_beats_sends_its_samples_every_few_intervals(fake_nvml, plane, start_worker):
    """Against a server that renews leases on any request, an idle parked agent skips its beats, but not
    its samples: once the oldest is SEND_EVERY intervals old a beat carries them all (one per interval)."""
    from agent.gpu.stats import SEND_EVERY

    fake_nvml(gpus=[h100(0, utilization=1)])
    plane.heartbeat_terms = {"requests_renew_lease": True}
    start_worker(gpu_probe=None, gpus=None, acquire_wait_s=5)
    wait_for(lambda: len([b for b in plane.heartbeats if b.get("gpu_samples")]) >= 2, 20, "two beats with samples")
    carried = [b["gpu_samples"] for b in plane.heartbeats if b.get("gpu_samples")]
    assert len(carried[1]) >= SEND_EVERY  # the intervals of the beats it skipped, each its own sample
    assert [s["index"] for s in carried[1]] == [0] * len(carried[1])
    assert sorted(s["at"] for s in carried[1]) == [s["at"] for s in carried[1]]  # oldest first


@pytest.mark.gpu
def test_the_real_probe_reads_a_real_gpus_use():
    """On a machine with an NVIDIA GPU and its driver: the real pynvml's utilization and memory."""
    from agent.gpu.stats import GpuStats
    from agent.gpu.inventory import detect
    from agent.gpu.nvml import Nvml

    nvml = Nvml.open()
    if nvml is None:
        pytest.skip("no NVML here (no driver or no GPU)")
    try:
        inventory = detect(env={}, probe=nvml.devices)
        whole = [i for i, d in inventory.nvml_devices.items() if not d.mig]
        if not whole:
            pytest.skip("only MIG instances here")
        usage = nvml.usage(inventory.nvml_devices[whole[0]].gpu)
        assert usage is not None and usage.memory_total_mb and usage.memory_total_mb > 0
        assert usage.utilization_pct is None or 0 <= usage.utilization_pct <= 100
        stats = GpuStats(nvml, inventory.nvml_devices, lambda: 2.0)
        stats.sample()
        sent = stats.take()
        assert {s["index"] for s in sent} == set(whole)
        assert all(0 <= (s["memory_used_mb"] or 0) <= s["memory_total_mb"] for s in sent)
    finally:
        nvml.close()
