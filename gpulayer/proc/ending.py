"""How a gpulayer process ends: `gpulayer ...`, `python -m gpulayer.cli` and `python -m agent`.

CPython before 3.14 ends any thread that asks for the GIL once the
interpreter's shutdown has begun with pthread_exit(). On a thread of Rust
(granian's tokio runtime, still winding down after the server stopped) or of
C without unwind tables, that forced unwinding aborts the whole process: "panic
in a function that cannot unwind", SIGABRT, then SIGBUS in the fault handler.
The command had done its work and said so; its exit status was -6 or -7 all
the same (about one `gpulayer up` in forty, stopped under load; `gpulayer
exec` with its stdin reader parked). So while any thread but this one is
alive, the process ends without the shutdown: stdout, stderr and the log
handlers flushed, then os._exit. A process with one thread exits as usual.

Everything a command writes goes through `with` blocks or explicit closes,
and every SQLite write is committed before it returns, so nothing the
shutdown would have done is lost (the state file's -wal is read back at the
next open, as after any crash).
"""
from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn


def threads_alive() -> int:
    """This process's threads, the runtime's native ones included (Linux: /proc/self/task)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def end_process(code: int | str | None) -> NoReturn:
    """Exit with `code` as sys.exit would read it; without the interpreter's shutdown while other threads run."""
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    status = 0 if code is None else int(code)
    if threads_alive() <= 1:
        sys.exit(status)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`gpulayer ... | head`), a closed stream
            pass
    os._exit(status & 0xFF)


def run_and_end(main: Callable[[], int | str | None]) -> NoReturn:
    """Run a process's `main()` and end the process with its result (or its SystemExit's code)."""
    try:
        code = main()
    except SystemExit as exc:
        code = exc.code
    end_process(code)


__all__ = ["end_process", "run_and_end", "threads_alive"]
