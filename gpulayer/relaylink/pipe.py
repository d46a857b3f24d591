"""`SocketPipe`: a TCP socket joined to a relay stream of kind `tcp`, which the agent (the task's side) and the
client (port-forward's side) both run.

EOF either way is a half-close: shutdown(SHUT_WR) of the socket on the other side. What the stream's OPEN may
name: gpulayer/protocol/forward.py.
"""

from __future__ import annotations

import socket
import threading

from gpulayer.relaylink.streams import Stream
from gpulayer.protocol.control import Close
from gpulayer.protocol.fields import from_wire, to_wire
from gpulayer.protocol.relay import CLOSE, DATA, EOF, EXT_DATA, Frame


class SocketPipe:
    """A connected socket and its stream: bytes both ways, half-closes, one ending.

    `label` names the socket's peer in errors ("the connection to {label} broke: ..."). `ends_stream`: this end
    CLOSEs the stream once both ways ended (the agent's, which holds the task's connection); else it waits for
    the other end's CLOSE (the client's).
    """

    def __init__(self, stream: Stream, sock: socket.socket, label: str, *, ends_stream: bool, read_bytes: int = 64 * 1024):
        self.stream, self.sock, self.label = stream, sock, label
        self.ends_stream, self.read_bytes = ends_stream, read_bytes
        self.lock = threading.Lock()
        self.ways = 2  # both directions open
        self.error: str | None = None
        self.broke_here = False  # the socket failed (rather than the other end's CLOSE bringing an error)

    def run(self) -> str | None:
        """Copy until the stream ends (the socket's bytes on a thread, the stream's frames here), then shut the
        socket (the caller closes it); the error the stream ended with, None for a clean end."""
        self.stream.widen()
        pump = threading.Thread(target=self._from_socket, name=f"relay-tcp-{self.stream.id}", daemon=True)
        pump.start()
        try:
            self._to_socket()
        finally:
            shutdown(self.sock, socket.SHUT_RDWR)  # wakes the pump's recv
            pump.join(10.0)
        return self.error

    def _from_socket(self) -> None:
        while True:
            try:  # a read fills one frame: as large as the control plane let this stream's frames be
                chunk = self.sock.recv(max(self.read_bytes, self.stream.max_out))
            except OSError as exc:
                return self._broke(exc)
            if not chunk:
                break
            if not self.stream.write(chunk):
                return
        if self.stream.ended is None:
            self.stream.eof()
        self._way_done()

    def _to_socket(self) -> None:
        while True:
            frame = self.stream.recv()
            if frame is None:
                continue
            if frame.type in (DATA, EXT_DATA):
                try:
                    self.sock.sendall(frame.data)
                except OSError as exc:
                    return self._broke(exc)
                self.stream.consumed(len(frame.data))
            elif frame.type == EOF:
                shutdown(self.sock, socket.SHUT_WR)
                self._way_done()
            elif frame.type == CLOSE:
                error = from_wire(Close, frame.fields).error
                if self.error is None and error:
                    self.error = str(error)
                return

    def _way_done(self) -> None:
        with self.lock:
            self.ways -= 1
            last = self.ways == 0
        if last and self.ends_stream:
            self._end(Close(reason="the connection ended"))

    def _broke(self, exc: OSError) -> None:
        self.broke_here = True
        self.error = f"the connection to {self.label} broke: {exc.strerror or exc}"
        self._end(Close(error=self.error))

    def _end(self, message: Close) -> None:
        """Tell the other end (once), and wake the frame loop so that it returns."""
        self.stream.close(message)
        self.stream.inbox.put(Frame(self.stream.id, CLOSE, to_wire(Close(reason="ended here"))))


def shutdown(sock: socket.socket, how: int = socket.SHUT_RDWR) -> None:
    """sock.shutdown(how), whatever state the socket is in."""
    try:
        sock.shutdown(how)
    except OSError:
        pass


__all__ = ["SocketPipe", "shutdown"]
