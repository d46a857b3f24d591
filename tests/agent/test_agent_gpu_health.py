"""agent/gpu/nvml.py and agent/gpu/health.py over a fake pynvml (tests/agent/fake_nvml): inventory, MIG, health.

Only `pynvml` is replaced; agent/gpu/nvml.py, the watcher and the inventory run for real.
"""
from __future__ import annotations

import time

import pytest

from agenthelpers import a100_mig, h100

@pytest.fixture
def fake(fake_nvml):
    return fake_nvml


def open_nvml():
    from agent.gpu.nvml import Nvml
    nvml = Nvml.open()
    assert nvml is not None
    return nvml


def watcher(nvml, devices):
    from agent.gpu.health import GpuHealth
    changed = []
    health = GpuHealth(nvml, devices, on_change=lambda: changed.append(1))
    return health, changed


def test_whole_gpus_inventory(fake):
    from agent.gpu.inventory import detect, nvml_probe
    fake(gpus=[h100(0), h100(1)])
    inv = detect(env={}, probe=nvml_probe)
    assert inv.gpus == 2 and inv.gpu_models == ["NVIDIA H100 80GB HBM3"] * 2 and inv.device_ids == ["0", "1"]
    assert [d.uuid for d in inv.nvml_devices.values()] == ["GPU-0", "GPU-1"]


def test_mig_inventory_is_its_instances(fake):
    from agent.run.environment import cuda_visible_devices
    from agent.gpu.inventory import detect, nvml_probe
    fake(gpus=[a100_mig(0), h100(1, mig_supported=False)])
    inv = detect(env={}, probe=nvml_probe)
    assert inv.gpus == 3
    assert inv.gpu_models == ["1g.10gb", "3g.40gb", "NVIDIA H100 80GB HBM3"]
    assert inv.device_ids == ["MIG-0-0", "MIG-0-1", "GPU-1"]  # CUDA reaches a MIG instance by UUID only
    assert cuda_visible_devices([1], inv.device_ids) == "MIG-0-1"
    assert inv.nvml_devices[0].mig and inv.nvml_devices[0].parent_uuid == "GPU-0"
    assert inv.nvml_devices[1].gpu_instance == 2


def test_mig_capable_but_off_is_one_gpu(fake):
    from agent.gpu.inventory import detect, nvml_probe
    fake(gpus=[h100(0, mig_supported=True, mig=None)])
    nvml = open_nvml()
    assert nvml.mig_mode(("gpu", 0)) == "disabled"
    nvml.close()
    assert detect(env={}, probe=nvml_probe).device_ids == ["0"]


def test_workers_visible_devices_map_to_nvml(fake):
    from agent.gpu.inventory import detect, nvml_probe
    fake(gpus=[h100(0), h100(1), h100(2)])
    inv = detect(env={"CUDA_VISIBLE_DEVICES": "2,GPU-0"}, probe=nvml_probe)
    assert inv.device_ids == ["2", "GPU-0"]
    assert [inv.nvml_devices[i].uuid for i in (0, 1)] == ["GPU-2", "GPU-0"]


def test_no_driver_means_no_devices(fake):
    from agent.gpu.inventory import nvml_probe
    from agent.gpu.nvml import Nvml
    fake(init_error=True)
    assert Nvml.open() is None and nvml_probe() == []


def test_xid_marks_its_gpu_application_xids_do_not(fake):
    fake(gpus=[h100(0), h100(1)])
    nvml = open_nvml()
    from agent.gpu.inventory import detect
    inv = detect(env={}, probe=nvml.devices)
    health, changed = watcher(nvml, inv.nvml_devices)
    health.start()
    try:
        fake(xids=[{"uuid": "GPU-1", "xid": 13}, {"uuid": "GPU-1", "xid": 31}, {"uuid": "GPU-1", "xid": 79}])
        deadline = time.monotonic() + 10
        while not changed and time.monotonic() < deadline:
            time.sleep(0.05)
        assert health.report() == [
            {"index": 0, "uuid": "GPU-0", "healthy": True, "reason": None},
            {"index": 1, "uuid": "GPU-1", "healthy": False, "reason": "Xid 79"}]
        assert changed == [1]
    finally:
        health.stop()
        nvml.close()


def test_xid_of_unknown_device_marks_every_gpu(fake):
    from agent.gpu.nvml import Xid
    fake(gpus=[h100(0), h100(1)])
    nvml = open_nvml()
    from agent.gpu.inventory import detect
    health, _ = watcher(nvml, detect(env={}, probe=nvml.devices).nvml_devices)
    health.on_xid(Xid(xid=48, uuid=None))
    assert [g["healthy"] for g in health.report()] == [False, False]
    health.on_xid(Xid(xid=63, uuid=None))
    assert [g["reason"] for g in health.report()] == ["Xid 48", "Xid 48"]  # the first fault is kept
    nvml.close()


