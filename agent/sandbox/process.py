"""A task's process: its own process group, line readers, and group kill.

The command runs with ``start_new_session=True``, so it leads a new process
group (and session); killing the group reaches every child and grandchild
that did not deliberately leave it.
"""

import json
import os
import select
import selectors
import signal
import subprocess
import threading
import time
from typing import IO, Callable, Protocol

from ..cpusets import pinned

#: SIGTERM first, then SIGKILL after this many seconds.
KILL_GRACE_S = 5.0
#: How long a sandboxed task's namespace may take to end after bwrap, its leader, exited.
SANDBOX_SETTLE_S = 1.0
#: Longest line sent as one log line; longer lines are split.
MAX_LINE_BYTES = 64 * 1024
#: Bytes read from a task's pipe at a time.
READ_BYTES = 64 * 1024
#: How long a task's own thread drains the output of a process that ended before a reader thread was started.
INLINE_DRAIN_S = 0.05

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


class Started(Protocol):
    """A process started for a TaskProcess elsewhere, read as a subprocess.Popen: an element the job's launcher
    forked (agent/sandbox/launcher.py's Launched), a command in a sandbox made ahead (agent/sandbox/spares.py's MadeAhead)."""

    @property
    def pid(self) -> int: ...
    @property
    def returncode(self) -> int | None: ...
    @property
    def stdout(self) -> IO[bytes] | None: ...
    @property
    def stderr(self) -> IO[bytes] | None: ...
    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...


def sandbox_init_pidfd(read: int, pgid: int, timeout_s: float = SANDBOX_SETTLE_S) -> int | None:
    """A pidfd of the sandbox's init from bwrap's --info-fd (``{"child-pid": N}``, written once it cloned it),
    checked to be in the task's process group; None when bwrap wrote none in time or the pid is not it."""
    data = b""
    deadline = time.monotonic() + timeout_s
    try:
        while b"}" not in data:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read], [], [], left)[0]:
                return None
            chunk = os.read(read, 4096)
            if not chunk:
                return None
            data += chunk
    finally:
        os.close(read)
    try:
        pid = int(json.loads(data[:data.index(b"}") + 1])["child-pid"])
        fd = os.pidfd_open(pid)
    except (ValueError, KeyError, TypeError, AttributeError, OSError):
        return None
    try:  # the pidfd is of the init (in bwrap's group), not of a process that took a reaped init's pid
        with open(f"/proc/{pid}/stat") as handle:
            if int(handle.read().rsplit(")", 1)[1].split()[2]) == pgid:
                return fd
    except (OSError, IndexError, ValueError):
        pass
    os.close(fd)
    return None


