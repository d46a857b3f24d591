"""The agent's cap on `tcp` streams (issue 36 item 10): one past MAX_STREAMS is refused at once, and a place is
given back when its stream ends.

A unit test: reaching the cap for real takes MAX_STREAMS (256) streams held open at once, 512 agent threads,
which tests/security/test_security_ingress_flood.py stays under by the control plane's own caps.
"""

from __future__ import annotations

import threading

import pytest

from agent.relay import tcp as relay_tcp
from gpulayer.protocol.control import Close, StreamOpen
from gpulayer.protocol.fields import to_wire


class _Stream:
    def __init__(self) -> None:
        self.closed: list[dict] = []

    def close(self, message: Close) -> None:
        self.closed.append(to_wire(message))


def test_a_tcp_stream_past_the_cap_is_refused_at_once_and_places_come_back(monkeypatch):
    monkeypatch.setattr(relay_tcp, "_OPEN", threading.BoundedSemaphore(1))
    relay_tcp._OPEN.acquire()  # the one place is taken
    refused = _Stream()
    relay_tcp.serve(refused, StreamOpen(task_id=7, port=8000), lambda task_id: pytest.fail("looked up past the cap"))
    assert "tcp streams open already" in refused.closed[0]["error"], refused.closed
    relay_tcp._OPEN.release()
    ended = _Stream()
    relay_tcp.serve(ended, StreamOpen(task_id=7, port=8000), lambda task_id: None)  # served, and ends at once
    assert ended.closed[0]["error"] == "task 7 is not running on this worker"
    assert relay_tcp._OPEN.acquire(blocking=False)  # its place was given back
