"""The relay's streams as the hub holds them: a Route joins a client's end to an agent's, and its credit each way.

Credit is end to end in what it means (a receiver grants what it will take), but the hub passes it on capped:
what a receiver granted waits here (`Flow.banked`) and goes on to the sender only while that sender's credit
on the stream stays within STREAM_CREDIT and, towards a client, the connection's outstanding credit and queued
bytes stay within CONN_CREDIT (each stream keeping at least its INITIAL_WINDOW going while the queue is under
CONN_CREDIT); towards an agent's link, while its queued bytes stay within LINK_QUEUE. So a client that grants
itself 4 GiB and reads nothing holds a few CONN_CREDIT of the control plane's memory at most (its connection is
dropped past ClientConn.hard_limit), and one that reads slowly is flow-controlled: the credit it granted goes
on as its queue empties (Conn.drained).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from gpulayer.protocol.relay import (
    BULK_WINDOW,
    DATA,
    HEADER,
    INITIAL_WINDOW,
    LARGE_DATA,
    MAX_DATA,
    MAX_DATA_HEADER,
    MAX_FRAME,
    MAX_STREAM_ID,
    U32,
    WINDOW,
    Credit,
    FrameError,
    accepted_data,
    encode,
)
from gpulayer.server.relay.conn import Conn
from gpulayer.server.runtime.relay_wants import Wants

#: The most credit the hub lets a sender hold on one stream, whatever its receiver granted: the window a bulk
#: stream's receiver widens to (BULK_WINDOW), so a well-behaved peer never notices the cap.
STREAM_CREDIT = BULK_WINDOW
#: The most a client's connection holds for it, all its streams together: credit passed on and bytes queued.
CONN_CREDIT = 4 * BULK_WINDOW
#: The most bytes queued towards an agent's link before the hub stops passing its streams' credit on.
LINK_QUEUE = 16 * BULK_WINDOW
#: The smallest WINDOW the hub passes on while more is banked (no storm of tiny grants as a queue drains).
MIN_GRANT = MAX_DATA
#: The largest frame the hub reads from anyone: a LARGE_DATA DATA frame (whether its sender may send one on
#: its stream is the route's check: Route.carried).
LARGE_FRAME = MAX_FRAME + LARGE_DATA - MAX_DATA


class Flow:
    """One way of a stream: what its sender may still send (`credit`, checked on each DATA) and what its
    receiver granted that the hub keeps back for now (`banked`)."""

    __slots__ = ("credit", "banked")

    def __init__(self) -> None:
        self.credit = Credit()
        self.banked = 0


@dataclass(eq=False)
class Route:
    """One stream: the client's end, the agent's end once its link is there, and the credit each way."""

    client: ClientConn  # or the ingress's ends (server/relay/ingress.py), which queue nothing
    client_sid: int
    kind: str
    user: str
    job_id: int
    agent: AgentLink | None = None
    agent_sid: int = 0
    session_id: int | None = None
    pending: list[bytes] = field(default_factory=list)  # the client's frames before the agent's end exists
    up: Flow = field(default_factory=Flow)  # towards the task: the client sends, the agent grants
    down: Flow = field(default_factory=Flow)  # from the task: the agent sends, the client grants
    up_data: int = MAX_DATA  # the most DATA per frame the client may send (what the agent's link takes)
    down_data: int = MAX_DATA  # ... and the agent (what the client's connection takes)
    bytes_in: int = 0
    bytes_out: int = 0
    active_at: float = field(default_factory=time.monotonic)
    ended: bool = False
    counted: bool = True  # in the per-user and per-job caps (the ingress's streams are not: open_stream)

    def carried(self, size: int, counts: Wants, *, up: bool) -> None:
        """`size` bytes of DATA crossed towards the task (`up`) or from it: spent from that way's credit
        (FrameError past it, or in a frame over the size that way's receiver takes), counted in the row's and
        the metrics' bytes, and the stream is active."""
        if size > (self.up_data if up else self.down_data):
            raise FrameError(f"a DATA frame of {size} bytes, over the {self.up_data if up else self.down_data} this stream takes")
        if up:
            self.up.credit.take(size)
            self.bytes_in += size
            counts.bytes_in[self.kind] += size
        else:
            self.down.credit.take(size)
            self.bytes_out += size
            counts.bytes_out[self.kind] += size
        self.active_at = time.monotonic()

    def granted(self, size: int, *, up: bool) -> None:
        """The receiver of one way granted `size` bytes (a WINDOW): banked, and passed on as far as the caps
        allow. FrameError when its grants pass 2**32-1 bytes of credit."""
        flow = self.up if up else self.down
        flow.banked += size
        if flow.banked + flow.credit.left > MAX_STREAM_ID:
            raise FrameError("WINDOW: credit over 2**32 - 1 bytes")
        self.release(up=up)

    def release(self, *, up: bool) -> None:
        """Pass on what is banked for one way, within the stream's cap and its receiver's room; what is left
        waits for that receiver's queue to drain (its `starved` set)."""
        flow = self.up if up else self.down
        sender, receiver = (self.client, self.agent) if up else (self.agent, self.client)
        if self.ended or sender is None or receiver is None or flow.banked <= 0:
            return
        give = min(flow.banked, STREAM_CREDIT - flow.credit.left, room(receiver, flow))
        if give >= min(flow.banked, MIN_GRANT):
            flow.banked -= give
            flow.credit.grant(give)
            sender.send(encode(self.client_sid if up else self.agent_sid, WINDOW, give))
        if isinstance(receiver, (ClientConn, AgentLink)):
            if flow.banked:
                receiver.starved.add(self)
            else:
                receiver.starved.discard(self)

    def forget(self) -> None:
        """The stream ended: nothing of it waits for room any more, and what it held is room for the others."""
        for conn in (self.client, self.agent):
            if isinstance(conn, (ClientConn, AgentLink)):
                conn.starved.discard(self)
                if conn.starved:
                    conn.drained()


def room(conn, flow: Flow) -> int:
    """Credit the hub may still pass on for DATA towards `conn` on `flow`'s stream. A client's connection: none
    while CONN_CREDIT bytes wait in its queue, else CONN_CREDIT less its queue and what all its streams may
    still be sent, but always enough to keep this stream's INITIAL_WINDOW going (so streams that hold credit
    and send nothing never starve a new one). An agent's link: LINK_QUEUE less its queue. The ingress's ends
    (no queue: what reaches them is read on the loop): whatever the stream's cap allows."""
    if isinstance(conn, ClientConn):
        if conn.queued >= CONN_CREDIT:
            return 0
        total = sum(route.down.credit.left for route in conn.routes.values())
        return max(CONN_CREDIT - conn.queued - total, INITIAL_WINDOW - flow.credit.left)
    if isinstance(conn, AgentLink):
        return LINK_QUEUE - conn.queued
    return STREAM_CREDIT


class ClientConn(Conn):
    """A client's relay WebSocket: the streams it opened (`routes`, by its stream ids)."""

    hard_limit = 3 * CONN_CREDIT

    def __init__(self, transport, principal, token: str, job_id: int, index: int | None, kind: str, max_data: int = MAX_DATA):
        super().__init__(transport, f"client {principal.actor} job {job_id}")
        self.principal, self.job_id, self.index, self.kind = principal, job_id, index, kind
        self.token = token  # authenticated again at each OPEN (never logged)
        self.max_data = max_data  # the most DATA per frame it takes (its handshake's MAX_DATA_HEADER)
        self.routes: dict[int, Route] = {}
        self.starved: set[Route] = set()  # streams whose credit waits for room here
        self.idle_since: float | None = time.monotonic()  # when its last stream ended (None: one is open)
        self.opened = False  # whether it opened a stream yet

    def drained(self) -> None:
        for route in list(self.starved):
            route.release(up=False)


class AgentLink(Conn):
    """An agent's relay WebSocket: the streams the hub opened on it (`routes`, by the hub's ids there)."""

    hard_limit = 4 * LINK_QUEUE

    def __init__(self, transport, worker_id: int, max_data: int = MAX_DATA):
        super().__init__(transport, f"worker {worker_id}")
        self.worker_id = worker_id
        self.max_data = max_data  # the most DATA per frame its agent takes (its handshake's MAX_DATA_HEADER)
        self.routes: dict[int, Route] = {}
        self.starved: set[Route] = set()
        self._next = 0

    def next_sid(self) -> int:
        self._next += 1
        return self._next

    def drained(self) -> None:
        for route in list(self.starved):
            route.release(up=True)


def raw(message: bytes | str) -> bytes:
    """A message decode() accepted (so bytes) as bytes."""
    return message if isinstance(message, bytes) else bytes(message, "latin-1")


def rewrite(frame: bytes, stream_id: int) -> bytes:
    """The frame with another stream id: one copy of the payload (DATA frames are most of the bytes)."""
    return b"".join((U32.pack(stream_id), memoryview(frame)[4:]))


def max_data(scope) -> int:
    """What the peer said at its handshake it takes per DATA frame (MAX_DATA_HEADER; MAX_DATA when silent)."""
    return accepted_data(scope.headers.get(MAX_DATA_HEADER.lower()))


def bulk(message: bytes | str) -> tuple[int, int] | None:
    """(stream id, payload size) of a well-formed DATA frame, read from its header alone (no decode, no copy of
    the payload): the hub's path for the bulk of the bytes. None for any other frame: decode() takes it."""
    if isinstance(message, bytes) and HEADER.size < len(message) <= LARGE_FRAME and message[4] == DATA:
        stream_id = U32.unpack_from(message)[0]
        if stream_id:
            return stream_id, len(message) - HEADER.size
    return None
