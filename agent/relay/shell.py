"""`shell` streams: an interactive PTY in a running task's place (`gpulayer shell`, docs/access.md "Shell").

The place is exec's (agent/relay/exec.py `command_in`): the task's environment, working directory, user and
sandbox, with the client's TERM. The agent opens a pseudo-terminal; the command's stdin, stdout and stderr
are its slave end, and the command is the leader of a session of its own with that terminal as its
controlling one, so that the terminal's line discipline turns the ^C and ^Z the client's raw mode sends into
SIGINT and SIGTSTP for the foreground job, and a shell has job control. In a sandbox the process that takes
the terminal must be the one inside (nsenter forks into the task's PID namespace; a session led from outside
would leave the shell without job control), so the command is started as `setsid --ctty -- CMD` there: it
calls setsid() and TIOCSCTTY itself and then becomes CMD. Without CMD it is the task's shell (bash when the
task has it, else sh).

DATA towards the stream is typed input (written to the terminal), DATA back is what the terminal shows;
RESIZE `{"rows", "cols"}` sets the window size (TIOCSWINSZ, which signals SIGWINCH to the foreground job);
SIGNAL signals the foreground job; CLOSE from the client (or a lost link) hangs the session up. The stream
ends with CLOSE `exit_code` (the command's; 128+N for a death by signal N).
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import shutil
import signal
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Callable

from gpulayer.protocol.control import Close, Resize, Signal, StreamOpen
from gpulayer.protocol.fields import from_wire, to_wire
from gpulayer.protocol.relay import CLOSE, DATA, EXT_DATA, RESIZE, SIGNAL, SIGNALS, Frame
from gpulayer.relaylink.streams import Stream

from ..events import log_event
from ..run.supervision import TaskHandle
from ..sandbox.process import READ_BYTES, exit_code_of
from ..cpusets import pinned
from .exec import ExecRefused, command_in, host_tool, sandbox_init_pid, task_cpus

#: The command without one given: the task's bash when it has one, else sh (both interactive on a terminal).
DEFAULT_SHELL = ["/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash; fi; exec sh"]
TERM = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
#: Seconds the output may still come after the command ended (what it wrote last), and a hung-up session gets.
DRAIN_S = 0.3
HANGUP_S = 2.0
TIOCGSID = getattr(termios, "TIOCGSID", 0x5429)  # Linux's; Python's termios leaves these out
TIOCSPTLCK = 0x40045431  # unlockpt()
TIOCGPTPEER = 0x5441  # the slave end of a master, opened without a path (Linux 4.13)


def serve(stream: Stream, opened: StreamOpen, find: Callable[[int], TaskHandle | None]) -> None:
    """Run an OPEN `shell` stream to its end (on its own thread)."""
    task_id, argv = opened.task_id, opened.argv
    handle = find(task_id) if isinstance(task_id, int) else None
    if argv is None:
        argv = DEFAULT_SHELL
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        return stream.close(Close(error="shell: argv must be a non-empty list of strings"))
    if handle is None:
        return stream.close(Close(error=f"task {task_id} is not running on this worker"))
    setsid = shutil.which("setsid")
    if setsid is None:
        return stream.close(Close(error="this worker has no setsid (Debian package util-linux): a shell cannot have its terminal"))
    inner = [*host_tool(handle, setsid), "--ctty", "--", *argv]
    try:
        launch, env, cwd = command_in(handle, inner)
    except ExecRefused as exc:
        return stream.close(Close(error=str(exc)))
    term = opened.term
    env = {**env, "TERM": term if isinstance(term, str) and TERM.fullmatch(term) else "xterm-256color"}
    master, slave = _terminal(handle)
    try:
        _winsize(master, opened.rows, opened.cols)
        # Outside a sandbox setsid is the started process itself (not a group leader, so it needs no fork);
        # through nsenter, nsenter leads a session of its own without a terminal and setsid takes it inside.
        with pinned(task_cpus(handle)):
            proc = subprocess.Popen(launch, env=env, cwd=cwd, stdin=slave, stdout=slave, stderr=slave,
                                    start_new_session=launch is not inner)
    except OSError as exc:
        os.close(master)
        return stream.close(Close(error=f"shell: cannot start {argv[0]!r}: {exc.strerror or exc}"))
    finally:
        os.close(slave)
    log_event("shell_started", task_id=task_id, pid=proc.pid, session_id=opened.session_id)
    done = threading.Event()
    pump = threading.Thread(target=_pump, args=(master, stream, done), daemon=True, name=f"shell-out-{proc.pid}")
    pump.start()
    feeder = threading.Thread(target=_feed, args=(stream, master, proc), daemon=True, name=f"shell-in-{proc.pid}")
    feeder.start()
    code = exit_code_of(proc.wait())
    done.set()
    pump.join(HANGUP_S + 1)
    _signal(master, proc, signal.SIGHUP)  # what the session left in the foreground
    log_event("shell_finished", task_id=task_id, pid=proc.pid, exit_code=code, session_id=opened.session_id)
    stream.close(Close(exit_code=code))
    stream.inbox.put(Frame(stream.id, CLOSE, to_wire(Close(reason="the command ended"))))  # ends the feeder
    feeder.join(HANGUP_S + 1)
    os.close(master)  # hangs the terminal up for what still holds it


def _terminal(handle: TaskHandle) -> tuple[int, int]:
    """A new pseudo-terminal's master and slave: from the task's sandbox's own /dev/pts where it has one (so
    that `tty` and ttyname() name it there, owned by the task user, as sshd does), else the agent's."""
    runner, process = handle.runner, handle.process
    sandbox = runner.ctx.sandbox if runner is not None else None
    if sandbox is None or sandbox.mode == "none" or process is None:
        return os.openpty()
    pid = sandbox_init_pid(handle)
    try:
        master = os.open(f"/proc/{pid}/root/dev/pts/ptmx", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return os.openpty()
    try:
        fcntl.ioctl(master, TIOCSPTLCK, struct.pack("i", 0))
        slave = fcntl.ioctl(master, TIOCGPTPEER, os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        os.close(master)
        return os.openpty()
    user = sandbox.drops_to(False)
    if user is not None:
        try:
            os.fchown(slave, user.uid, user.gid)
        except OSError:
            pass
    return master, slave


def _winsize(master: int, rows: object, cols: object) -> None:
    if isinstance(rows, int) and isinstance(cols, int) and 0 < rows < 65536 and 0 < cols < 65536:
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _pump(master: int, stream: Stream, done: threading.Event) -> None:
    """What the terminal shows into the stream, until it hangs up (EIO) or, once the command ended, falls quiet."""
    while True:
        ready = select.select([master], [], [], DRAIN_S if done.is_set() else 0.5)[0]
        if not ready:
            if done.is_set():
                return
            continue
        try:
            chunk = os.read(master, READ_BYTES)
        except OSError:  # EIO: no process holds the terminal's other end any more
            return
        if not chunk or not stream.write(chunk):
            return


def _feed(stream: Stream, master: int, proc: subprocess.Popen) -> None:
    """The stream's frames into the terminal: DATA typed, RESIZE its size, SIGNAL its foreground job, CLOSE hangs up."""
    while True:
        frame = stream.recv()
        if frame is None:
            continue
        if frame.type in (DATA, EXT_DATA):
            view = memoryview(frame.data)
            try:
                while view:
                    view = view[os.write(master, view) :]
            except OSError:  # the terminal hung up: the bytes go nowhere
                pass
            stream.consumed(len(frame.data))
        elif frame.type == RESIZE:
            try:
                resize = from_wire(Resize, frame.fields)
                _winsize(master, resize.rows, resize.cols)
            except OSError:
                pass
        elif frame.type == SIGNAL:
            name = from_wire(Signal, frame.fields).signal
            if name in SIGNALS:
                _signal(master, proc, getattr(signal, f"SIG{name}"))
        elif frame.type == CLOSE:
            if proc.poll() is None:
                log_event("shell_hung_up", pid=proc.pid, reason=from_wire(Close, frame.fields).why())
                _signal(master, proc, signal.SIGHUP)
                deadline = time.monotonic() + HANGUP_S
                while proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                if proc.poll() is None:
                    _signal(master, proc, signal.SIGKILL)
            return


def _signal(master: int, proc: subprocess.Popen, sig: int) -> None:
    """`sig` to the terminal's foreground job and its session's leader (SIGKILL: to nsenter's group too)."""
    groups = set()
    for ask in (termios.TIOCGPGRP, TIOCGSID):
        try:
            found = struct.unpack("i", fcntl.ioctl(master, ask, b"\0\0\0\0"))[0]
        except OSError:
            continue
        if found > 0:
            groups.add(found)
    if sig == signal.SIGKILL:
        groups.add(proc.pid)
    for group in groups:
        try:
            os.killpg(group, sig)
        except (ProcessLookupError, PermissionError):
            pass
