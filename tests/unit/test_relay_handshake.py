"""`gpulayer.relaylink.streams.connect`: a WebSocket handshake that got no answer is tried again; an answer is not.

A real granian server (plain HTTP) with a WebSocket echo handler, behind a real TCP proxy that closes the
first `drop` connections it accepts without a byte (what granian does, under load, to about one TLS upgrade
in a hundred: docs/architecture.md, "The relay").
"""
from __future__ import annotations

import socket
import threading

import pytest
from sockets import join, ws_echo

from gpulayer.relaylink import streams, wsclient
from gpulayer.server.frontends.granian_server import GranianServer

pytest.importorskip("granian")


def app(environ, start_response):
    start_response("404 Not Found", [("Content-Type", "text/plain")])
    return [b"no"]


class DroppingProxy:
    """Accepts on a loopback port; closes the first `drop` connections at once, pipes the others to `port`."""

    def __init__(self, port: int, drop: int):
        self.port, self.drop, self.accepted = port, drop, 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            if self.accepted <= self.drop:
                client.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.port))
            join(client, upstream)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def server():
    srv = GranianServer(app, "127.0.0.1", 0, threads=2, websocket=ws_echo)
    srv.start()
    yield srv
    srv.stop(timeout=2)


def test_an_unanswered_handshake_is_tried_again(server):
    proxy = DroppingProxy(server.port, drop=streams.HANDSHAKE_TRIES - 1)
    try:
        ws = streams.connect(f"http://127.0.0.1:{proxy.address}/echo", "token", False, timeout=10)
        with ws:
            ws.send(b"hello")
            assert ws.recv(timeout=5) == b"hello"
        assert proxy.accepted == streams.HANDSHAKE_TRIES
    finally:
        proxy.close()


def test_handshakes_are_tried_a_bounded_number_of_times(server):
    proxy = DroppingProxy(server.port, drop=100)
    try:
        with pytest.raises((EOFError, ConnectionResetError, BrokenPipeError)):  # the close may come before or after the request went
            streams.connect(f"http://127.0.0.1:{proxy.address}/echo", "token", False, timeout=10)
        assert proxy.accepted == streams.HANDSHAKE_TRIES
    finally:
        proxy.close()


def test_an_answered_refusal_is_not_tried_again(server):
    proxy = DroppingProxy(server.port, drop=0)
    try:
        with pytest.raises(wsclient.Refused) as refused:
            streams.connect(f"http://127.0.0.1:{proxy.address}/refuse", "token", False, timeout=10)
        assert refused.value.response.status_code == 403
        assert proxy.accepted == 1
    finally:
        proxy.close()
