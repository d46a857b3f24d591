"""agent/gpu/sharing.py (issue 40, point 1): `--gpu-sharing` resolved (MPS without its daemon installed is
said and becomes whole GPUs), a fractional task's variables (MPS: thread percentage, pinned memory, the
daemon's folders; time-slice: its memory share), one MPS daemon per GPU started once and quit at close."""
from __future__ import annotations

import subprocess

import pytest

from agent.gpu.sharing import MPS_CONTROL, GpuSharing, MpsDaemons, descends_from, resolve
from gpulayer.protocol.assignment import Assignment


def assignment(**fields) -> Assignment:
    return Assignment(task_id=1, job_id=1, command=["true"], **fields)


def test_resolve_says_why_mps_is_off_without_its_daemon():
    assert resolve("mps", which=lambda name: f"/usr/bin/{name}") == ("mps", None)
    mode, why = resolve("mps", which=lambda name: None)
    assert mode == "off" and MPS_CONTROL in why and "whole GPUs" in why
    assert resolve("time-slice", which=lambda name: None) == ("time-slice", None)
    with pytest.raises(ValueError, match="no sharing mode"):
        resolve("shared")


class Recorder:
    def __init__(self):
        self.calls: list[tuple[list[str], dict, bytes | None]] = []

    def __call__(self, argv, env=None, input=None, **_):
        self.calls.append((argv, env, input))
        return subprocess.CompletedProcess(argv, 0)


def test_an_mps_task_gets_its_share_and_the_daemon_of_its_gpu(tmp_path):
    run = Recorder()
    mps = MpsDaemons(["GPU-a", "GPU-b"], root=tmp_path, run=run)
    sharing = GpuSharing("mps", 81920, mps)
    env = sharing.environment(assignment(gpus=[1], gpu_share=0.25, gpu_fraction=0.25))
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "1" / "pipe")
    assert env["GPULAYER_GPU_MEMORY_LIMIT_MB"] == "20480"
    # a memory share alone: its memory, and its share of the GPU as the compute share
    env = sharing.environment(assignment(gpus=[1], gpu_share=0.5, gpu_memory_mb=40960))
    assert (env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]) == ("50", "0=40960M")
    started = [(argv, e["CUDA_VISIBLE_DEVICES"]) for argv, e, _ in run.calls]
    assert started == [([MPS_CONTROL, "-d"], "GPU-b")]  # once for GPU 1, however many tasks
    mps.close()
    assert run.calls[-1][0] == [MPS_CONTROL] and run.calls[-1][2] == b"quit\n"


def test_whole_gpus_and_workers_that_do_not_share_add_nothing(tmp_path):
    run = Recorder()
    assert GpuSharing("mps", 81920, MpsDaemons(["0"], root=tmp_path, run=run)).environment(
        assignment(gpus=[0])) == {}
    assert GpuSharing("off", 81920).environment(assignment(gpus=[0], gpu_share=0.5)) == {}
    assert run.calls == []


def test_time_slice_gives_the_memory_share_only():
    env = GpuSharing("time-slice", 0).environment(assignment(gpus=[0], gpu_share=0.5, gpu_memory_mb=1000))
    assert env == {"GPULAYER_GPU_SHARE": "0.5", "GPULAYER_GPU_MEMORY_LIMIT_MB": "1000"}


class Handle:
    def __init__(self, task_id, pid, gpus, limit):
        self.task_id, self.gpu_memory_limit_mb, self.over_share = task_id, limit, None
        self.process = type("P", (), {"pid": pid})()
        self.assignment = {"gpus": gpus}


class Nvml:
    def __init__(self, used: dict[int, dict[int, int]]):
        self.used, self.asked = used, []

    def process_memory(self, gpu):
        self.asked.append(gpu)
        return self.used.get(gpu)


def test_time_slicing_stops_a_task_over_its_memory_share_as_nvml_counts_its_processes():
    tree = {11: 10, 12: 11, 21: 20}  # pid -> parent: 11 and 12 are task 10's, 21 task 20's
    sharing = GpuSharing("time-slice", 81920, nvml_gpus={0: 3}, descends=lambda pid, root: _under(tree, pid, root))
    assert sharing.enforced_limit_mb(assignment(gpus=[0], gpu_share=0.25)) == 20480
    assert GpuSharing("mps", 81920).enforced_limit_mb(assignment(gpus=[0], gpu_share=0.25)) is None
    over, within = Handle(1, 10, [0], 1000), Handle(2, 20, [0], 1000)
    nvml = Nvml({3: {11: 600, 12: 500, 21: 900, 99: 50000}})
    sharing.watch_memory(nvml, [over, within])
    assert nvml.asked == [3]  # NVML's index of device 0, read once for both
    assert over.over_share.startswith("GPU memory share exceeded: its processes use 1100 MiB of GPU 0, its share "
                                      "is 1000 MiB")
    assert within.over_share is None


def _under(tree: dict[int, int], pid: int, root: int) -> bool:
    while pid in tree or pid == root:
        if pid == root:
            return True
        pid = tree[pid]
    return False


def test_descends_from_reads_parents_from_proc(tmp_path):
    for pid, parent in ((5, 1), (6, 5), (7, 6)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (sh (x)) S {parent} {pid} {pid} 0")
    assert descends_from(7, 5, proc=str(tmp_path)) and descends_from(5, 5, proc=str(tmp_path))
    assert not descends_from(5, 6, proc=str(tmp_path)) and not descends_from(8, 5, proc=str(tmp_path))
