"""A task's process: its own process group, line readers, and group kill.

The command runs with ``start_new_session=True``, so it leads a new process
group (and session); killing the group reaches every child and grandchild
that did not deliberately leave it.
"""

import os
import signal
import subprocess
import threading
import time
from typing import Callable

#: SIGTERM first, then SIGKILL after this many seconds.
KILL_GRACE_S = 5.0
#: Longest line sent as one log line; longer lines are split.
MAX_LINE_BYTES = 64 * 1024

LineSink = Callable[[str, str], None]


def exit_code_of(returncode: int) -> int:
    """A shell-style exit code: a death by signal N becomes 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def live_group_members(pgid: int, proc_root: str = "/proc") -> list[int] | None:
    """Pids of the group's processes that are not zombies; None without /proc.

    A zombie whose parent never reaps it (an init that does not reap) would
    otherwise look alive for ever.
    """
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return None
    members = []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"{proc_root}/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # fields after "(comm)": state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry))
    return members


class TaskProcess:
    """A running command whose stdout/stderr lines go to ``on_line(stream, text)``."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str, on_line: LineSink):
        self._on_line = on_line
        self.last_output = time.monotonic()
        self.started = self.last_output
        self.popen = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.pid = self.popen.pid
        self._readers = [
            threading.Thread(target=self._read, args=("stdout", self.popen.stdout), daemon=True, name=f"stdout-{self.pid}"),
            threading.Thread(target=self._read, args=("stderr", self.popen.stderr), daemon=True, name=f"stderr-{self.pid}"),
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: str, pipe) -> None:
        with pipe:
            for raw in iter(lambda: pipe.readline(MAX_LINE_BYTES), b""):
                self.last_output = time.monotonic()
                text = raw.decode("utf-8", errors="replace")
                self._on_line(stream, text[:-1] if text.endswith("\n") else text)

    def poll(self) -> int | None:
        """The raw return code once the leader exited, else None."""
        return self.popen.poll()

    def group_alive(self) -> bool:
        """True while a live (non-zombie) process of the group exists."""
        self.popen.poll()
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        members = live_group_members(self.pid)
        return True if members is None else bool(members)

    def kill_group(self, grace_s: float = KILL_GRACE_S) -> None:
        """SIGTERM the whole group, wait up to ``grace_s``, then SIGKILL what is left."""
        if not self._signal(signal.SIGTERM):
            self.popen.wait()
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not self.group_alive():
                break
            time.sleep(0.05)
        else:
            self._signal(signal.SIGKILL)
        self.popen.wait()

    def _signal(self, signum: int) -> bool:
        try:
            os.killpg(self.pid, signum)
            return True
        except ProcessLookupError:
            return False

    def finish_readers(self, timeout_s: float = 2.0) -> None:
        """Wait for the output readers to drain (a process that left the group may keep a pipe open)."""
        deadline = time.monotonic() + timeout_s
        for reader in self._readers:
            reader.join(max(0.0, deadline - time.monotonic()))
