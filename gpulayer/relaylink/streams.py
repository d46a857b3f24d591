"""A relay WebSocket seen from threads (the agent's link, the client's streams): frames in, credit kept.

`Link` wraps a connected WebSocket (gpulayer/relaylink/wsclient.py): `run()` reads frames (in the caller's thread, or
`start()` one) and hands them to their `Stream`; `send()` may be called from any thread. A `Stream` writes
within the credit its receiver granted (waiting for WINDOW when it runs out), and hands what it reads to
`recv()`; whoever reads calls `consumed(n)` once it has used `n` bytes, which grants them back. When the
connection ends, every stream ends with a CLOSE whose `error` says so. Imports nothing of gpulayer but the
frame codec, so the agent and the client share it.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from gpulayer.protocol import relay as frames
from gpulayer.protocol.control import Close, Settings, Signal
from gpulayer.protocol.fields import from_wire, to_wire
from gpulayer.relaylink import wsclient
from gpulayer.protocol.relay import CLOSE, DATA, EOF, EXT_DATA, OPEN, SETTINGS, SIGNAL, WINDOW, Credit, Frame, FrameError, accepted_data

log = logging.getLogger("gpulayer.relay")

#: Grant credit back once this many bytes were consumed (fewer, larger WINDOW frames).
GRANT_EVERY = frames.INITIAL_WINDOW // 4


class LinkLost(ConnectionError):
    """The WebSocket under a link failed or closed."""


class Stream:
    """One stream of a Link: write within credit, read frames, half-close, close."""

    def __init__(self, link: Link, stream_id: int):
        self.link, self.id = link, stream_id
        self.out = Credit()
        self.inbound = Credit()
        self.cond = threading.Condition()
        self.inbox: queue.SimpleQueue[Frame] = queue.SimpleQueue()
        self.ended: dict | None = None  # the CLOSE fields once the stream is over (either way)
        #: Called (once, on the thread that ended it) when the stream ends either way: what a handler blocked
        #: elsewhere must learn at once (exec kills its command: its stdin may never take the next frame).
        self.on_end: Callable[[], None] | None = None
        self._waiting = 0  # control frames in the inbox, not yet recv()d (at most MAX_WAITING_CONTROL)
        self._unacked = 0
        self._grant_every = GRANT_EVERY
        #: The most DATA one frame may carry towards the other end: MAX_DATA until the control plane said more
        #: (OPEN's `max_data` to an agent, a SETTINGS frame to a client).
        self.max_out = frames.MAX_DATA

    def widen(self, window: int = frames.BULK_WINDOW) -> None:
        """Let the other end send up to `window` bytes ahead (one WINDOW of the difference), granted back in
        quarters of it: for bulk streams, whose throughput the initial 256 KiB caps at window / round trip."""
        with self.cond:
            extra = window - self.inbound.left - self._unacked
            if extra <= 0 or self.ended is not None:
                return
            self.inbound.grant(extra)
            self._grant_every = max(GRANT_EVERY, window // 4)
        self._send(frames.encode(self.id, WINDOW, extra))

    def write(self, data: bytes, channel: int = 1) -> bool:
        """Send `data` as DATA (channel 1) or EXT_DATA frames, waiting for credit; False once the stream ended."""
        view = memoryview(data)
        while view:
            with self.cond:
                while self.out.left <= 0 and self.ended is None:
                    self.cond.wait()
                if self.ended is not None:
                    return False
                size = min(self.out.left, self.max_out, len(view))
                self.out.take(size)
            chunk, view = view[:size], view[size:]
            if not self._send(frames.data(self.id, chunk, channel)):  # one copy: the frame's
                return False
        return True

    def pour(self, read: Callable[[int], bytes], size: int, channel: int = 1) -> None:
        """Write what `read(size)` gives (a pipe's, a socket's) until it gives b"" or raises OSError, or the stream
        ended: a command's output, a socket's bytes, within the stream's credit."""
        while True:
            try:
                chunk = read(size)
            except OSError:
                return
            if not chunk or not self.write(chunk, channel):
                return

    def eof(self) -> None:
        """No more DATA from this end (stdin's end)."""
        self._send(frames.encode(self.id, EOF))

    def signal(self, name: str) -> None:
        self._send(frames.encode(self.id, SIGNAL, to_wire(Signal(signal=name))))

    def close(self, message: Close) -> None:
        """End the stream from this end, telling the other (`exit_code`, `error`, `reason`)."""
        fields = to_wire(message)
        if self._ended(fields):
            self._send(frames.encode(self.id, CLOSE, fields))

    def recv(self, timeout: float | None = None) -> Frame | None:
        """The next frame the other end sent (DATA, EXT_DATA, EOF, SIGNAL, CLOSE); None after `timeout`."""
        try:
            frame = self.inbox.get(timeout=timeout)
        except queue.Empty:
            return None
        if frame.type not in (DATA, EXT_DATA):
            with self.cond:
                self._waiting = max(0, self._waiting - 1)
        return frame

    def consumed(self, size: int) -> None:
        """`size` bytes read were used: grant them back (in batches)."""
        with self.cond:
            self._unacked += size
            if self._unacked < self._grant_every or self.ended is not None:
                return
            granted, self._unacked = self._unacked, 0
            self.inbound.grant(granted)
        self._send(frames.encode(self.id, WINDOW, granted))

    def _send(self, frame: bytes) -> bool:
        try:
            self.link.send(frame)
            return True
        except LinkLost:
            return False

    def _ended(self, fields: dict) -> bool:
        """Mark the stream over (and call `on_end`); False when it was already."""
        with self.cond:
            if self.ended is not None:
                return False
            self.ended = fields
            self.cond.notify_all()
        self.link.forget(self.id)
        if self.on_end is not None:
            self.on_end()
        return True

    def _granted(self, size: int) -> None:
        with self.cond:
            self.out.grant(size)
            self.cond.notify_all()

    def _settings(self, fields: dict) -> None:
        """A SETTINGS frame (or an OPEN's fields): the frame size this end may send from now on."""
        if "max_data" in fields:
            self.max_out = accepted_data(from_wire(Settings, fields).max_data)

    def _arrived(self, frame: Frame) -> None:
        with self.cond:
            if frame.type in (DATA, EXT_DATA):
                self.inbound.take(frame.cost())  # FrameError past what this end granted: the link closes
                flooded = False
            else:
                self._waiting += 1
                flooded = self._waiting > frames.MAX_WAITING_CONTROL and frame.type != CLOSE
        if flooded:  # control frames are outside flow control: past the bound the stream ends, the frame dropped
            why = (
                f"more than {frames.MAX_WAITING_CONTROL} control frames (SIGNAL, RESIZE, EOF) waited unread on "
                "this stream: it is closed"
            )
            self.close(Close(error=why, code="too_many_frames", status=429))
            self.inbox.put(Frame(self.id, CLOSE, to_wire(Close(error=why))))  # the handler ends on it
            return
        if frame.type == CLOSE:
            self._ended(frame.fields)
        self.inbox.put(frame)


