"""A time limit on one connection's statements: SQLite's progress handler (datasette's habit).

The handler runs every PROGRESS_STEPS virtual-machine steps (tens of
microseconds of work) and interrupts the statement once the deadline has
passed: SQLite raises `apsw.InterruptError`, ends the statement, and leaves
the connection (and a read transaction it holds) usable.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import apsw

PROGRESS_STEPS = 1000  # VM steps between deadline checks: ~tens of microseconds


@contextmanager
def time_limit(conn: apsw.Connection, seconds: float) -> Iterator[None]:
    """Interrupt what `conn` runs inside the block once `seconds` have passed (apsw.InterruptError)."""
    deadline = time.monotonic() + seconds
    conn.set_progress_handler(lambda: time.monotonic() > deadline, PROGRESS_STEPS)
    try:
        yield
    finally:
        conn.set_progress_handler(None)
