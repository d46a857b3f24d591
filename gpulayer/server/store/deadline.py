"""A time limit on one connection's statements: SQLite's progress handler (datasette's habit).

`Deadline(conn)` installs the handler once, for the connection's life: SQLite
calls it every PROGRESS_STEPS virtual-machine steps (tens of microseconds of
work) and interrupts the statement running once `at` (time.monotonic()) has
passed; SQLite raises `apsw.InterruptError`, ends the statement, and leaves
the connection (and a read transaction it holds) usable. A caller sets `at`
before its statements and `math.inf` after: two attribute writes a read, not
a handler installed and removed each time (a heartbeat's lookup is a few
microseconds).
"""
from __future__ import annotations

import math
import time

import apsw

PROGRESS_STEPS = 1000  # VM steps between deadline checks: ~tens of microseconds


class Deadline:
    """The progress handler of one connection; `at` is when its statements are stopped (inf: never)."""

    __slots__ = ("at",)

    def __init__(self, conn: apsw.Connection):
        self.at = math.inf
        conn.set_progress_handler(self, PROGRESS_STEPS)

    def __call__(self) -> bool:
        return time.monotonic() > self.at
