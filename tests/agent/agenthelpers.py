"""Helpers the agent tests import by name (a module of its own: `from conftest import ...` would find
whichever folder's conftest.py came first on sys.path when several folders run in one pytest call)."""

import threading

from agent.worker import run_worker


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
