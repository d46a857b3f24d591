"""Cascades: the big changes a job's end sets off, as a run of small writes instead of one long one.

Cancelling a 100,000-element array, or ending the one job that sixteen such
arrays wait on, changes millions of task rows. In one transaction that holds
the state file's only writer for seconds, and every heartbeat waits behind it
(issue 22). So such a change is cut into steps (scheduler/outcomes.py: `end`
a batch of a job's tasks, `settle` a batch of the jobs waiting on one that
ended, `release` a batch of a job's held tasks, `insert` a batch of a big
array's elements), each one write of at most
`outcomes.BATCH` task rows or `outcomes.FANOUT` jobs, and the writer serves
others between two steps.

Every step leaves the state file consistent, and what is left to do can be
read from it (query `cascades_pending`): a job being cancelled keeps its
state and has its `reason` set (no active job has one otherwise) until its
last task ended; a waiting job whose dependency ended is still waiting. So a
control plane that stops between two steps finishes them after its restart.

A transaction function asks for a next step with `follow`; the scheduler's
`Cascades` (one per Scheduler) runs them: the call that set the cascade off
runs its first `INLINE_STEPS` (and those of the job it cancelled, to its
end), a thread runs the rest. Called with no collector (a direct
`store.write`, as tools and some tests do), the steps run at once, in the
same transaction, as before.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterable, Iterator

import apsw

from gpulayer.server.errors import GpulayerError

log = logging.getLogger("gpulayer.server.scheduler.cascades")
INLINE_STEPS = 200  # steps the call that set a cascade off runs itself (1-5 ms each), before the thread

#: A step still to run: (kind, job id, argument), kind one of outcomes.STEPS.
Step = tuple[str, int, int]
_NOTED: ContextVar[list[Step] | None] = ContextVar("gpulayer_cascade_steps", default=None)


def follow(step: Step) -> bool:
    """Ask for `step` to run in a write of its own; False when nothing collects steps (run it now)."""
    noted = _NOTED.get()
    if noted is None:
        return False
    noted.append(step)
    return True


@contextmanager
def collecting() -> Iterator[list[Step]]:
    """Within it, `follow` collects the steps asked for (in the context Store.write copies to the writer)."""
    noted: list[Step] = []
    token = _NOTED.set(noted)
    try:
        yield noted
    finally:
        _NOTED.reset(token)


class Cascades:
    """The steps still to run, and who runs them: the calling thread for a few, then a thread of its own.

    `run_step(conn, now, step)` is outcomes.run_step; a step's follow-ups are what it asked for. A
    step whose write fails (a full disk, a closed store) is kept and tried again at `resume` (upkeep,
    each tick); one that runs twice changes nothing the second time.
    """

    def __init__(self, store, run_step: Callable, clock: Callable[[], float],
                 after_step: Callable[[], None] = lambda: None):
        self.store, self._run_step, self.clock, self._after_step = store, run_step, clock, after_step
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
            follow_ups, ran = self.store.write(write), True
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
