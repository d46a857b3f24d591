"""The pool of read connections: the last one given back is the next one taken (its pages are warm).

A take that finds one free costs a list pop (atomic under the GIL), not the
two conditions of a `queue.LifoQueue` get and put: every heartbeat, token
lookup and read takes one and gives it back. Only a take that finds none
free waits, on a condition, until one is given back or its timeout passes.
"""
from __future__ import annotations

import threading
import time
from typing import Generic, TypeVar

T = TypeVar("T")


class ReaderPool(Generic[T]):
    """Connections lent one at a time; `take` waits up to `timeout` seconds for one to be given back."""

    def __init__(self, items: list[T]):
        self._free = list(items)
        self._cond = threading.Condition(threading.Lock())
        self._waiters = 0   # takes between their count and their leaving: a give wakes one when any

    def take(self, timeout: float) -> T | None:
        """A free connection (last given back first), or None when none was given back within `timeout`."""
        try:
            return self._free.pop()
        except IndexError:
            pass
        deadline = time.monotonic() + timeout
        with self._cond:
            # Counted before the pop below: a give whose append that pop missed sees the count and wakes us.
            self._waiters += 1
            try:
                while True:
                    try:
                        return self._free.pop()
                    except IndexError:
                        pass
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    self._cond.wait(left)
            finally:
                self._waiters -= 1

    def give(self, item: T) -> None:
        """Give back a connection that `take` lent."""
        self._free.append(item)
        if self._waiters:
            with self._cond:
                self._cond.notify()
