"""A command run in a pseudo-terminal (the `pty` module), as a person at a terminal runs it.

Its output is read as it comes; ^C typed there sends SIGINT as a terminal would, and what is typed
reaches a prompt (a hidden one too: getpass reads the terminal, not stdin).
"""
from __future__ import annotations

import os
import pty
import select
import signal
import time


class Terminal:
    """`argv` run with the terminal as its controlling one, in `cwd`, with exactly `env`."""

    def __init__(self, argv, env, cwd):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child
            # As a shell would: ^C's SIGINT at its default (a pytest-xdist worker ignores SIGINT, and an
            # ignored signal stays ignored across exec).
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.chdir(cwd)
            os.execve(argv[0], list(argv), env)
        self.output = ""

    def read_until(self, text, timeout=60):
        deadline = time.monotonic() + timeout
        while text not in self.output:
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} in the output after {timeout} s:\n{self.output}")
            if select.select([self.fd], [], [], 0.2)[0]:
                try:
                    self.output += os.read(self.fd, 4096).decode(errors="replace")
                except OSError:  # the command exited and the terminal closed
                    break
        return self.output

    def type(self, text):
        """Type `text` (end it with "\\n" for Enter)."""
        os.write(self.fd, text.encode())

    def interrupt(self):
        os.write(self.fd, b"\x03")

    def exit_code(self, timeout=60):
        deadline = time.monotonic() + timeout
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self._drain(to_the_end=True)
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
            if time.monotonic() > deadline:
                os.kill(self.pid, 9)
                raise AssertionError(f"the command did not exit:\n{self.output}")
            self._drain()

    def _drain(self, to_the_end=False):
        """Read what is there; `to_the_end` (the command exited): until the terminal reports it closed.

        A command's last words can reach the terminal's master side a while after it exited (the
        kernel moves them on in its own time, later on a loaded machine), so once it exited, reading
        goes on until the end of the output (EIO, or an empty read) or 3 s without a byte (a child
        left running may hold the terminal open), not just until 0.1 s passed without any.
        """
        quiet_until = time.monotonic() + (3 if to_the_end else 0)
        while True:
            if not select.select([self.fd], [], [], 0.1)[0]:
                if time.monotonic() >= quiet_until:
                    return
                continue
            try:
                chunk = os.read(self.fd, 4096)
            except OSError:
                return
            if not chunk:
                return
            self.output += chunk.decode(errors="replace")
            quiet_until = time.monotonic() + (3 if to_the_end else 0)
