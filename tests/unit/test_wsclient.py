"""gpulayer/relaylink/wsclient.py, the relay links' WebSocket client: against a real granian server (plain and TLS),
and against a scripted server for what granian never sends (fragments, a masked frame, pings, silence).
"""

from __future__ import annotations

import base64
import hashlib
import os
import queue
import socket
import struct
import threading
import time

import pytest
from sockets import join, ws_echo

from gpulayer.relaylink import wsclient
from gpulayer.server.frontends.granian_server import GranianServer

pytest.importorskip("granian")


def app(environ, start_response):
    body = b'{"error": {"code": "nope", "message": "not here"}}'
    start_response("404 Not Found", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]


@pytest.fixture(scope="module")
def server():
    srv = GranianServer(app, "127.0.0.1", 0, threads=2, websocket=ws_echo)
    srv.start()
    yield srv
    srv.stop(timeout=2)


def test_binary_messages_both_ways_at_once(server):
    """A writer thread and the reader at once, far past the socket buffers: neither waits on the other."""
    ws = wsclient.connect(f"ws://127.0.0.1:{server.port}/echo", timeout=10)
    blocks = [os.urandom(256 * 1024 + i) for i in range(64)]  # 16 MiB, more than loopback buffers hold
    sender = threading.Thread(target=lambda: [ws.send(b) for b in blocks])
    sender.start()
    got = [ws.recv() for _ in blocks]
    sender.join(10)
    assert [hashlib.sha256(g).digest() for g in got] == [hashlib.sha256(b).digest() for b in blocks]
    ws.send("text")
    assert ws.recv(timeout=5) == b"text"  # the echo answers in binary
    ws.close()
    with pytest.raises(wsclient.ConnectionClosed):
        ws.recv(timeout=5)
    assert ws.closed.wait(5)


def test_the_server_answers_keepalive_pings(server):
    """An idle link stays while its reader runs (as a Link's does): granian answers the PINGs sent after
    `ping_interval` of silence."""
    ws = wsclient.connect(f"ws://127.0.0.1:{server.port}/echo", timeout=10, ping_interval=0.2, ping_timeout=0.3)
    got: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=lambda: got.put(ws.recv()), daemon=True).start()
    time.sleep(1.5)
    assert not ws.closed.is_set()
    ws.send(b"still here")
    assert got.get(timeout=5) == b"still here"
    ws.close()


def test_a_refusal_is_raised_with_its_status_and_body(server):
    with pytest.raises(wsclient.Refused) as refused:
        wsclient.connect(f"ws://127.0.0.1:{server.port}/refuse", timeout=10)
    assert refused.value.response.status_code == 403


def test_a_101_that_is_not_a_websockets_is_refused():
    answer = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: wrong\r\n\r\n"
    with Scripted(answer=answer) as peer:
        with pytest.raises(wsclient.BadHandshake, match="Sec-WebSocket-Accept"):
            wsclient.connect(peer.url, timeout=5)