def test_mig_xid_marks_its_instance_or_the_whole_gpu(fake):
    from agent.gpu.nvml import Xid
    fake(gpus=[a100_mig(0, ("1g.10gb", "1g.10gb", "2g.20gb"))])
    nvml = open_nvml()
    from agent.gpu.inventory import detect
    health, _ = watcher(nvml, detect(env={}, probe=nvml.devices).nvml_devices)
    health.on_xid(Xid(xid=94, uuid="GPU-0", gpu_instance=2))
    assert [g["healthy"] for g in health.report()] == [True, False, True]
    health.on_xid(Xid(xid=79, uuid="GPU-0"))
    assert [g["healthy"] for g in health.report()] == [False, False, False]
    nvml.close()


def test_event_wait_through_nvml_for_mig(fake):
    fake(gpus=[a100_mig(0)], xids=[{"uuid": "GPU-0", "xid": 94, "gi": 2}, {"uuid": "GPU-9", "xid": 79}])
    nvml = open_nvml()
    events = nvml.xid_events([0])
    first, second = events.wait(1), events.wait(1)
    assert (first.xid, first.uuid, first.gpu_instance) == (94, "GPU-0", 2)
    assert (second.xid, second.uuid) == (79, None)
    assert events.wait(0.1) is None  # a timeout is no event
    events.close()
    nvml.close()


@pytest.mark.parametrize("change, reason", [
    ({"ecc_uncorrected": 3}, "3 uncorrectable ECC errors"),
    ({"remap_failed": True}, "row remapping failed (remapped-row failure)"),
    ({"remap_pending": True}, "row remap pending (needs a GPU reset)"),
    ({"retire_pending": True, "remap_failed": None}, "memory pages pending retirement (needs a GPU reset)"),
    ({"lost": True}, "does not answer NVML (GPU is lost)"),
    ({"temperature": False, "remap_pending": True}, "row remap pending (needs a GPU reset)"),
])
def test_periodic_checks(fake, change, reason):
    fake(gpus=[h100(0), h100(1)])
    nvml = open_nvml()
    from agent.gpu.inventory import detect
    health, changed = watcher(nvml, detect(env={}, probe=nvml.devices).nvml_devices)
    health.start()
    try:
        health.check()
        assert all(g["healthy"] for g in health.report())
        fake(gpus=[h100(0, **change), h100(1)])
        health.check()
        assert health.report()[0] == {"index": 0, "uuid": "GPU-0", "healthy": False, "reason": reason}
        assert health.report()[1]["healthy"] and changed == [1]
    finally:
        health.stop()
        nvml.close()


@pytest.mark.parametrize("before, reason", [
    ({"ecc_uncorrected": 2}, "2 uncorrectable ECC errors"),
    ({"remap_pending": True}, "row remap pending (needs a GPU reset)"),
])
def test_a_fault_from_before_the_agent_started_still_counts(fake, before, reason):
    """An agent restarted after an uncorrectable error reads the GPU unhealthy: the volatile count and
    a pending row remap clear only with a GPU reset (or a driver reload), not with the agent."""
    fake(gpus=[h100(0, **before), h100(1)])
    nvml = open_nvml()
    from agent.gpu.inventory import detect
    health, _ = watcher(nvml, detect(env={}, probe=nvml.devices).nvml_devices)
    health.start()
    try:
        assert health.report()[0] == {"index": 0, "uuid": "GPU-0", "healthy": False, "reason": reason}
        assert health.report()[1]["healthy"]
    finally:
        health.stop()
        nvml.close()


def test_reset_forgets_and_counts_ecc_from_then(fake):
    fake(gpus=[h100(0)])
    nvml = open_nvml()
    from agent.gpu.inventory import detect
    health, _ = watcher(nvml, detect(env={}, probe=nvml.devices).nvml_devices)
    health.start()
    fake(gpus=[h100(0, ecc_uncorrected=1)])
    health.check()
    assert not health.report()[0]["healthy"]
    health.reset([0])
    health.check()
    assert health.report()[0]["healthy"]  # the old errors no longer count
    health.stop()
    nvml.close()


def test_ecc_off_and_events_unsupported_still_watch(fake):
    fake(gpus=[h100(0, ecc_uncorrected=None, remap_failed=None, events=False)])
    nvml = open_nvml()
    from agent.gpu.inventory import detect
    health, _ = watcher(nvml, detect(env={}, probe=nvml.devices).nvml_devices)
    health.start()
    assert health.thread is not None  # the set exists; this GPU only gives no Xid events
    health.check()
    assert health.report()[0]["healthy"]
    health.stop()
    nvml.close()


