"""agent/gpu/sharing.py (issue 40, point 1): `--gpu-sharing` resolved (MPS without its daemon installed is
said and becomes whole GPUs), a fractional task's variables (MPS: thread percentage, pinned memory, the
daemon's folders; time-slice: its memory share), one MPS daemon per GPU started once and quit at close."""
from __future__ import annotations

import subprocess

import pytest

from agent.gpu.sharing import MPS_CONTROL, GpuSharing, MpsDaemons, resolve
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
