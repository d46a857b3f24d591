"""Helpers the agent tests import by name (a module of its own: `from conftest import ...` would find
whichever folder's conftest.py came first on sys.path when several folders run in one pytest call)."""

import threading
from pathlib import Path

from agent.worker import run_worker

FAKE = Path(__file__).parent / "fake_nvml" / "pynvml.py"


def h100(n: int, **extra) -> dict:
    return {"name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{n}", "mig_supported": True, "mig": None,
            "ecc_uncorrected": 0, "remap_failed": False, **extra}


def a100_mig(n: int, profiles=("1g.10gb", "3g.40gb")) -> dict:
    return h100(n, name="NVIDIA A100-SXM4-80GB",
                mig=[{"profile": p, "uuid": f"MIG-{n}-{i}", "gi": i + 1} for i, p in enumerate(profiles)])


class RunningWorker:
    """run_worker in a thread; ``stop()`` sets its stop event and returns the exit code."""

    def __init__(self, config):
        self.stop_event = threading.Event()
        self.code = None
        self.thread = threading.Thread(target=self._run, args=(config,), daemon=True)
        self.thread.start()

    def _run(self, config):
        self.code = run_worker(config, self.stop_event)

    def stop(self, timeout=30):
        self.stop_event.set()
        return self.wait(timeout)

    def wait(self, timeout=30):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the worker did not stop"
        return self.code