def test_no_nvml_no_watch():
    from agent.gpu.health import GpuHealth
    health = GpuHealth(None, {})
    health.start()
    health.check()
    assert health.report() == [] and health.thread is None


def test_a_gpu_lost_before_start_is_left_out(fake):
    from agent.gpu.inventory import detect, nvml_probe
    fake(gpus=[h100(0, lost=True), h100(1)])
    inv = detect(env={}, probe=nvml_probe)
    assert inv.gpus == 1 and inv.nvml_devices[0].uuid == "GPU-1" and inv.nvml_devices[0].gpu == 1
    assert inv.device_ids == ["GPU-1"]  # CUDA's device 0 may be either: the UUID says which


def test_a_count_nvml_cannot_give_means_no_devices(fake):
    from agent.gpu.inventory import nvml_probe
    fake(gpus=[h100(0)], count_error=True)
    assert nvml_probe() == []


def test_what_a_gpu_does_not_support_is_no_fault(fake):
    fake(gpus=[h100(0, temperature=False, remap_failed=None, retire_pending=None, ecc_uncorrected=None)])
    nvml = open_nvml()
    assert nvml.problem(0) is None and nvml.ecc_uncorrected(0) is None
    nvml.close()


def test_without_an_event_set_the_checks_still_run(fake):
    fake(gpus=[h100(0)], event_set_error=True)
    nvml = open_nvml()
    from agent.gpu.inventory import detect
    health, _ = watcher(nvml, detect(env={}, probe=nvml.devices).nvml_devices)
    health.start()
    assert health.thread is None
    fake(gpus=[h100(0, remap_failed=True)], event_set_error=True)
    health.check()
    assert not health.report()[0]["healthy"]
    nvml.close()


def test_a_failing_event_wait_ends_the_watch_not_the_checks(fake):
    fake(gpus=[h100(0)], xids=[{"uuid": "GPU-0", "xid": 79, "type": 1}, {"error": 999}])
    nvml = open_nvml()
    from agent.gpu.inventory import detect
    health, changed = watcher(nvml, detect(env={}, probe=nvml.devices).nvml_devices)
    health.start()
    health.thread.join(10)
    assert not health.thread.is_alive() and changed == []  # an event of another type is no Xid
    fake(gpus=[h100(0, lost=True)], xids=[])
    health.check()
    assert health.report()[0]["reason"] == "does not answer NVML (GPU is lost)"
    health.stop()
    nvml.close()


def test_the_agent_echoes_a_reset_until_an_answer_is_heard(fake, plane, start_worker):
    """A real worker on the fake pynvml: a reset told in an answer is echoed (`reset_applied`) in the
    next heartbeats until one of them is answered; an answer lost on the way is sent again."""
    fake(gpus=[h100(0, ecc_uncorrected=1), h100(1)])  # GPU 0's uncorrectable error predates the agent
    sent, lost = [], {"echo": 1}
    route = plane.route

    def answering(method, path, body, token):
        if path != "/v1/worker/heartbeat" or not body.get("gpus"):
            return route(method, path, body, token)
        sent.append(body["gpus"])
        echoed = any(g.get("reset_applied") for g in body["gpus"])
        if echoed and lost["echo"]:
            lost["echo"] -= 1  # the answer to the first echo is lost: the agent must echo again
            return 503, {"error": {"code": "unavailable", "message": "down"}}
        status, answer = route(method, path, body, token)
        if not echoed and not body["gpus"][0]["healthy"]:  # the control plane tells the reset until heard
            answer["reset_gpus"] = [0]
        return status, answer
    plane.route = answering
    worker = start_worker(gpu_probe=None, gpus=None)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (sent and any(g[0].get("reset_applied") for g in sent)
                                               and "reset_applied" not in sent[-1][0]):
        time.sleep(0.05)
    worker.stop()
    register = plane.registrations[0]["gpus"]
    assert register[0]["healthy"] is False and register[1]["healthy"] is True
    echoes = [i for i, g in enumerate(sent) if g[0].get("reset_applied")]
    assert len(echoes) >= 2 and echoes[1] == echoes[0] + 1  # the lost one, then again
    assert all(sent[i][0]["healthy"] for i in echoes)  # the fault forgotten, ECC counted from the reset
    after = sent[echoes[-1] + 1:]
    assert after and all(not g[0].get("reset_applied") and g[0]["healthy"] for g in after)  # heard: echoed no more
    assert all("reset_applied" not in g[1] for g in sent)
