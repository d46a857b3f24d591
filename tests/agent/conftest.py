"""Fixtures for the agent tests: a fake control plane, a worker thread against it, and a fake pynvml."""

import importlib.util
import sys
import threading

import pytest

from agenthelpers import FAKE, RunningWorker
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
    worker.gpu_sharing = None  # no GPU sharing: no memory share to watch
    worker.launched = []
    worker._run_task = lambda runner: worker.launched.append(runner.task_id)

    def join():
        for thread in list(worker.threads.values()):
            thread.join(5)
    worker.join_launched = join
    return worker


@pytest.fixture
def fake_nvml(tmp_path, monkeypatch):
    """The fake pynvml in sys.modules, on a state file; returns a setter for the hardware's state."""
    spec = importlib.util.spec_from_file_location("pynvml", FAKE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    # The Xid thread's one wait between two looks at its stop event: a second in the agent, so each
    # stop() here would wait out a second of wall clock for nothing.
    monkeypatch.setattr("agent.gpu.health.XID_WAIT_S", 0.05)
    path = tmp_path / "nvml.json"
    monkeypatch.setenv("FAKE_NVML_STATE", str(path))
    state: dict = {"gpus": [], "xids": []}

    def set_state(**changes):
        state.update(changes)
        module.write_state(path, state)
        return state
    set_state()
    set_state.state = state
    return set_state
