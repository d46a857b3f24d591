"""The relay's frames: what the agent, the control plane and the client put in each WebSocket message.

Each binary WebSocket message is one frame (docs/protocol.md, "The relay"):

    stream_id  u32, big-endian   which stream of the connection (1 .. 2**32-1; 0 is never used)
    type       u8                OPEN, DATA, WINDOW, EOF, CLOSE, EXT_DATA, SIGNAL, RESIZE, SETTINGS
    payload    the rest          per type, below

- OPEN: JSON object: `kind` ("exec"), `job_id`, `task_id`, and the kind's own fields (exec: `argv`).
- DATA: bytes of the stream's main channel (exec: stdin towards the command, stdout back).
- EXT_DATA: one byte naming a channel (2: stderr), then bytes; counted against the same window as DATA.
- WINDOW: u32, bytes of credit granted: the receiver read that many more and the sender may send them.
- EOF: empty: no more DATA this way (a half-close: stdin's end).
- CLOSE: JSON object: `exit_code` (int) and/or `error` (text), `reason` (text); the stream is gone.
- SIGNAL: JSON object `{"signal": "INT"}` (exec, later the shell): a signal for the remote command.
- RESIZE: JSON object `{"rows", "cols"}`: the shell's new window size (the client's SIGWINCH).
- SETTINGS: JSON object `{"max_data": N}`: the sender of this frame's receiver may put up to N bytes in one
  DATA frame on this stream (the control plane to a client that announced `MAX_DATA_HEADER`, below).

SIGNAL, RESIZE and SETTINGS carry at most `MAX_CONTROL` (1 KiB) of payload, and at most `MAX_WAITING_CONTROL`
control frames may wait unread in a stream's receiver: they are outside flow control, so these bound them.

The JSON objects of OPEN (per kind), CLOSE, SIGNAL, RESIZE and SETTINGS are declared in control.py, field by
field; senders build those and readers read them through them.

The shell's OPEN also carries `rows`, `cols` (the window at the start), `term` (the client's TERM) and,
optionally, `argv` (a command instead of the task's shell); its DATA is what is typed and what the remote
terminal shows.

Flow control: after OPEN each side may send `INITIAL_WINDOW` bytes of DATA and EXT_DATA, and more only as the
other grants them with WINDOW.

Frame size: a DATA frame carries at most `MAX_DATA` (64 KiB) unless both ends of its hop said more. A peer that
takes larger frames says so at its WebSocket handshake (`MAX_DATA_HEADER`: the most it accepts, up to
`LARGE_DATA`); the control plane then tells each end what it may send on a stream: the agent in the OPEN
(`max_data`), the client with a SETTINGS frame (sent only to a client that announced, so an older one never
sees the type). A peer that never hears either sends 64 KiB frames, as before.

Imports nothing of gpulayer: the agent, the client and the control plane share it.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

OPEN, DATA, WINDOW, EOF, CLOSE, EXT_DATA, SIGNAL, RESIZE, SETTINGS = 1, 2, 3, 4, 5, 6, 7, 8, 9
TYPE_NAMES = {
    OPEN: "OPEN",
    DATA: "DATA",
    WINDOW: "WINDOW",
    EOF: "EOF",
    CLOSE: "CLOSE",
    EXT_DATA: "EXT_DATA",
    SIGNAL: "SIGNAL",
    RESIZE: "RESIZE",
    SETTINGS: "SETTINGS",
}
JSON_TYPES = frozenset({OPEN, CLOSE, SIGNAL, RESIZE, SETTINGS})

HEADER = struct.Struct(">IB")
U32 = struct.Struct(">I")
MAX_STREAM_ID = 2**32 - 1
#: Bytes each side may send on a new stream before the other grants more (WINDOW).
INITIAL_WINDOW = 256 * 1024
#: The window a bulk stream's receiver widens to at its start (`tcp`, SSH; one WINDOW of the difference): the
#: protocol's 256 KiB keeps four 64 KiB frames in flight, too few to cover three hops' round trip.
BULK_WINDOW = 4 * 1024 * 1024
#: The most payload one DATA frame carries (a sender splits larger writes).
MAX_DATA = 64 * 1024
#: The largest frame anyone accepts by default: a DATA frame's payload plus its header, or a JSON object.
MAX_FRAME = MAX_DATA + 64
#: The most payload a SIGNAL, RESIZE or SETTINGS frame carries: a few dozen bytes of JSON are all they need,
#: and they are not flow-controlled (decode() refuses more; issue 36: 256 KiB SIGNALs queued in the agent).
MAX_CONTROL = 1024
#: Control frames (SIGNAL, RESIZE, EOF, ...) that may wait unread in a stream's inbox: one more, and the stream
#: is closed with an error (gpulayer/relaylink/streams.py). They are not flow-controlled, so this bounds what they cost.
MAX_WAITING_CONTROL = 64
#: Types whose payload is capped at MAX_CONTROL.
SMALL_TYPES = frozenset({SIGNAL, RESIZE, SETTINGS})
#: The most DATA one frame may carry between peers that both said they take it (`MAX_DATA_HEADER`): a quarter
#: as many frames per byte, so a quarter of the per-frame work (thread hops, the control plane's futures and
#: wake-ups), while a frame stays small beside the 4 MiB window a bulk stream keeps in flight.
LARGE_DATA = 256 * 1024
#: The WebSocket handshake's request header by which an agent or a client says the most DATA per frame it
#: accepts (MAX_DATA up to LARGE_DATA); a control plane that knows it no header is simply ignored.
MAX_DATA_HEADER = "X-GpuLayer-Relay-Max-Data"
STDERR = 2
#: Stream kinds this protocol names; which of them an agent serves it says at register (`relay.kinds`).
KINDS = ("exec", "shell", "tcp", "ssh")
#: Kinds that run a command in the task, which `--no-exec` refuses.
COMMAND_KINDS = frozenset({"exec", "shell", "ssh"})
#: Signals a SIGNAL frame may name.
SIGNALS = ("INT", "TERM", "HUP", "QUIT", "KILL", "TSTP", "CONT", "WINCH", "USR1", "USR2")
#: WebSocket close codes the relay uses besides 1000 (normal).
WS_POLICY = 1008  # a malformed frame or a credit overrun (granian closes an accepted WebSocket without a code)
WS_GOING_AWAY = 1001  # the control plane is stopping, or the other end went away


class FrameError(ValueError):
    """A frame that breaks the format: the connection that sent it is closed with WS_POLICY."""


@dataclass(frozen=True)
class Frame:
    """One decoded frame; `payload` is bytes (DATA, EXT_DATA), an int (WINDOW), a dict (JSON types) or b"" (EOF)."""

    stream_id: int
    type: int
    payload: bytes | int | dict

    @property
    def data(self) -> bytes:
        """The bytes of a DATA or EXT_DATA frame (EXT_DATA without its channel byte)."""
        assert isinstance(self.payload, bytes)
        return self.payload[1:] if self.type == EXT_DATA else self.payload

    @property
    def channel(self) -> int:
        """1 for DATA, the channel byte of EXT_DATA (2: stderr)."""
        assert isinstance(self.payload, bytes)
        return self.payload[0] if self.type == EXT_DATA else 1

    @property
    def fields(self) -> dict:
        """The JSON object of an OPEN, CLOSE, SIGNAL, RESIZE or SETTINGS frame."""
        assert isinstance(self.payload, dict)
        return self.payload

    @property
    def credit(self) -> int:
        """Bytes granted by a WINDOW frame."""
        assert isinstance(self.payload, int)
        return self.payload

    def cost(self) -> int:
        """Bytes of window this frame uses up (DATA and EXT_DATA count; nothing else does)."""
        return len(self.data) if self.type in (DATA, EXT_DATA) else 0


def encode(stream_id: int, type_: int, payload: bytes | int | dict = b"") -> bytes:
    """One frame's bytes; ValueError for a stream id or type out of range."""
    if not 0 < stream_id <= MAX_STREAM_ID:
        raise ValueError(f"stream id {stream_id}: must be 1 to {MAX_STREAM_ID}")
    if type_ not in TYPE_NAMES:
        raise ValueError(f"frame type {type_}: unknown")
    if type_ in JSON_TYPES:
        body = json.dumps(payload, separators=(",", ":")).encode()
    elif type_ == WINDOW:
        assert isinstance(payload, int)
        body = U32.pack(payload)
    else:
        assert isinstance(payload, bytes)
        body = payload
    return HEADER.pack(stream_id, type_) + body


