"""Fixtures for the agent tests: a fake control plane and a worker thread against it."""

import threading

import pytest

from agenthelpers import RunningWorker
from fake_control_plane import JOIN, FakeControlPlane
from agent.worker import WorkerConfig


@pytest.fixture
def plane():
    fake = FakeControlPlane().start()
    yield fake
    fake.stop()


@pytest.fixture
def worker_config(plane, tmp_path):
    def make(**overrides):
        settings = dict(url=plane.url, join_token=JOIN, name="w1", state_dir=str(tmp_path / "state"),
                        artifact_cache=str(tmp_path / "cache"), kill_grace_s=1.0, acquire_wait_s=0.5,
                        gpu_probe=lambda: [], cpus=2, ram_mb=1024, keep_task_dirs=True)
        settings.update(overrides)
        return WorkerConfig(**settings)

    return make


@pytest.fixture
def start_worker(worker_config):
    workers = []

    def start(**overrides):
        worker = RunningWorker(worker_config(**overrides))
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop()


@pytest.fixture
def launch_only_worker(monkeypatch):
    """A Worker with only its launch bookkeeping (no control plane): runners are stubs, and each launched
    runner's task id lands in ``worker.launched`` instead of running."""
    import agent.session as module

    class Runner:
        def __init__(self, task, ctx, handle):
            self.task_id = handle.task_id

    monkeypatch.setattr(module, "TaskRunner", Runner)
    worker = module.Worker.__new__(module.Worker)
    worker.lock, worker.handles, worker.threads, worker.ended, worker.unanswered = threading.Lock(), {}, {}, {}, set()
    worker._session = module.Session(transport=None, inventory=None, ctx=None, new_transport=None)  # stub runners
    worker.beat_now = threading.Event()
    worker.launched = []
    worker._run_task = lambda runner: worker.launched.append(runner.task_id)

    def join():
        for thread in list(worker.threads.values()):
            thread.join(5)
    worker.join_launched = join
    return worker