def test_a_plain_http_answer_keeps_its_body():
    with Scripted(answer=b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 13\r\n\r\n{\"error\": {}}") as peer:
        with pytest.raises(wsclient.Refused) as refused:
            wsclient.connect(peer.url, timeout=5)
    assert refused.value.response.status_code == 401 and refused.value.response.body == b'{"error": {}}'


@pytest.mark.parametrize("url", ["http://example.com/", "ws:///nohost"])
def test_urls_other_than_ws_are_refused(url):
    with pytest.raises(ValueError):
        wsclient.connect(url)


def test_no_answer_at_all_is_an_eof():
    with Scripted(answer=None) as peer:  # accepts, reads the request, closes
        with pytest.raises((EOFError, ConnectionResetError)):
            wsclient.connect(peer.url, timeout=5)


def test_fragments_pings_and_the_close_handshake():
    frames = [
        frame(0x2, b"he", fin=False),
        frame(0x9, b"are you there"),  # a PING between fragments: answered, the message goes on
        frame(0x0, b"ll", fin=False),
        frame(0x0, b"o"),
        frame(0x1, "é".encode()),
        frame(0x8, struct.pack("!H", 1001) + b"going away"),
    ]
    with Scripted(frames=frames) as peer:
        ws = wsclient.connect(peer.url, timeout=5, ping_interval=None)
        assert ws.recv(timeout=5) == b"hello"
        assert ws.recv(timeout=5) == "é"
        with pytest.raises(wsclient.ConnectionClosed) as closed:
            ws.recv(timeout=5)
        assert closed.value.rcvd == wsclient.Close(1001, "going away")
        with pytest.raises(wsclient.ConnectionClosed):
            ws.send(b"too late")
        got = peer.received(2)
    assert got == [(0xA, b"are you there"), (0x8, struct.pack("!H", 1001))]  # the PONG, then our CLOSE's answer


@pytest.mark.parametrize(
    "bad, words",
    [
        (b"\x82\x85abcd" + b"12345", "masked"),
        (b"\xc2\x01x", "reserved"),
        (b"\x83\x01x", "opcode"),
        (b"\x89\x7e\x00\x80" + b"x" * 128, "control frame"),
        (b"\x80\x01x", "continuation"),
        (b"\x02\x01x\x82\x01y", "before the last one ended"),
        (b"\x81\x02\xff\xfe", "UTF-8"),
        (b"\x82\x7f" + struct.pack("!Q", 1 << 40), "over"),
    ],
)
def test_a_broken_server_frame_closes_the_connection(bad, words):
    with Scripted(frames=[bad]) as peer:
        ws = wsclient.connect(peer.url, timeout=5, ping_interval=None, max_size=1 << 20)
        with pytest.raises(wsclient.ConnectionClosed) as closed:
            ws.recv(timeout=5)
        assert words in str(closed.value)
        assert ws.closed.is_set()
        opcode, payload = peer.received(1)[0]
    assert opcode == 0x8 and struct.unpack("!H", payload[:2])[0] in (1002, 1007, 1009)


def test_a_silent_server_is_dropped_after_the_ping_timeout():
    with Scripted(frames=[], hold=True) as peer:  # never answers the PING
        ws = wsclient.connect(peer.url, timeout=5, ping_interval=0.2, ping_timeout=0.3)
        began = time.monotonic()
        with pytest.raises(wsclient.ConnectionClosed) as closed:
            ws.recv()
        assert "keepalive" in str(closed.value) and time.monotonic() - began < 3


def test_close_shuts_the_socket_when_the_server_does_not_answer():
    with Scripted(frames=[], hold=True) as peer:
        ws = wsclient.connect(peer.url, timeout=5, ping_interval=None, close_timeout=0.2)
        ws.close(1000, "bye")
        assert ws.closed.wait(3)
        assert peer.received(1) == [(0x8, struct.pack("!H", 1000) + b"bye")]


def test_through_an_http_proxy(server, monkeypatch):
    with ConnectProxy() as proxy:
        monkeypatch.setenv("http_proxy", f"http://user:pw@127.0.0.1:{proxy.port}")
        monkeypatch.delenv("no_proxy", raising=False)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.setattr(wsclient.urllib.request, "proxy_bypass", lambda host: False)
        ws = wsclient.connect(f"ws://127.0.0.1:{server.port}/echo", timeout=10)
        ws.send(b"via the proxy")
        assert ws.recv(timeout=5) == b"via the proxy"
        ws.close()
    assert proxy.requests == [f"CONNECT 127.0.0.1:{server.port} HTTP/1.1"]
    assert proxy.auth == "Basic " + base64.b64encode(b"user:pw").decode()


# helpers


def frame(opcode: int, payload: bytes, fin: bool = True) -> bytes:
    size = len(payload)
    head = bytes([(0x80 if fin else 0) | opcode])
    head += bytes([size]) if size < 126 else b"\x7e" + struct.pack("!H", size)
    return head + payload


class Scripted:
    """A one-connection WebSocket server on loopback: it answers the handshake (or `answer`, or nothing), sends
    `frames` as they are, then reads what the client sends (`received`) until the client closes or `hold`."""

    def __init__(self, frames: list[bytes] | None = None, answer: bytes | None | str = "101", hold: bool = False):
        self.frames, self.answer, self.hold = frames or [], answer, hold
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"ws://127.0.0.1:{self.listener.getsockname()[1]}/"
        self.got: list[tuple[int, bytes]] = []
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.listener.close()

    def received(self, count: int) -> list[tuple[int, bytes]]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.got) >= count, 5), self.got
            return self.got[:count]

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(4096)
            if self.answer is None:
                return
            if self.answer == "101":
                key = [line.split(b":", 1)[1].strip() for line in request.split(b"\r\n") if line.lower().startswith(b"sec-websocket-key")][0]
                accept = base64.b64encode(hashlib.sha1(key + wsclient.GUID.encode()).digest())
                head = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                conn.sendall(head + b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")
            else:
                conn.sendall(self.answer)  # type: ignore[arg-type]
                return
            conn.sendall(b"".join(self.frames))
            reader = conn.makefile("rb")
            while True:
                head = reader.read(2)
                if len(head) < 2:
                    break
                size = head[1] & 0x7F
                if size == 126:
                    size = struct.unpack("!H", reader.read(2))[0]
                elif size == 127:
                    size = struct.unpack("!Q", reader.read(8))[0]
                mask = reader.read(4)
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(reader.read(size)))
                with self.cond:
                    self.got.append((head[0] & 0x0F, payload))
                    self.cond.notify_all()
                if head[0] & 0x0F == 0x8 and not self.hold:
                    break


class ConnectProxy:
    """An HTTP CONNECT proxy on loopback that records what it was asked."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.requests: list[str] = []
        self.auth = ""
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.listener.close()

    def _accept(self) -> None:
        try:
            client, _ = self.listener.accept()
        except OSError:
            return
        head = b""
        while b"\r\n\r\n" not in head:
            head += client.recv(4096)
        lines = head.decode().split("\r\n")
        self.requests.append(lines[0])
        self.auth = next((line.split(":", 1)[1].strip() for line in lines if line.lower().startswith("proxy-authorization")), "")
        host, port = lines[0].split()[1].rsplit(":", 1)
        upstream = socket.create_connection((host, int(port)))
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        join(client, upstream)



def test_a_proxy_other_than_http_is_refused_without_its_password(monkeypatch):
    monkeypatch.setenv("https_proxy", "socks5://user:secret@127.0.0.1:1080")
    monkeypatch.setattr(wsclient.urllib.request, "proxy_bypass", lambda host: False)
    with pytest.raises(ValueError) as refused:
        wsclient.connect("wss://127.0.0.1:1/", timeout=1)
    assert "socks5://127.0.0.1:1080" in str(refused.value) and "no_proxy" in str(refused.value)
    assert "secret" not in str(refused.value)
