"""What a job waits for, told while someone waits on it (`Job.wait(on_waiting=...)`, `submit --wait`).

The server says why a job is not running (its `waiting_reason`: no worker fits, the
workers that fit are busy, ...) and what a crash-looping service replica is doing
(each task's `restart_message`). `WaitingNotice` turns those into messages for
people: the first once the job has waited `WAITING_AFTER_S` without starting, then
one each time the message changes.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Optional

#: A job that starts within this many seconds is not worth a message.
WAITING_AFTER_S = 3.0

LOGGER = logging.getLogger("gpulayer")

OnWaiting = Callable[[str], object]


def waiting_message(job: dict) -> Optional[str]:
    """What `job` (the wire's Job) waits for now, in words; None when it waits for nothing.

    The job's waiting reason, then each replica of the current attempt that is
    between two runs after a crash ("replica 0: restart 4: exited with code 1;
    next run in 8 s").
    """
    parts = [str(job["waiting_reason"])] if job.get("waiting_reason") else []
    current = [t for t in job.get("tasks") or [] if t.get("attempt") == job.get("attempt")]
    for task in current:
        if task.get("restart_message") and task.get("state") == "running":
            parts.append(f"replica {task.get('index')}: {task['restart_message']}")
    return "; ".join(parts) or None


def log_waiting(message: str) -> None:
    """The default `on_waiting`: one INFO line on the `gpulayer` logger."""
    LOGGER.info("waiting: %s", message)


class WaitingNotice:
    """Calls `report(message)` once a job has waited `after` seconds, and again whenever the message changes.

    Feed it every fresh copy of the job with `update(job)`; `clock` is a
    parameter so tests can move time.
    """

    def __init__(self, report: Optional[OnWaiting] = None, after: float = WAITING_AFTER_S,
                 clock: Callable[[], float] = time.monotonic):
        self.report = report or log_waiting
        self.after = after
        self.clock = clock
        self.since = clock()
        self.last: Optional[str] = None

    def update(self, job: dict) -> Optional[str]:
        """Report the job's message if it is due and new; returns what was reported (None if nothing)."""
        message = waiting_message(job)
        if message is None:
            self.last = None
            return None
        if message == self.last or self.clock() - self.since < self.after:
            return None
        self.last = message
        self.report(message)
        return message


def failed_starts(job: dict) -> tuple[int, Optional[str]]:
    """The most restarts of a replica of the job's current attempt while none of them is up, and that
    replica's restart message ("restart 4: exited with code 127; next run in 8 s") or None."""
    current = [t for t in job.get("tasks") or [] if t.get("attempt") == job.get("attempt")]
    worst = max(current, key=lambda t: t.get("restarts") or 0, default=None)
    if worst is None:
        return 0, None
    return worst.get("restarts") or 0, worst.get("restart_message")
