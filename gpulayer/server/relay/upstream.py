"""The ingress's side of its relay streams (server/relay/ingress.py): `Ends` holds them for the hub, `Upstream` is
one `tcp` stream to a replica's port used from coroutines on the loop, `Body` a request's body read once (its
first RETRY_BODY_BYTES kept for a retry), `next_event` the replica's HTTP/1.1 answer parsed as it arrives.
"""

from __future__ import annotations

import asyncio
import logging

import h11

from gpulayer.protocol.control import Close
from gpulayer.protocol.fields import from_wire, to_wire
from gpulayer.protocol.relay import CLOSE, DATA, EOF, EXT_DATA, MAX_DATA, WINDOW, Credit, data, decode, encode
from gpulayer.server.relay.hub import Hub

log = logging.getLogger("gpulayer.server.ingress")

RETRY_BODY_BYTES = 1 << 20
GRANT_EVERY = 64 * 1024


class UpstreamFailed(Exception):
    """The replica's connection failed (`answered`: after the first byte of its response)."""

    def __init__(self, message: str, answered: bool = False):
        super().__init__(message)
        self.answered = answered



class Ends:
    """The client's ends of the ingress's streams (the hub's `conn` for them): frames from the hub land here."""

    label = "ingress"

    def __init__(self) -> None:
        self.routes: dict = {}  # the hub's Routes by stream id (Hub.open_stream fills it)
        self.streams: dict[int, Upstream] = {}
        self.closing = None
        self._next = 0

    def next_sid(self) -> int:
        self._next += 1
        return self._next

    def send(self, raw: bytes) -> None:
        frame = decode(raw)
        stream = self.streams.get(frame.stream_id)
        if stream is not None:
            stream.arrived(frame.type, frame)

    def close(self, code: int, why: str) -> None:  # the hub's answer to a broken frame of ours: a bug here
        log.error("ingress_stream_broken code=%d why=%s", code, why)


class Upstream:
    """One `tcp` stream to a replica's port, used from coroutines on the loop: `write` within credit, `read`."""

    def __init__(self, hub: Hub, ends: Ends, sid: int):
        self.hub, self.ends, self.sid = hub, ends, sid
        self.credit = Credit()
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.wake = asyncio.Event()
        self.ended: Close | None = None
        self.got = 0  # bytes received
        self._unacked = 0

    def arrived(self, kind: int, frame) -> None:
        if kind == WINDOW:
            self.credit.grant(frame.credit)
            self.wake.set()
            return
        if kind == CLOSE:
            self.ended = from_wire(Close, frame.fields)
            self.ends.streams.pop(self.sid, None)
            self.wake.set()
        self.inbox.put_nowait(frame)

    async def write(self, chunk: bytes) -> None:
        """Send `chunk` as DATA, waiting for credit; UpstreamFailed once the stream ended."""
        view = memoryview(chunk)
        while view:
            while self.credit.left <= 0 and self.ended is None:
                self.wake.clear()
                await self.wake.wait()
            if self.ended is not None:
                raise UpstreamFailed(str(self.ended.error or "the replica closed the connection"), self.got > 0)
            size = min(self.credit.left, MAX_DATA, len(view))
            self.credit.take(size)
            self.hub.client_frame(self.ends, data(self.sid, bytes(view[:size])))
            view = view[size:]

    async def read(self) -> bytes:
        """The next bytes from the replica; b"" once it closed its side; UpstreamFailed when the stream broke."""
        frame = await self.inbox.get()
        if frame.type in (DATA, EXT_DATA):
            self.got += len(frame.data)
            self._unacked += len(frame.data)
            if self._unacked >= GRANT_EVERY and self.ended is None:
                self.hub.client_frame(self.ends, encode(self.sid, WINDOW, self._unacked))
                self._unacked = 0
            return frame.data
        if frame.type == EOF:
            return b""
        if frame.type == CLOSE:
            self.inbox.put_nowait(frame)  # every later read sees the end too
            error = from_wire(Close, frame.fields).error
            if error:
                raise UpstreamFailed(str(error), self.got > 0)
            return b""
        return await self.read()

    def close(self) -> None:
        """End the stream from here (nothing when it ended already)."""
        self.ends.streams.pop(self.sid, None)
        if self.ended is None:
            self.ended = Close(reason="closed by the ingress")
            self.hub.client_frame(self.ends, encode(self.sid, CLOSE, to_wire(Close(reason="the ingress is done with it"))))


class Body:
    """A request's body from granian (None: it has none), read once, its first RETRY_BODY_BYTES kept for a retry."""

    def __init__(self, proto):
        self.source = proto.__aiter__() if proto is not None else None
        self.kept: list[bytes] | None = []
        self.size = 0
        self.done = proto is None

    async def chunks(self):
        for chunk in list(self.kept or ()):
            yield chunk
        if self.kept is None and self.size:  # read past what was kept: a retry cannot replay it
            raise UpstreamFailed("the request's body cannot be sent again")
        while not self.done and self.source is not None:
            try:
                chunk = await self.source.__anext__()
            except StopAsyncIteration:
                self.done = True
                return
            if not chunk:
                continue
            self.size += len(chunk)
            if self.kept is not None:
                if self.size <= RETRY_BODY_BYTES:
                    self.kept.append(chunk)
                else:
                    self.kept = None
            yield chunk

    def replayable(self) -> bool:
        """Whether a retry can send the body again: there is none, or it was read whole and kept."""
        return self.source is None or (self.done and self.kept is not None)


async def next_event(conn: h11.Connection, upstream: Upstream, wanted: tuple):
    """The next of the `wanted` h11 events of the replica's answer (informational answers skipped)."""
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            raise UpstreamFailed(f"the replica's answer is no valid HTTP/1.1: {exc}", upstream.got > 0) from None
        if event is h11.NEED_DATA:
            conn.receive_data(await upstream.read())
            continue
        if isinstance(event, wanted):
            return event
        if isinstance(event, h11.ConnectionClosed):
            raise UpstreamFailed("the replica closed the connection before it answered", upstream.got > 0)


__all__ = ["Body", "Ends", "Upstream", "UpstreamFailed", "next_event", "RETRY_BODY_BYTES"]
