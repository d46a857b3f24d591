"""The cascade steps still to run, and who runs them: the call that set them off for a few, then a thread.

What a step is, how a transaction asks for one (`follow`) and why cascades exist: scheduler/cascades.py. The
queue here is memory only; what is left to do can be read from the state file, so a restart loses nothing
(Scheduler.resume_cascades). Each step runs in a write of its own through the writer callable the
scheduler's facade hands in.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable, Iterable

import apsw

from gpulayer.server.errors import GpulayerError
from gpulayer.server.scheduler.cascades import INLINE_STEPS, Step, collecting

log = logging.getLogger("gpulayer.server.scheduler.cascades")  # the name its lines have always had


class Cascades:
    """The steps still to run, and who runs them: the calling thread for a few, then a thread of its own.

    `write(fn)` is the store's writer (Store.write, handed in by the facade); `run_step(conn, now, step)` is
    outcomes.run_step; a step's follow-ups are what it asked for. A
    step whose write fails (a full disk, a closed store) is kept and tried again at `resume` (upkeep,
    each tick); one that runs twice changes nothing the second time.
    """

    def __init__(self, write: Callable, run_step: Callable, clock: Callable[[], float],
                 after_step: Callable[[], None] = lambda: None):
        self._write, self._run_step, self.clock, self._after_step = write, run_step, clock, after_step
        self._changed = threading.Condition()   # guards what follows; notified when a step ends
        self._queue: collections.deque[Step] = collections.deque()
        self._queued: set[Step] = set()
        self._running: set[Step] = set()       # taken by some thread, not ended yet
        self._thread: threading.Thread | None = None
        self.steps_run = 0        # writes run so far (benchmarks and tests read it)

    def pending(self) -> int:
        with self._changed:
            return len(self._queue)

    def add(self, steps: Iterable[Step]) -> None:
        with self._changed:
            self._add(steps)

    def _add(self, steps: Iterable[Step]) -> None:
        for step in steps:
            if step not in self._queued:
                self._queued.add(step)
                self._queue.append(step)

    def drive(self, steps: Iterable[Step], until_ended: int | None = None, inline: int = INLINE_STEPS) -> None:
        """Queue `steps`, run up to `inline` of the queue here, and every step of job `until_ended` until
        it has none left (waiting for one that another thread runs); leave the rest to the thread."""
        self.add(steps)
        done = 0
        while True:
            step = self._take() if done < inline else None
            if step is None and until_ended is not None:
                step = self._take_of(until_ended)
            if step is None or not self._run(step):
                break
            done += 1
        self.resume()

    def resume(self) -> None:
        """Start the thread when steps are left and it does not run (upkeep calls this each tick)."""
        with self._changed:
            if not self._queue or self._thread is not None:
                return
            self._thread = threading.Thread(target=self._drain, name="gpulayer-cascades", daemon=True)
            self._thread.start()

    def join(self, timeout: float = 60.0) -> None:
        """Wait until the thread has run every step, or stopped at a failed one (tests, benchmarks, tools)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._changed:
                thread = self._thread
            if thread is None:
                return
            thread.join(max(0.0, deadline - time.monotonic()))

    def _take(self) -> Step | None:
        with self._changed:
            if not self._queue:
                return None
            return self._claim(self._queue.popleft())

    def _take_of(self, job_id: int) -> Step | None:
        """A step of job `job_id`; while only another thread runs one, wait for it; None when it has none."""
        with self._changed:
            while True:
                step = next((s for s in self._queue if s[1] == job_id), None)
                if step is not None:
                    self._queue.remove(step)
                    return self._claim(step)
                if not any(s[1] == job_id for s in self._running):
                    return None
                self._changed.wait(1.0)

    def _claim(self, step: Step) -> Step:
        self._queued.discard(step)
        self._running.add(step)
        return step

    def _drain(self) -> None:
        while True:
            with self._changed:
                if not self._queue:
                    self._thread = None  # under the lock: a step added from now on starts a new thread
                    return
            step = self._take()
            if step is not None and not self._run(step):
                with self._changed:
                    self._thread = None  # the failed step is kept: the next resume starts again
                return

    def _run(self, step: Step) -> bool:
        """One step in a write of its own; its follow-ups queued. False (the step kept) when the write failed."""
        def write(conn: apsw.Connection):
            with collecting() as noted:
                self._run_step(conn, self.clock(), step)
            return noted
        try:
            follow_ups, ran = self._write(write), True
        except Exception as exc:  # noqa: BLE001 - a full disk, a closed store: tried again at the next resume
            log.warning("cascade_step_failed step=%s error=%s", step,
                        exc.code if isinstance(exc, GpulayerError) else repr(exc))
            follow_ups, ran = [step], False
        with self._changed:
            self._running.discard(step)
            self._add(follow_ups)
            self._changed.notify_all()
        if ran:
            self.steps_run += 1
            self._after_step()
        return ran
