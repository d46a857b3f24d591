"""The relay's frame codec and credit (gpulayer/protocol/relay.py): what decodes, what is refused, never a crash."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpulayer.protocol import relay
from gpulayer.protocol.relay import CLOSE, DATA, EOF, EXT_DATA, INITIAL_WINDOW, MAX_DATA, OPEN, SIGNAL, WINDOW, Credit, FrameError, decode, encode


def test_each_type_round_trips():
    assert decode(encode(7, OPEN, {"kind": "exec", "argv": ["ls"]})).fields == {"kind": "exec", "argv": ["ls"]}
    frame = decode(relay.data(3, b"hello"))
    assert (frame.stream_id, frame.type, frame.data, frame.channel, frame.cost()) == (3, DATA, b"hello", 1, 5)
    frame = decode(relay.data(3, b"oops", relay.STDERR))
    assert (frame.type, frame.data, frame.channel, frame.cost()) == (EXT_DATA, b"oops", 2, 4)
    assert decode(encode(1, WINDOW, 65536)).credit == 65536
    assert decode(encode(1, EOF)).payload == b""
    assert decode(encode(2**32 - 1, CLOSE, {"exit_code": 3})).fields["exit_code"] == 3
    assert decode(encode(1, SIGNAL, {"signal": "INT"})).cost() == 0


@pytest.mark.parametrize(
    "message, words",
    [
        ("text", "binary"),
        (b"\x00\x00\x01", "shorter"),
        (struct.pack(">IB", 0, DATA), "stream id 0"),
        (struct.pack(">IB", 1, 99), "unknown"),
        (struct.pack(">IB", 1, OPEN) + b"{nope", "not JSON"),
        (struct.pack(">IB", 1, OPEN) + b"[1]", "JSON object"),
        (struct.pack(">IB", 1, WINDOW) + b"\x00\x01", "4 bytes"),
        (struct.pack(">IB", 1, WINDOW) + b"\x00\x00\x00\x00", "0 bytes"),
        (struct.pack(">IB", 1, EXT_DATA), "channel"),
        (struct.pack(">IB", 1, EOF) + b"x", "no payload"),
        (struct.pack(">IB", 1, DATA) + b"x" * (MAX_DATA + 1), "over"),
        (struct.pack(">IB", 1, CLOSE) + json.dumps({"a": "x" * 70000}).encode(), "over the limit"),
    ],
)
def test_malformed_frames_are_refused_by_name(message, words):
    with pytest.raises(FrameError, match=words):
        decode(message)


@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_frame_error(message):
    try:
        decode(message)
    except FrameError:
        pass


def test_encode_refuses_a_stream_id_or_type_out_of_range():
    with pytest.raises(ValueError):
        encode(0, DATA, b"")
    with pytest.raises(ValueError):
        encode(1, 42, b"")


def test_credit_is_spent_and_granted_and_an_overrun_is_refused():
    credit = Credit()
    credit.take(INITIAL_WINDOW)
    with pytest.raises(FrameError, match="credit"):
        credit.take(1)
    credit.grant(10)
    credit.take(10)
    with pytest.raises(FrameError):
        credit.grant(2**32)


def test_larger_frames_decode_only_up_to_the_size_given():
    big = relay.data(5, b"x" * relay.LARGE_DATA)
    with pytest.raises(FrameError, match="over"):
        decode(big)  # a peer that announced nothing keeps 64 KiB
    assert decode(big, relay.LARGE_DATA).cost() == relay.LARGE_DATA
    with pytest.raises(FrameError, match="over"):
        decode(relay.data(5, b"x" * (relay.LARGE_DATA + 1)), relay.LARGE_DATA)
    assert decode(encode(5, relay.SETTINGS, {"max_data": relay.LARGE_DATA})).fields == {"max_data": relay.LARGE_DATA}


@pytest.mark.parametrize(
    "value, taken",
    [
        (None, MAX_DATA),
        ("", MAX_DATA),
        ("lots", MAX_DATA),
        ("-5", MAX_DATA),
        ("1" * 40, MAX_DATA),
        (True, MAX_DATA),
        (1024, MAX_DATA),
        ("131072", 131072),
        (131072, 131072),
        (str(relay.LARGE_DATA), relay.LARGE_DATA),
        (10**9, relay.LARGE_DATA),
    ],
)
def test_a_peers_frame_size_is_read_and_clamped(value, taken):
    assert relay.accepted_data(value) == taken


def test_control_frames_carry_at_most_max_control_bytes():
    """Issue 36 item 9: SIGNAL, RESIZE and SETTINGS are outside flow control, so their size is bounded."""
    small = encode(1, SIGNAL, {"signal": "INT", "pad": "x" * (relay.MAX_CONTROL - 40)})
    assert decode(small, relay.LARGE_DATA).fields["signal"] == "INT"
    for kind in (SIGNAL, relay.RESIZE, relay.SETTINGS):
        big = encode(1, kind, {"pad": "x" * relay.MAX_CONTROL})
        with pytest.raises(FrameError, match="over the 1024 a control frame may carry"):
            decode(big, relay.LARGE_DATA)
    assert decode(encode(1, OPEN, {"kind": "exec", "argv": ["x" * 60000]})).fields["kind"] == "exec"  # OPEN keeps MAX_FRAME
