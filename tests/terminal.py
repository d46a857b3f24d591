"""A command run in a pseudo-terminal, as a person at a terminal runs it.

Its output is read as it comes; ^C typed there sends SIGINT as a terminal would, and what is typed
reaches a prompt (a hidden one too: getpass reads the terminal, not stdin).
"""
from __future__ import annotations

import fcntl
import os
import select
import signal
import struct
import termios
import time


class Terminal:
    """`argv` run with the terminal as its controlling one, in `cwd`, with exactly `env`."""

    def __init__(self, argv, env, cwd):
        # pty.fork() as it is, except that this side keeps the terminal's slave end open too: once the
        # command exits, Linux may answer a read of the master side with EIO while the command's last
        # words are still on their way through the terminal (they were lost under load: "job 3 is still
        # running" missing after ^C). With the slave end held here no EIO comes; the end of the output is
        # a quiet spell after the exit (_drain).
        self.fd, self._slave = os.openpty()
        self.pid = os.fork()
        if self.pid == 0:  # the child
            try:
                os.close(self.fd)
                os.setsid()
                fcntl.ioctl(self._slave, termios.TIOCSCTTY, 0)
                for std in (0, 1, 2):
                    os.dup2(self._slave, std)
                os.close(self._slave)
                # As a shell would: ^C's SIGINT at its default (a pytest-xdist worker ignores SIGINT, and an
                # ignored signal stays ignored across exec).
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                os.chdir(cwd)
                os.execve(argv[0], list(argv), env)
            finally:
                os._exit(127)
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

    def resize(self, rows, cols):
        """Resize the window, as a terminal emulator does: the command gets SIGWINCH."""
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def settings(self):
        """The terminal's settings (termios.tcgetattr: modes, speeds, control characters) as the command left them."""
        return termios.tcgetattr(self._slave)

    def exit_code(self, timeout=60):
        deadline = time.monotonic() + timeout
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self._drain(to_the_end=True)
                self.left = termios.tcgetattr(self._slave)  # the settings the command left the terminal in
                os.close(self.fd)
                os.close(self._slave)
                return os.waitstatus_to_exitcode(status)
            if time.monotonic() > deadline:
                os.kill(self.pid, 9)
                raise AssertionError(f"the command did not exit:\n{self.output}")
            self._drain()

    def _drain(self, to_the_end=False):
        """Read what is there; `to_the_end` (the command exited): until 1 s passes without a byte.

        A command's last words can reach the terminal's master side a while after it exited (the
        kernel moves them on in its own time, later on a loaded machine); this side holds the slave end
        open, so no EIO ends the output early, and a quiet second after the exit does.
        """
        quiet_s = 1.0 if to_the_end else 0.0
        quiet_until = time.monotonic() + quiet_s
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
            quiet_until = time.monotonic() + quiet_s