class Link:
    """A relay WebSocket used from threads. `on_open(stream, fields)`: an OPEN from the other end (the agent's).

    `max_data`: the most DATA per frame this end accepts (what connect() announced at the handshake)."""

    def __init__(self, ws, on_open: Callable[[Stream, dict], None] | None = None, *, first_stream: int = 1, max_data: int = frames.LARGE_DATA):
        self.ws = ws
        self.max_data = max_data
        self.on_open = on_open
        self.streams: dict[int, Stream] = {}
        self.lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._next = first_stream
        self.closed = threading.Event()
        self.error: str | None = None

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="relay-link", daemon=True)
        thread.start()
        return thread

    def send(self, frame: bytes) -> None:
        """Send one frame; LinkLost when the connection is gone."""
        if self.closed.is_set():
            raise LinkLost(self.error or "the relay connection is closed")
        try:
            with self._send_lock:
                self.ws.send(frame)
        except Exception as exc:
            raise LinkLost(f"the relay connection failed: {exc}") from None

    def open(self, fields: dict) -> Stream:
        """A new stream of ours, announced with OPEN `fields`; LinkLost when the connection is gone."""
        with self.lock:
            stream = Stream(self, self._next)
            self._next += 2
            self.streams[stream.id] = stream
        self.send(frames.encode(stream.id, OPEN, fields))
        return stream

    def forget(self, stream_id: int) -> None:
        with self.lock:
            self.streams.pop(stream_id, None)

    def active(self) -> int:
        """Streams open now."""
        with self.lock:
            return len(self.streams)

    def run(self) -> None:
        """Read frames until the connection ends; then every stream ends with an `error`."""
        error = "the relay connection closed"
        try:
            while True:
                try:
                    raw = self.ws.recv()
                except Exception as exc:
                    error = _closed_reason(exc)
                    return
                self._dispatch(frames.decode(raw, self.max_data))
        except FrameError as exc:
            error = f"the other end broke the relay protocol: {exc}"
            log.warning("relay_protocol_error error=%s", exc)
            try:
                self.ws.close(frames.WS_POLICY, str(exc)[:120])
            except Exception:
                pass
        finally:
            self.error = error
            self.closed.set()
            with self.lock:
                left = list(self.streams.values())
            for stream in left:
                lost = Frame(stream.id, CLOSE, to_wire(Close(error=error)))
                stream._arrived(lost)

    def _dispatch(self, frame: Frame) -> None:
        with self.lock:
            stream = self.streams.get(frame.stream_id)
            if frame.type == OPEN and stream is None and self.on_open is not None:
                stream = self.streams[frame.stream_id] = Stream(self, frame.stream_id)
                opened = True
            else:
                opened = False
        if opened:
            assert self.on_open is not None and stream is not None
            stream._settings(frame.fields)
            self.on_open(stream, frame.fields)
        elif stream is None:
            return  # a stream that ended here meanwhile
        elif frame.type == OPEN:
            raise FrameError(f"OPEN on stream {frame.stream_id}, which is open already")
        elif frame.type == WINDOW:
            stream._granted(frame.credit)
        elif frame.type == SETTINGS:
            stream._settings(frame.fields)
        else:
            stream._arrived(frame)

    def close(self) -> None:
        try:
            self.ws.close()
        except Exception:
            pass