def data(stream_id: int, chunk: bytes | memoryview, channel: int = 1) -> bytes:
    """A DATA frame (channel 1) or an EXT_DATA frame of `channel`."""
    if channel == 1:
        return HEADER.pack(stream_id, DATA) + chunk
    return HEADER.pack(stream_id, EXT_DATA) + bytes((channel,)) + chunk


def accepted_data(value: object) -> int:
    """The DATA per frame a peer's MAX_DATA_HEADER (or OPEN's or SETTINGS' `max_data`) allows: clamped to
    MAX_DATA .. LARGE_DATA; MAX_DATA for anything absent or malformed."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 10:
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        return MAX_DATA
    return max(MAX_DATA, min(LARGE_DATA, value))


def decode(message: bytes | bytearray | memoryview | str, max_data: int = MAX_DATA) -> Frame:
    """The frame in one WebSocket message; FrameError for a text message, a short or oversized one (DATA over
    `max_data`, SIGNAL, RESIZE or SETTINGS over MAX_CONTROL), an unknown type, stream id 0, a bad WINDOW or a JSON payload that is not an object."""
    if isinstance(message, str):
        raise FrameError("the relay takes binary messages only, not text")
    raw = memoryview(message)
    if len(raw) < HEADER.size:
        raise FrameError(f"a frame of {len(raw)} bytes is shorter than its {HEADER.size}-byte header")
    limit = max(MAX_FRAME, max_data + MAX_FRAME - MAX_DATA)
    if len(raw) > limit:
        raise FrameError(f"a frame of {len(raw)} bytes is over the limit of {limit}")
    stream_id, type_ = HEADER.unpack_from(raw)
    body = bytes(raw[HEADER.size :])  # the one copy of a DATA frame's bytes
    if stream_id == 0:
        raise FrameError("stream id 0 is not a stream")
    if type_ not in TYPE_NAMES:
        raise FrameError(f"frame type {type_} is unknown")
    if type_ in SMALL_TYPES and len(body) > MAX_CONTROL:
        raise FrameError(f"{TYPE_NAMES[type_]}: a payload of {len(body)} bytes, over the {MAX_CONTROL} a control frame may carry")
    if type_ in JSON_TYPES:
        try:
            fields = json.loads(body)
        except ValueError:
            raise FrameError(f"{TYPE_NAMES[type_]}: the payload is not JSON") from None
        if not isinstance(fields, dict):
            raise FrameError(f"{TYPE_NAMES[type_]}: the payload must be a JSON object")
        return Frame(stream_id, type_, fields)
    if type_ == WINDOW:
        if len(body) != U32.size:
            raise FrameError(f"WINDOW: the payload must be {U32.size} bytes, not {len(body)}")
        credit = U32.unpack(body)[0]
        if credit == 0:
            raise FrameError("WINDOW: a grant of 0 bytes")
        return Frame(stream_id, type_, credit)
    if type_ == EXT_DATA and not body:
        raise FrameError("EXT_DATA: the payload needs its channel byte")
    if type_ == EOF and body:
        raise FrameError("EOF: carries no payload")
    if len(body) - (type_ == EXT_DATA) > max_data:
        raise FrameError(f"{TYPE_NAMES[type_]}: over {max_data} bytes")
    return Frame(stream_id, type_, body)


class Credit:
    """What a sender may still send on one stream (`left`), and a check of what the other side sends it.

    Not thread-safe by itself: one side's sender holds it under its own lock (agent, client), or on one
    asyncio loop (control plane).
    """

    def __init__(self, window: int = INITIAL_WINDOW):
        self.left = window

    def take(self, size: int) -> None:
        """Spend `size` bytes; FrameError when they were not granted."""
        if size > self.left:
            raise FrameError(f"{size} bytes sent with {self.left} bytes of credit left")
        self.left -= size

    def grant(self, size: int) -> None:
        self.left += size
        if self.left > MAX_STREAM_ID:
            raise FrameError("WINDOW: credit over 2**32 - 1 bytes")


__all__ = [
    "Frame",
    "FrameError",
    "Credit",
    "encode",
    "decode",
    "data",
    "OPEN",
    "DATA",
    "WINDOW",
    "EOF",
    "CLOSE",
    "EXT_DATA",
    "SIGNAL",
    "RESIZE",
    "SETTINGS",
    "accepted_data",
    "INITIAL_WINDOW",
    "BULK_WINDOW",
    "MAX_DATA",
    "MAX_FRAME",
    "MAX_CONTROL",
    "MAX_WAITING_CONTROL",
    "LARGE_DATA",
    "MAX_DATA_HEADER",
    "STDERR",
    "KINDS",
    "COMMAND_KINDS",
    "SIGNALS",
]