class TaskProcess:
    """A running command whose stdout/stderr lines go to ``on_line(stream, text)``."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str, on_line: LineSink, *, sandboxed: bool = False,
                 entered: bool = False, started: "Started | None" = None,
                 info: tuple[int, int] | None = None, init_pidfd: int | None = None,
                 cpus: frozenset[int] | None = None, defer_readers: bool = False):
        self._on_line = on_line
        #: The leader is bwrap (agent/sandbox/bwrap.py), which may exit while its PID namespace is still ending.
        self.sandboxed = sandboxed
        #: The leader is nsenter into a job's shared sandbox (agent/sandbox/shared.py): it waits for the command and
        #: exits as it did (or dies of its signal), so a SIGTERM spares it and goes to the rest of the group.
        self.entered = entered
        self.last_output = time.monotonic()
        self.started = self.last_output
        #: A pidfd of the sandbox's init (bwrap's child, the PID namespace's first process): it becomes readable
        #: once the namespace ended, every process in it gone (``info``: bwrap's --info-fd pipe, read, write;
        #: ``init_pidfd``: that pidfd already, of a sandbox made ahead, agent/sandbox/spares.py; closed here).
        self.init_pidfd: int | None = init_pidfd
        #: ``started``: a process the job's launcher started already (agent/sandbox/launcher.py), the leader of its group.
        #: ``cpus`` (--pin-cpus): the CPUs the process is born on (this thread's affinity for the fork alone, which
        #: no thread the agent starts meanwhile inherits).
        try:
            with pinned(cpus if started is None else None):
                self.popen: Started = started if started is not None else subprocess.Popen(
                    argv,
                    env=env,
                    cwd=cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                    pass_fds=info[1:] if info is not None else (),
                )
        except BaseException:
            if info is not None:
                os.close(info[0])
            raise
        finally:
            if info is not None:
                os.close(info[1])
        self.pid = self.popen.pid
        if info is not None:
            self.init_pidfd = sandbox_init_pidfd(info[0], self.pid)
        #: The output pipes, read by one thread (``start_readers``), or drained by the task's own thread once it
        #: ended quickly (``finish_readers``): a short task costs no reader thread.
        self._pipes: list[tuple[str, IO[bytes]]] = [
            (stream, pipe) for stream, pipe in (("stdout", self.popen.stdout), ("stderr", self.popen.stderr))
            if pipe is not None]  # both: stdout=PIPE, stderr=PIPE
        self._pending: dict[int, bytes] = {pipe.fileno(): b"" for _stream, pipe in self._pipes}
        self._readers: list[threading.Thread] = []
        if not defer_readers:
            self.start_readers()

    def start_readers(self) -> None:
        """Read the output on a thread of its own from now on (once; a thread per pipe was a measurable cost)."""
        if self._readers or not self._pipes:
            return
        self._readers = [threading.Thread(target=self._read, daemon=True, name=f"output-{self.pid}")]
        self._readers[0].start()

    def _read(self, deadline: float | None = None) -> None:
        """Read stdout and stderr until both close (or ``deadline`` passes: what is left stays), passing on whole
        lines (at most MAX_LINE_BYTES each)."""
        pipes = {pipe.fileno(): (stream, pipe) for stream, pipe in self._pipes}
        pending = self._pending
        with selectors.PollSelector() as selector:  # no epoll descriptor to create per task
            for fd in pipes:
                selector.register(fd, selectors.EVENT_READ)
            while pipes:
                ready = selector.select(None if deadline is None else max(0.0, deadline - time.monotonic()))
                if not ready and deadline is not None:
                    break
                for key, _ in ready:
                    stream, pipe = pipes[key.fd]
                    data = os.read(key.fd, READ_BYTES)
                    if data:
                        self.last_output = time.monotonic()
                        pending[key.fd] = self._lines(stream, pending[key.fd] + data)
                        continue
                    if pending[key.fd]:  # the last line, without a newline
                        self._emit(stream, pending[key.fd])
                    selector.unregister(key.fd)
                    pipe.close()
                    del pipes[key.fd]
        self._pipes = [(stream, pipe) for stream, pipe in self._pipes if not pipe.closed]

    def _lines(self, stream: str, data: bytes) -> bytes:
        """Emit the complete lines of ``data`` (and pieces of MAX_LINE_BYTES of longer ones); returns the rest."""
        start = 0
        while True:
            end = data.find(b"\n", start, start + MAX_LINE_BYTES)
            if end >= 0:
                self._emit(stream, data[start:end])
                start = end + 1
            elif len(data) - start >= MAX_LINE_BYTES:
                self._emit(stream, data[start:start + MAX_LINE_BYTES])
                start += MAX_LINE_BYTES
            else:
                return data[start:]

    def _emit(self, stream: str, raw: bytes) -> None:
        self._on_line(stream, raw.decode("utf-8", errors="replace"))

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
        if self.sandboxed and self.popen.returncode is not None and self._init_ended(SANDBOX_SETTLE_S):
            return False  # the namespace ended (no /proc walk: it was a quarter of a short task's agent CPU)
        members = live_group_members(self.pid)
        if members and self.sandboxed and self.popen.returncode is not None:
            members = self._namespace_ended(members)
        return True if members is None else bool(members)

    def _namespace_ended(self, members: list[int]) -> list[int] | None:
        """The group's members once a sandbox's namespace had up to SANDBOX_SETTLE_S to end (bwrap exits on
        its command's exit status, while the namespace's init is still ending and taking the rest with it)."""
        deadline = time.monotonic() + SANDBOX_SETTLE_S
        if self._init_ended(SANDBOX_SETTLE_S):
            # Its namespace ended: what was in it is gone, and bwrap, the group's one process outside, exited.
            return []
        while members and time.monotonic() < deadline:
            time.sleep(0.005)
            members = live_group_members(self.pid) or []
        return members

    def _init_ended(self, timeout_s: float) -> bool:
        """Whether the sandbox's init exited within ``timeout_s`` (False without its pidfd)."""
        if self.init_pidfd is None:
            return False
        try:
            ended = bool(select.select([self.init_pidfd], [], [], timeout_s)[0])
        except (OSError, ValueError):
            return False
        if ended:
            self.close()
        return ended

    def close(self) -> None:
        """Let go of the sandbox init's pidfd."""
        fd, self.init_pidfd = self.init_pidfd, None
        if fd is not None:
            os.close(fd)

    def kill_group(self, grace_s: float = KILL_GRACE_S, signum: int = signal.SIGTERM, batch: bool = False) -> None:
        """``signum`` (SIGTERM) to the whole group (to its top process only with ``batch``), wait up to
        ``grace_s`` for the group to end, then SIGKILL what is left."""
        if not self.send(signum, batch):
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

    def send(self, signum: int, batch: bool = False) -> bool:
        """``signum`` to the group, or with ``batch`` (Slurm's `B:`) to its top process only, the command's
        own process when it leads the group (in a sandbox the leader is bwrap or nsenter, which pass nothing
        on: the whole group gets it there). False when none is left to receive it."""
        if not batch or self.sandboxed or self.entered:
            return self._signal(signum)
        if self.popen.poll() is not None:
            return self.group_alive() and self._signal(signum)
        try:
            os.kill(self.pid, signum)
            return True
        except ProcessLookupError:
            return False

    def _signal(self, signum: int) -> bool:
        if self.entered and signum != signal.SIGKILL:
            return self._signal_spared(signum)
        try:
            os.killpg(self.pid, signum)
            return True
        except ProcessLookupError:
            return False

    def _signal_spared(self, signum: int) -> bool:
        """``signum`` to every live process of the group but its leader (nsenter); False when none is left."""
        members = [pid for pid in live_group_members(self.pid) or [] if pid != self.pid]
        for pid in members:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        return bool(members) or self.popen.poll() is None

    def finish_readers(self, timeout_s: float = 2.0) -> None:
        """Wait for the output readers to drain (a process that left the group may keep a pipe open)."""
        deadline = time.monotonic() + timeout_s
        if not self._readers and self._pipes:  # never handed to a thread: drain here, a thread for what stays open
            self._read(min(deadline, time.monotonic() + INLINE_DRAIN_S))
            self.start_readers()
        for reader in self._readers:
            reader.join(max(0.0, deadline - time.monotonic()))
        self.close()
