"""Task log lines to the control plane: numbered, batched, retried, never duplicated.

Every line of a task attempt (stdout, stderr and the agent's own ``system``
lines) gets ``n``, counted from 0. A flusher thread sends what is pending
every ``interval_s`` or as soon as ``batch_lines`` are waiting; it starts
with the first line, so a task that prints nothing until it ends costs no
thread (its last lines ride along with the finish). A batch that
fails to send stays pending and is sent again with the same numbers, so the
server (which keeps one line per task and ``n``) never stores a line twice.
"""

import threading
import time
from typing import Callable

from ..errors import Rejected, Unreachable
from ..events import log_event

BATCH_LINES = 500
FLUSH_INTERVAL_S = 0.2
#: Lines kept while the control plane is away; beyond this, lines are counted
#: and dropped, and a system line says how many.
MAX_PENDING_LINES = 200_000

#: Sends one batch; raises Unreachable to be retried, Rejected to be dropped.
Sender = Callable[[list[dict]], None]


class LogShipper:
    """Numbers lines and ships them in batches from a background thread."""

    def __init__(
        self,
        send: Sender,
        batch_lines: int = BATCH_LINES,
        interval_s: float = FLUSH_INTERVAL_S,
        max_pending: int = MAX_PENDING_LINES,
        clock: Callable[[], float] = time.time,
        retry_wait_s: float = 1.0,
        first_n: int = 0,
    ):
        self._send = send
        self.batch_lines = batch_lines
        self.interval_s = interval_s
        self.max_pending = max_pending
        self.retry_wait_s = retry_wait_s
        self._clock = clock
        self._pending: list[dict] = []
        self._next_n = first_n  # a run after a preemption goes on from the lines stored before
        self._dropped = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._armed = False
        self._thread: threading.Thread | None = None

    def add(self, stream: str, text: str) -> None:
        """Queue one line of ``stream`` ("stdout", "stderr" or "system")."""
        with self._lock:
            if len(self._pending) >= self.max_pending:
                self._dropped += 1
                return
            if self._dropped:
                self._append("system", f"{self._dropped} log lines dropped while the control plane was unreachable")
                self._dropped = 0
            self._append(stream, text)
            if len(self._pending) >= self.batch_lines:
                self._wake.set()
            if self._armed and self._thread is None and not self._closing:
                self._start_thread()

    def system(self, text: str) -> None:
        """Queue a line written by the agent itself."""
        self.add("system", text)

    def _append(self, stream: str, text: str) -> None:
        self._pending.append({"stream": stream, "text": text, "at": self._clock(), "n": self._next_n})
        self._next_n += 1

    def flush_once(self) -> bool:
        """Send up to one batch; True when the batch went (or there was none)."""
        with self._lock:
            batch = self._pending[: self.batch_lines]
        if not batch:
            return True
        try:
            self._send(batch)
        except Unreachable:
            return False
        except Rejected as exc:
            log_event("task_logs_rejected", lines=len(batch), first_n=batch[0]["n"], error=str(exc))
        with self._lock:
            del self._pending[: len(batch)]
        return True

    def flush(self, deadline: float | None = None) -> bool:
        """Send everything pending; False if ``deadline`` (monotonic) passed first."""
        while True:
            with self._lock:
                if not self._pending:
                    return True
            if not self.flush_once():
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                time.sleep(self.retry_wait_s)

    def _run(self) -> None:
        while not self._closing:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            while not self._closing and self._pending and self.flush_once():
                if len(self._pending) < self.batch_lines:
                    break
            if self._pending and not self._closing:
                self._wake.wait(self.retry_wait_s)

    def start(self) -> "LogShipper":
        """Run the background flusher from the first line on (at once if lines are waiting)."""
        with self._lock:
            self._armed = True
            if self._pending and self._thread is None and not self._closing:
                self._start_thread()
        return self

    def _start_thread(self) -> None:
        self._thread = threading.Thread(target=self._run, name="log-shipper", daemon=True)
        self._thread.start()

    def _stop_thread(self) -> None:
        with self._lock:
            self._closing = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join()

    def close_keeping_tail(self, deadline: float | None = None, last_line: str | None = None) -> list[dict]:
        """Stop the flusher and send all but the last batch; returns that batch, to ride along with finish.

        ``last_line``, a system line, is added after the flusher stopped (it never starts one).
        """
        self._stop_thread()
        if last_line is not None:
            self.system(last_line)
        while True:
            with self._lock:
                if len(self._pending) <= self.batch_lines:
                    tail, self._pending = self._pending, []
                    return tail
            if not self.flush_once():
                if deadline is not None and time.monotonic() >= deadline:
                    with self._lock:
                        tail, self._pending = self._pending[-self.batch_lines:], []
                    return tail
                time.sleep(self.retry_wait_s)

    def close(self, deadline: float | None = None) -> bool:
        """Stop the flusher and send what is left; False if lines could not be sent."""
        self._stop_thread()
        return self.flush(deadline)
