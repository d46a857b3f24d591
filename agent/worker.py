"""The worker: register, heartbeat, acquire, run tasks, stop cleanly.

``run_worker(WorkerConfig(...))`` is the entry point of ``gpulayer worker
start``, ``gpulayer join`` and ``python -m agent``. Three threads: the caller's
(signals, idle limit, shutdown), the heartbeat and the acquire loop; plus one
thread per running task. The worker's session with the control plane (`Worker`)
is in session.py, its settings (`WorkerConfig`, re-exported here) in config.py.
"""

import contextlib
import signal
import sys
import threading
import traceback

from .config import WorkerConfig
from .errors import AgentError
from .events import configure_logging, log_event
from .hardening import forget_join_token, make_undumpable
from .session import Worker


def run_worker(config: WorkerConfig, stop_event: threading.Event | None = None) -> int:
    """Run until stopped (SIGTERM/SIGINT when in main thread, or stop_event), return exit code.

    0 after a clean stop (signal, ``stop_event`` or ``max_idle_s``); 1 for an
    internal error; 2 for a configuration, token or protocol error; 3 when the
    control plane revoked the worker. A fatal error is printed as one line on stderr, never a traceback.
    """
    configure_logging()
    if not make_undumpable():  # before any task: they run as our user and could read our /proc files
        log_event("undumpable_unavailable", platform=sys.platform)
    forget_join_token()
    stop_event = stop_event or threading.Event()
    worker = Worker(config, stop_event)
    try:
        with _signals_stop(stop_event, worker.hurry):
            return worker.run()
    except AgentError as exc:
        worker.close()
        log_event("worker_exit", code=exc.exit_code, reason=str(exc))
        print(f"gpulayer worker: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:  # a bug: keep the trace in the log, one line for people
        worker.close()
        log_event("worker_crash", error=repr(exc), trace=traceback.format_exc())
        print(f"gpulayer worker: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


@contextlib.contextmanager
def _signals_stop(stop_event: threading.Event, hurry: threading.Event):
    """SIGTERM and SIGINT set ``stop_event``, a second one ``hurry`` (only possible from the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(*_) -> None:
        (hurry if stop_event.is_set() else stop_event).set()

    previous = {}
    for signum in (signal.SIGTERM, signal.SIGINT):
        previous[signum] = signal.signal(signum, on_signal)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
