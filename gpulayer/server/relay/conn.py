"""One accepted relay WebSocket on granian's asyncio loop: frames in through a callback, frames out through a queue.

Each connection writes from its own task, so a peer that reads slowly holds back only its own queue, never
the loop nor another connection. The queue stays bounded because every DATA frame in it was sent within the
credit the hub passed on for its receiver (server/relay/routes.py: at most what the receiver granted, capped
per stream and per connection, and counting what waits here); `queued` is what waits, and `drained()` runs
after each write, so credit held back for a full queue goes out as it empties. A peer whose queue passes
`hard_limit` anyway (control frames it asked for and never reads) loses its connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from gpulayer.protocol.relay import WS_GOING_AWAY, WS_POLICY

log = logging.getLogger("gpulayer.server.relay")

#: Seconds a closing connection's queue may take to drain before it is dropped.
DRAIN_S = 5.0


class Conn:
    """An accepted WebSocket (granian's RSGIWebsocketTransport): `send()` queues a frame, `close()` ends it."""

    #: Bytes that may wait in the queue before the connection is dropped (None: no bound; routes.py's credit
    #: caps keep DATA well under it, so only a peer that reads nothing of what it asked for reaches it).
    hard_limit: int | None = None

    def __init__(self, transport, label: str):
        self.transport = transport
        self.label = label
        self.outbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.queued = 0  # bytes in the outbox
        self.closing: str | None = None
        self.close_code = 1000
        self._writer: asyncio.Future | None = None

    def send(self, frame: bytes) -> None:
        """Queue one frame (nothing once closing); past `hard_limit` queued, the connection is dropped instead."""
        if self.closing is not None:
            return
        self.queued += len(frame)
        self.outbox.put_nowait(frame)
        if self.hard_limit is not None and self.queued > self.hard_limit:
            self.abort(WS_POLICY, f"{self.queued} bytes wait for a peer that does not read them")

    def drained(self) -> None:
        """A frame went out (`queued` is lower): a subclass passes on the credit it held back."""

    def abort(self, code: int, why: str) -> None:
        """Drop the connection now, what is queued with it (the writer may be stuck on a peer that reads nothing)."""
        self.close(code, why)
        if self._writer is not None:
            self._writer.cancel()

    def close(self, code: int, why: str) -> None:
        """End the connection once what is queued went out (the first reason is kept)."""
        if self.closing is None:
            self.closing, self.close_code = why, code
            self.outbox.put_nowait(None)

    async def pump(self, on_frame: Callable[[bytes | str], None]) -> None:
        """Read frames into `on_frame` (which may call close()) until either side closes; then drain the queue.

        One plain `await receive()` per frame (no task or wait() per frame: the bulk of a forward's frames come
        through here); the writer's end (closed here, or the peer stopped reading) cancels the read."""
        reader = asyncio.current_task()
        self._writer = asyncio.ensure_future(self._write())
        stopped = finished = False

        def writer_ended(_) -> None:
            nonlocal stopped
            if not finished and reader is not None and not reader.done():
                stopped = True
                reader.cancel()

        self._writer.add_done_callback(writer_ended)
        try:
            while self.closing is None:
                message = await self.transport.receive()
                if int(message.kind) == 0:  # close
                    break
                on_frame(message.data)
        except asyncio.CancelledError:
            if not stopped:
                raise
            assert reader is not None
            reader.uncancel()
        except Exception as exc:  # granian's ProtocolClosed and the like: the peer is gone
            log.debug("relay_conn_lost conn=%s error=%r", self.label, exc)
        finally:
            finished = True
            self.close(WS_GOING_AWAY if self.closing is None else self.close_code, self.closing or "closed by the peer")
            await asyncio.wait({self._writer}, timeout=DRAIN_S)  # an abort()ed writer is done at once
            self._writer.cancel()

    async def _write(self) -> None:
        try:
            while True:
                frame = await self.outbox.get()
                if frame is None:
                    return
                await self.transport.send_bytes(frame)
                self.queued -= len(frame)
                self.drained()
        except Exception as exc:  # the peer went away while frames were going out
            log.debug("relay_conn_write_failed conn=%s error=%r", self.label, exc)
            if self.closing is None:
                self.closing, self.close_code = "the connection failed", WS_GOING_AWAY
