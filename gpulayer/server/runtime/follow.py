"""Log long-polls: followers of a job's log wait here until lines arrive or the job ends."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from gpulayer.server.scheduler.views import log_page
from gpulayer.server.store.db import Store

RECHECK_S = 1.0  # a follower looks again at least this often, even if no wake-up reached it


class LogFollowers:
    """Parks log long-polls and wakes them when lines are written or a job may have ended."""

    def __init__(self, store: Store, max_parked: int):
        self.store = store
        self._cond = threading.Condition()
        self._parked = threading.BoundedSemaphore(max(1, max_parked))
        self._waiting = 0  # followers inside self._cond.wait(): what written() reaches now

    @property
    def parked(self) -> int:
        """How many log long-polls wait on new lines now (written() reaches each of them)."""
        with self._cond:
            return self._waiting

    def written(self) -> None:
        """Wake the followers: lines arrived, or a job may have ended."""
        with self._cond:
            self._cond.notify_all()

    def wait(self, job_id: int, after: int, limit: int, wait_s: float, index: int | None = None,
             check: Callable[[], object] | None = None) -> tuple[list[dict], bool, bool]:
        """Log lines after `after` (of the element, replica or rank `index` alone, if given), whether the job
        (element) had ended with them its last (views.log_page), and whether the call could wait.

        With wait_s, long-polls until some arrive or the job has ended. Each
        waiting call holds a server thread, so at most `max_parked` wait at
        once; past that the lines so far come back at once, with False.
        `check` runs after each wait, before lines are read again, and raises
        once the caller may no longer read them (its user removed, its token
        revoked: auth.invalidate() wakes every follower for that). Raises
        NotFound when there is no such job (or element).
        """
        deadline = time.monotonic() + wait_s
        parked = False
        try:
            while True:
                # Lines and whether the job had ended in one snapshot: a job's last line comes before
                # its finish, and a follower must not wait out its whole wait_s for lines that will never come.
                lines, ended = self.store.read(log_page, job_id, after, limit, index)
                remaining = deadline - time.monotonic()
                if lines or remaining <= 0 or ended:
                    return lines, ended, True
                if not parked:
                    parked = self._parked.acquire(blocking=False)
                    if not parked:
                        return lines, ended, False
                with self._cond:
                    self._waiting += 1
                    try:
                        self._cond.wait(min(remaining, RECHECK_S))
                    finally:
                        self._waiting -= 1
                if check is not None:
                    check()
        finally:
            if parked:
                self._parked.release()