def _closed_reason(exc: Exception) -> str:
    rcvd = getattr(exc, "rcvd", None)
    reason = getattr(rcvd, "reason", "") if rcvd is not None else ""
    if reason:
        return f"the relay connection closed: {reason}"
    if isinstance(exc, wsclient.ConnectionClosed):
        return "the relay connection was lost" + (f" ({exc})" if str(exc).startswith("no answer") else "")
    return f"the relay connection was lost ({type(exc).__name__})"


#: Tries of a handshake that got no answer at all (see `connect`), and how long each waits for the answer.
HANDSHAKE_TRIES = 3
HANDSHAKE_WAIT_S = 10.0


def _unanswered(exc: BaseException) -> bool:
    """Whether a failed opening handshake got no HTTP answer at all (the connection closed or stayed silent)."""
    import ssl

    return isinstance(exc, (TimeoutError, EOFError, ConnectionResetError, BrokenPipeError, ssl.SSLEOFError, wsclient.ConnectionClosed))


def connect(url: str, token: str, verify: bool | str, *, timeout: float = 30.0, max_data: int = frames.LARGE_DATA) -> wsclient.WebSocket:
    """A WebSocket (gpulayer/relaylink/wsclient.py) to a relay route (`https://...` becomes `wss://...`), with the token and
    the protocol header; the CA file `verify` names (or the system's for True). It announces that it takes
    DATA frames of up to `max_data` bytes (MAX_DATA: announce nothing, as a peer from before that header).
    Raises what wsclient.connect does.

    A handshake that got no HTTP answer (the connection closed before the status line, or nothing came within
    HANDSHAKE_WAIT_S) is tried again, up to HANDSHAKE_TRIES times within `timeout`: granian, under load, drops
    about one TLS WebSocket upgrade in a hundred without answering it (docs/architecture.md, "The relay"). An
    unanswered handshake opened nothing on the control plane, so a new one is safe. An answer (401, 403, 426,
    a certificate the CA does not sign) is raised at once."""
    import time

    deadline = time.monotonic() + timeout
    for attempt in range(1, HANDSHAKE_TRIES + 1):
        left = deadline - time.monotonic()
        try:
            return _connect_once(url, token, verify, max(1.0, min(HANDSHAKE_WAIT_S, left)), max_data)
        except Exception as exc:
            if attempt == HANDSHAKE_TRIES or not _unanswered(exc) or deadline - time.monotonic() < 1.0:
                raise
            time.sleep(0.05 * attempt)
    raise AssertionError("unreachable")


def _connect_once(url: str, token: str, verify: bool | str, timeout: float, max_data: int = frames.LARGE_DATA) -> wsclient.WebSocket:
    import ssl

    from gpulayer.protocol import PROTOCOL, PROTOCOL_HEADER

    context = None
    if url.startswith("https://"):
        context = ssl.create_default_context(cafile=verify if isinstance(verify, str) else None)
        if verify is False:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
    return wsclient.connect(
        "ws" + url[len("http") :],
        ssl_context=context,
        timeout=timeout,
        max_size=frames.MAX_FRAME + max(0, max_data - frames.MAX_DATA),
        close_timeout=2,
        headers={
            "Authorization": f"Bearer {token}",
            PROTOCOL_HEADER: str(PROTOCOL),
            "User-Agent": "gpulayer-relay/1",
            **({frames.MAX_DATA_HEADER: str(max_data)} if max_data > frames.MAX_DATA else {}),
        },
    )  # closed by Link.close


__all__ = ["Link", "Stream", "LinkLost", "connect"]
