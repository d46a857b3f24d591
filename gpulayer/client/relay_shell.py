"""An interactive shell in a running task through the relay: `gpulayer shell` (docs/access.md, "Shell").

One `shell` stream (gpulayer/protocol/relay.py): its OPEN carries TERM and the window size, the local
terminal goes to raw mode (so ^C, ^Z, ^D and every key travel as bytes, and the remote terminal's line
discipline makes them signals), typed bytes go up as DATA, what the remote terminal shows comes back as DATA,
and every SIGWINCH sends a RESIZE. The local terminal is restored on every way out: the remote's exit, a
refusal, a lost relay, SIGTERM, SIGHUP. The remote's exit status is returned.
"""

from __future__ import annotations

import os
import signal
import termios
import threading
import tty
from typing import Any

from gpulayer.client.relay import RelayClient, exit_code, open_stream
from gpulayer.protocol.control import Close, Resize, ShellOpen
from gpulayer.protocol.fields import to_wire
from gpulayer.protocol.relay import CLOSE, DATA, EXT_DATA, RESIZE, encode
from gpulayer.relaylink.streams import LinkLost, Stream

READ_BYTES = 4096


class NotATerminal(ValueError):
    """stdin is not a terminal: a shell needs one (gpulayer exec runs a command without)."""


class Hangup(Exception):
    """SIGTERM or SIGHUP arrived: the shell's stream is closed and the terminal restored."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def window(fd: int) -> tuple[int, int]:
    """The terminal's rows and columns (24 x 80 when it does not say)."""
    try:
        size = os.get_terminal_size(fd)
        if size.lines > 0 and size.columns > 0:
            return size.lines, size.columns
    except OSError:
        pass
    return 24, 80


def open_shell(
    client: RelayClient,
    job_id: int,
    argv: list[str] | None = None,
    index: int | None = None,
    *,
    term: str | None = None,
    size: tuple[int, int] = (24, 80),
):
    """A connected link and its shell stream (`argv`: a command instead of the task's shell)."""
    opening = ShellOpen(rows=size[0], cols=size[1], argv=list(argv) if argv else None, term=term or None)
    return open_stream(client, job_id, to_wire(opening), index)


def resize(stream: Stream, rows: int, cols: int) -> None:
    """Tell the remote terminal its new size (a RESIZE frame)."""
    try:
        stream.link.send(encode(stream.id, RESIZE, to_wire(Resize(rows=rows, cols=cols))))
    except LinkLost:
        pass


def run_shell(
    client: RelayClient, job_id: int, argv: list[str] | None = None, index: int | None = None, *, stdin_fd: int = 0, stdout_fd: int = 1
) -> int:
    """The interactive session on the terminal `stdin_fd`; the remote's exit status.

    Raises NotATerminal, ApiError (a refusal), ConnectionFailed (the relay went away), Hangup (SIGTERM,
    SIGHUP); the terminal's settings are restored before any of them comes out.
    """
    if not os.isatty(stdin_fd):
        raise NotATerminal("gpulayer shell needs a terminal on stdin; to run a command without one: gpulayer exec JOB -- CMD")
    link, stream = open_shell(client, job_id, argv, index, term=os.environ.get("TERM"), size=window(stdout_fd))
    saved = termios.tcgetattr(stdin_fd)
    resized = threading.Event()
    previous: dict[int, Any] = {}

    def on_winch(signum, frame) -> None:
        resized.set()  # the resizer sends it: a handler may run while this thread holds the link's send lock

    def on_hangup(signum, frame) -> None:
        raise Hangup(signum)

    def on_cont(signum, frame) -> None:
        tty.setraw(stdin_fd, termios.TCSANOW)  # stopped from outside and back: raw again

    def resizer() -> None:
        while stream.ended is None:
            if resized.wait(0.5):
                resized.clear()
                resize(stream, *window(stdout_fd))

    try:
        for signum, handler in ((signal.SIGWINCH, on_winch), (signal.SIGTERM, on_hangup), (signal.SIGHUP, on_hangup), (signal.SIGCONT, on_cont)):
            previous[signum] = signal.signal(signum, handler)
        tty.setraw(stdin_fd, termios.TCSANOW)
        threading.Thread(target=_typed, args=(stream, stdin_fd), daemon=True, name="shell-stdin").start()
        threading.Thread(target=resizer, daemon=True, name="shell-resize").start()
        while True:
            frame = stream.recv(timeout=1.0)
            if frame is None:
                continue
            if frame.type in (DATA, EXT_DATA):
                _write_all(stdout_fd, frame.data)
                stream.consumed(len(frame.data))
            elif frame.type == CLOSE:
                return exit_code(frame.fields)
    finally:
        try:
            termios.tcsetattr(stdin_fd, termios.TCSADRAIN, saved)
        except termios.error:  # the terminal went away (SIGHUP): nothing to restore
            pass
        for number, before in previous.items():
            signal.signal(number, before)
        if stream.ended is None:
            stream.close(Close(reason="the client went away"))
        link.close()


def _typed(stream: Stream, fd: int) -> None:
    """What is typed, as it is typed, into the stream (the end of stdin ends nothing: ^D is a byte too)."""
    while True:
        try:
            chunk = os.read(fd, READ_BYTES)
        except InterruptedError:
            continue
        except OSError:
            return
        if not chunk or not stream.write(chunk):
            return


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except InterruptedError:
            continue


__all__ = ["run_shell", "open_shell", "resize", "window", "NotATerminal", "Hangup"]
