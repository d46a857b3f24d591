"""Both front ends over real sockets: plain HTTP, TLS with a CA made by certs.py, stalls, big bodies.

Every test taking `serve` runs against granian (the default, GranianServer) and cheroot
(`--http cheroot`, HTTPServer); where they keep the same bound differently the test says
what each does.
"""

from __future__ import annotations

import hashlib
import logging
import socket
import ssl
import threading
import time

import pytest
import requests

from gpulayer.server.errors import BodyTooSlow, error_body
from gpulayer.server.frontends import bodies
from gpulayer.server.security import certs
from gpulayer.server.frontends.granian_server import GranianServer
from gpulayer.server.frontends.cheroot_server import HTTPServer
from tiers import WALL_CLOCK

MB = 1024 * 1024
CHUNK = bytes(range(256)) * 4096  # 1 MiB


def app(environ, start_response):
    """A tiny WSGI app: /hello, PUT /sha256 (hash the body), PUT /lines, GET /blob?n, GET /slow."""
    path = environ["PATH_INFO"]
    headers = [("Content-Type", "text/plain")]
    if path == "/sha256":
        remaining, h = int(environ.get("CONTENT_LENGTH") or 0), hashlib.sha256()
        while remaining:
            try:
                data = environ["wsgi.input"].read(min(remaining, MB))
            except BodyTooSlow as exc:  # as the app's error handler answers it
                start_response("408 Request Timeout", [("Content-Type", "application/json")])
                return [error_body(exc.code, str(exc))]
            if not data:
                break
            h.update(data)
            remaining -= len(data)
        body = f"{h.hexdigest()} {int(environ.get('CONTENT_LENGTH') or 0) - remaining}".encode()
    elif path == "/blob":
        n = int(environ["QUERY_STRING"])
        start_response("200 OK", [("Content-Type", "application/octet-stream"), ("Content-Length", str(n * MB))])
        return (CHUNK for _ in range(n))
    elif path == "/lines":  # a chunked body read line by line
        body = b"|".join(line.rstrip(b"\n") for line in iter(environ["wsgi.input"].readline, b""))
    elif path == "/slow":
        time.sleep(0.5)
        body = b"slow done"
    else:
        body = " ".join(
            [environ["wsgi.url_scheme"], environ.get("HTTPS", "off"), environ.get("SSL_PROTOCOL", "-")]
        ).encode()
    start_response("200 OK", headers + [("Content-Length", str(len(body)))])
    return [body]


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    ca, ca_key = certs.make_ca(d)
    cert, key = certs.make_server_cert(d, ca, ca_key, ["localhost"], ["127.0.0.1"])
    return {"ca": str(ca), "cert": str(cert), "key": str(key)}


@pytest.fixture(params=["granian", "cheroot"])
def front_end(request) -> str:
    return request.param


@pytest.fixture
def serve(tls_files, front_end):
    """Start servers of `front_end` on 127.0.0.1:0; stop them all at teardown.

    cheroot's settings are mapped onto granian's: its per-read `request_timeout_s`
    bounds the head there too (as cheroot's head_timeout_s = min(both)), and its
    `max_pending_heads` is granian's bound on connections.
    """
    started = []

    def start(tls=True, **kw):
        files = {"certfile": tls_files["cert"], "keyfile": tls_files["key"]} if tls else {}
        if front_end == "granian":
            if "request_timeout_s" in kw:
                kw["head_timeout_s"] = min(kw.pop("request_timeout_s"), kw.get("head_timeout_s", 10.0))
            if "max_pending_heads" in kw:
                kw["max_connections"] = kw.pop("max_pending_heads")
            srv: HTTPServer | GranianServer = GranianServer(app, "127.0.0.1", 0, **files, **kw)
        else:
            srv = HTTPServer(app, "127.0.0.1", 0, **files, **kw)
        srv.start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop(timeout=2)


@pytest.fixture
def loud(caplog):
    """Records of WARNING and above from the server (none expected on a dropped client)."""
    caplog.set_level(logging.DEBUG, logger="gpulayer.server.http.server")
    return lambda: [r for r in caplog.records if r.levelno >= logging.WARNING]


def hello(srv, ca, host="localhost", timeout=2.0):
    return requests.get(f"https://{host}:{srv.port}/hello", verify=ca, timeout=timeout)


def test_plain_http_serves_a_wsgi_app(serve):
    srv = serve(tls=False)
    assert srv.port > 0
    r = requests.get(f"http://127.0.0.1:{srv.port}/hello", timeout=2)
    assert r.status_code == 200
    assert r.text == "http off -"


def test_tls_serves_with_the_ca_by_name_and_by_ip(serve, tls_files, front_end):
    srv = serve()
    for host in ("localhost", "127.0.0.1"):
        r = hello(srv, tls_files["ca"], host=host)
        scheme, https, proto = r.text.split()
        assert (r.status_code, scheme, https) == (200, "https", "on")
        # RSGI does not name the protocol granian agreed (TLS 1.2 at least, as cheroot's context)
        assert proto in (("TLSv1.2", "TLSv1.3") if front_end == "cheroot" else ("-",))


def test_tls_refuses_a_client_that_does_not_trust_the_ca(serve):
    srv = serve()
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"https://localhost:{srv.port}/hello", timeout=2)


@WALL_CLOCK
def test_50mb_up_and_down_over_tls(serve, tls_files):
    srv = serve()
    n = 50
    upload = CHUNK * n
    r = requests.put(f"https://localhost:{srv.port}/sha256", data=upload, verify=tls_files["ca"], timeout=30)
    assert r.text == f"{hashlib.sha256(upload).hexdigest()} {n * MB}"

    got, h = 0, hashlib.sha256()
    with requests.get(f"https://localhost:{srv.port}/blob?{n}", verify=tls_files["ca"], stream=True, timeout=30) as r:
        for part in r.iter_content(MB):
            h.update(part)
            got += len(part)
    assert (got, h.hexdigest()) == (n * MB, hashlib.sha256(upload).hexdigest())


@WALL_CLOCK
def test_silent_tls_clients_do_not_stall_others(serve, tls_files, loud):
    srv = serve(threads=1, request_timeout_s=5)
    silent = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(5)]
    try:
        t0 = time.monotonic()
        for _ in range(3):
            assert hello(srv, tls_files["ca"], timeout=1.0).status_code == 200
        assert time.monotonic() - t0 < 1.0
    finally:
        for s in silent:
            s.close()
    assert loud() == []


@WALL_CLOCK
def test_client_stalled_mid_handshake_is_dropped_after_the_timeout(serve, tls_files, loud, front_end):
    srv = serve(threads=2, request_timeout_s=0.5)
    stalled = socket.create_connection(("127.0.0.1", srv.port))
    stalled.sendall(b"\x16\x03\x01\x02\x00")  # a TLS record header promising a ClientHello
    # cheroot: the head deadline; granian: its TLS listener's own, 10 s whatever the head's
    deadline = 2.0 if front_end == "cheroot" else 12.0
    stalled.settimeout(deadline + 1)
    t0 = time.monotonic()
    assert hello(srv, tls_files["ca"], timeout=1.0).status_code == 200
    assert stalled.recv(100) == b""  # the server closed it
    assert time.monotonic() - t0 < deadline
    stalled.close()
    assert loud() == []


def test_client_gone_during_handshake_is_dropped_quietly(serve, tls_files, loud):
    srv = serve(threads=1)
    for _ in range(3):
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.sendall(b"\x16\x03\x01")
        s.close()
    assert hello(srv, tls_files["ca"], timeout=1.0).status_code == 200
    assert loud() == []


def test_plain_http_on_the_tls_port_is_refused_and_the_server_lives(serve, tls_files, loud, front_end):
    srv = serve(threads=1)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=2) as s:
        s.sendall(b"GET /hello HTTP/1.1\r\nHost: localhost\r\n\r\n")
        answer = _read_all(s)
    if front_end == "cheroot":
        # a 400 in plain text, unless the kernel's reset (unread request bytes) beat it to the client
        assert answer == b"" or answer.startswith(b"HTTP/1.1 400")
    else:
        # granian: a TLS alert record and a close (gpulayer's clients read it as "use https://")
        assert answer == b"" or answer.startswith(b"\x15\x03")
    assert hello(srv, tls_files["ca"], timeout=1.0).status_code == 200
    assert loud() == []


@WALL_CLOCK
def test_headers_then_stall_is_timed_out_and_others_are_served(serve, tls_files):
    srv = serve(threads=2, request_timeout_s=0.5)
    ctx = ssl.create_default_context(cafile=tls_files["ca"])
    with ctx.wrap_socket(socket.create_connection(("127.0.0.1", srv.port)), server_hostname="localhost") as s:
        s.settimeout(3)
        s.sendall(b"PUT /sha256 HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\nonly-part")
        assert hello(srv, tls_files["ca"], timeout=1.0).status_code == 200
        t0 = time.monotonic()
        answer = _read_all(s)
    assert answer.startswith(b"HTTP/1.1 408")
    assert time.monotonic() - t0 < 2.0


def test_oversized_headers_are_refused(serve):
    srv = serve(tls=False, max_header_bytes=16384)  # granian's least (hyper's 8 KiB buffer)
    r = requests.get(f"http://127.0.0.1:{srv.port}/hello", headers={"X-Big": "a" * 32768}, timeout=2)
    assert r.status_code in (413, 431)
    assert requests.get(f"http://127.0.0.1:{srv.port}/hello", timeout=2).status_code == 200


def _head_refused(url: str, size: int, prefix: str = "/hello") -> requests.Response | None:
    """GET with a header of `size` bytes: the answer, or None when the server closed before it (refused too)."""
    try:
        return requests.get(url + prefix, headers={"X-Big": "a" * size}, timeout=5)
    except requests.ConnectionError:
        return None


def test_a_head_up_to_the_cap_is_served_and_one_over_it_refused(serve, front_end):
    """64 KiB by default on both front ends. granian's read buffer is sized for bodies (256 KiB) and the cap is
    the bridge's, on the parsed head: a 48 KiB head is served (it was refused when the buffer was the cap)."""
    srv = serve(tls=False)
    url = f"http://127.0.0.1:{srv.port}"
    assert requests.get(url + "/hello", headers={"X-Big": "a" * 48 * 1024}, timeout=5).status_code == 200
    over = _head_refused(url, 80 * 1024)
    if front_end == "granian":  # the bridge's answer: the one error shape, and a close
        assert over is not None and over.status_code == 431, over
        assert over.json()["error"]["code"] == "headers_too_large"
        assert over.headers["Connection"] == "close"
    else:
        assert over is None or over.status_code in (413, 431)
    past = _head_refused(url, 600 * 1024)  # past granian's read buffer: hyper refuses it before it ends
    assert past is None or past.status_code in (413, 431)
    assert requests.get(url + "/hello", timeout=5).status_code == 200


def test_granian_refuses_an_oversized_head_before_any_handler():
    """The cap holds for the path-prefixed handlers (the ingress) and WebSockets (the relay) too: they never see
    such a head."""
    seen: list[str] = []

    async def ingress(scope, proto):
        seen.append(scope.path)
        proto.response_bytes(200, [("content-type", "text/plain")], b"ingress")

    async def websocket(scope, proto):
        seen.append("ws " + scope.path)
        proto.close(403)

    srv = GranianServer(app, "127.0.0.1", 0, prefixed={"/ingress/": ingress}, websocket=websocket)
    srv.start()
    try:
        url = f"http://127.0.0.1:{srv.port}"
        over = _head_refused(url, 80 * 1024, "/ingress/x")
        assert over is not None and over.status_code == 431
        assert requests.get(url + "/ingress/y", headers={"X-Big": "a" * 48 * 1024}, timeout=5).text == "ingress"
        upgrade = ("GET /relay HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n")
        for size, status in ((80 * 1024, b"431"), (100, b"403")):
            with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
                s.sendall(f"{upgrade}X-Big: {'a' * size}\r\n\r\n".encode())
                assert s.recv(64).split(b" ")[1] == status
        assert seen == ["/ingress/y", "ws /relay"]
    finally:
        srv.stop()


def test_granian_hands_a_streamed_body_over_in_chunks_larger_than_a_head_buffer():
    """A large body reaches Python in chunks of up to BODY_READ_BYTES (hyper's read buffer), not 32 KiB: each
    chunk costs the control plane a wake-up and an await (docs/benchmarks/issue-27.md, "Checkpoint upload: granian's body chunks")."""
    from gpulayer.server.frontends.granian_server import BODY_READ_BYTES
    largest: list[int] = [0]

    def sizes(environ, start_response):
        stream, h = environ["wsgi.input"], hashlib.sha256()
        while True:
            time.sleep(0.002)  # the pump reads ahead meanwhile: what it got is in stream._chunks
            with stream._cond:
                largest[0] = max([largest[0], *(len(chunk) for chunk in stream._chunks)])
            data = stream.read(MB)
            if not data:
                break
            h.update(data)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [h.hexdigest().encode()]

    srv = GranianServer(sizes, "127.0.0.1", 0)
    srv.start()
    try:
        body = CHUNK * 16
        r = requests.put(f"http://127.0.0.1:{srv.port}/", data=body, timeout=30)
        assert r.text == hashlib.sha256(body).hexdigest()
        assert 32 * 1024 < largest[0] <= BODY_READ_BYTES + 64 * 1024, largest
    finally:
        srv.stop()


@WALL_CLOCK
def test_stop_lets_an_inflight_request_finish_then_refuses(tls_files):
    srv = HTTPServer(app, "127.0.0.1", 0, certfile=tls_files["cert"], keyfile=tls_files["key"])
    srv.start()
    port, result = srv.port, {}

    def slow():
        result["r"] = requests.get(f"https://localhost:{port}/slow", verify=tls_files["ca"], timeout=5)

    t = threading.Thread(target=slow)
    t.start()
    time.sleep(0.2)
    srv.stop(timeout=3)
    t.join(5)
    assert result["r"].text == "slow done"
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"https://localhost:{port}/hello", verify=tls_files["ca"], timeout=1)
    srv.stop()  # a second stop is harmless


def test_serve_forever_blocks_until_stop():
    srv = HTTPServer(app, "127.0.0.1", 0)
    t = threading.Thread(target=srv.serve_forever)
    t.start()
    deadline = time.monotonic() + 2
    while srv.port == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert requests.get(f"http://127.0.0.1:{srv.port}/hello", timeout=2).status_code == 200
    srv.stop()
    t.join(3)
    assert not t.is_alive()


def test_half_configured_tls_is_refused(tls_files):
    with pytest.raises(ValueError):
        HTTPServer(app, "127.0.0.1", 0, certfile=tls_files["cert"])


def _read_all(sock) -> bytes:
    chunks = []
    try:
        while data := sock.recv(65536):
            chunks.append(data)
    except (ConnectionResetError, ssl.SSLError):
        pass
    return b"".join(chunks)


def _slow_heads(srv, count: int, tls_files=None) -> list:
    """`count` clients part-way through a request head (or, with tls_files, through a ClientHello)."""
    clients = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        s.sendall(b"\x16\x03\x01\x02\x00\x01" if tls_files else b"GET /hello HTTP/1.1\r\nHost: x\r\n")
        clients.append(s)
    return clients


def _trickle(clients) -> int:
    """One more header line from each client; how many the server has closed (a 408 first, or not)."""
    closed = 0
    for s in clients:
        try:
            s.sendall(b"X-Slow: 1\r\n")
            s.setblocking(False)
            answer = s.recv(100)
            if answer == b"" or answer.startswith(b"HTTP/1.1 408"):
                closed += 1
        except (BlockingIOError, ssl.SSLWantReadError):
            pass
        except OSError:  # reset: closed
            closed += 1
        finally:
            s.setblocking(True)
    return closed


@WALL_CLOCK
@pytest.mark.parametrize("tls", [False, True])
def test_slowloris_heads_hold_no_thread_and_end_at_the_deadline(serve, tls_files, tls, front_end):
    srv = serve(tls=tls, threads=4, request_timeout_s=5, head_timeout_s=1.5)
    slow = _slow_heads(srv, 40, tls_files if tls else None)
    url = f"{srv.scheme}://localhost:{srv.port}/hello"
    # closed at the head deadline, not the per-read timeout; a ClientHello trickled to granian ends at
    # its TLS listener's 10 s (or sooner, once the lines fill the promised record and it fails to parse)
    deadline = 12 if tls and front_end == "granian" else 5
    try:
        began = time.monotonic()
        closed = 0
        while time.monotonic() - began < deadline + 1:  # one line per client per round
            assert requests.get(url, verify=tls_files["ca"], timeout=1).status_code == 200
            closed = _trickle(slow)
            if closed == len(slow):
                break
            time.sleep(0.1)  # the slowloris pace; nothing to await
        assert closed == len(slow), closed
        assert time.monotonic() - began < deadline
    finally:
        for s in slow:
            s.close()


@WALL_CLOCK
def test_pending_heads_are_capped(serve, front_end):
    srv = serve(tls=False, threads=2, max_pending_heads=5)
    slow = _slow_heads(srv, 12)
    try:
        if front_end == "cheroot":
            # the selector refuses heads past the cap; the first five stay open
            deadline = time.monotonic() + 5
            while _trickle(slow) < 7 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _trickle(slow) == 7
            assert requests.get(f"http://127.0.0.1:{srv.port}/hello", timeout=1).status_code == 200
        else:
            # granian takes five connections; the rest wait in the backlog, and a whole request behind them
            # is served once the reaper has closed the stalled heads for them (granian_guard.py)
            began = time.monotonic()
            assert requests.get(f"http://127.0.0.1:{srv.port}/hello", timeout=5).status_code == 200
            assert time.monotonic() - began < 3
            assert _trickle(slow) >= 7
    finally:
        for s in slow:
            s.close()


@WALL_CLOCK
def test_silent_connections_never_reach_granian(tls_files):
    """TCP_DEFER_ACCEPT: connections that send nothing take none of granian's places (granian_guard.py)."""
    srv = GranianServer(app, "127.0.0.1", 0, threads=2, max_connections=4, head_timeout_s=2)
    srv.start()
    silent = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(20)]
    try:
        began = time.monotonic()
        for _ in range(3):
            assert requests.get(f"http://127.0.0.1:{srv.port}/hello", timeout=2).status_code == 200
        assert time.monotonic() - began < 1
    finally:
        for s in silent:
            s.close()
        srv.stop(timeout=2)


@WALL_CLOCK
def test_a_full_granian_closes_stalled_heads_with_a_408_not_requests_in_progress(tls_files):
    """At its bound, the reaper closes heads stalled past STALLED_S (408) and leaves a request in the app."""
    srv = GranianServer(app, "127.0.0.1", 0, threads=2, max_connections=3)
    srv.start()
    url = f"http://127.0.0.1:{srv.port}"
    slow_answer: dict = {}
    try:
        with requests.Session() as keep:
            assert keep.get(f"{url}/hello", timeout=2).status_code == 200  # an idle keep-alive place
            busy = threading.Thread(target=lambda: slow_answer.update(r=requests.get(f"{url}/slow", timeout=5)))
            busy.start()
            time.sleep(0.1)
            heads = _slow_heads(srv, 6)
            began = time.monotonic()
            assert requests.get(f"{url}/hello", timeout=5).status_code == 200
            assert time.monotonic() - began < 3
            busy.join(5)
            assert slow_answer["r"].text == "slow done"  # in the app: never reaped
            answers = [_read_all(s) for s in heads[:1]]
            assert answers[0].startswith(b"HTTP/1.1 408"), answers
            for s in heads:
                s.close()
    finally:
        srv.stop(timeout=2)


def test_pipelined_and_split_heads_are_served(serve):
    srv = serve(tls=False, threads=1)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=3) as s:
        s.sendall(b"GET /hello HTTP/1.1\r\nHo")
        time.sleep(0.05)  # a head in two packets
        s.sendall(b"st: x\r\n\r\nGET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = _read_all(s)
    assert answer.count(b"HTTP/1.1 200") == 2, answer


@WALL_CLOCK
def test_a_full_granian_never_closes_an_idle_websocket(tls_files):
    """An accepted WebSocket that receives nothing (an idle shell, an agent's link) is alive: at the bound, the
    reaper closes the stalled heads for the waiting client and leaves the WebSocket open (granian_bridge.py)."""
    from websockets.sync.client import connect as ws_connect

    async def echo(scope, proto):
        transport = await proto.accept()
        while True:
            message = await transport.receive()
            if message.kind == 0:  # closed
                break
            await transport.send_bytes(message.data if isinstance(message.data, bytes) else message.data.encode())
        proto.close(1000)

    srv = GranianServer(app, "127.0.0.1", 0, threads=2, max_connections=3, websocket=echo)
    srv.start()
    try:
        with ws_connect(f"ws://127.0.0.1:{srv.port}/ws", open_timeout=5, compression=None) as ws:
            ws.send(b"one")
            assert ws.recv(timeout=5) == b"one"
            time.sleep(1)  # idle past STALLED_S
            heads = _slow_heads(srv, 6)
            assert requests.get(f"http://127.0.0.1:{srv.port}/hello", timeout=5).status_code == 200
            assert srv._reaper is not None and srv._reaper.reaped >= 1  # the guard did act
            ws.send(b"two")
            assert ws.recv(timeout=5) == b"two"
            for s in heads:
                s.close()
    finally:
        srv.stop(timeout=2)


def test_a_body_larger_than_the_read_ahead_arrives_whole_through_pauses(tls_files, monkeypatch):
    """granian: the body's pump stops at the read-ahead and goes on as the app takes bytes (granian_bridge)."""
    from gpulayer.server.frontends import granian_bridge

    monkeypatch.setattr(granian_bridge, "_READ_AHEAD", 64 * 1024)  # a pause every 64 KiB
    srv = GranianServer(app, "127.0.0.1", 0, certfile=tls_files["cert"], keyfile=tls_files["key"])
    srv.start()
    try:
        upload = CHUNK * 20
        r = requests.put(f"https://localhost:{srv.port}/sha256", data=upload, verify=tls_files["ca"], timeout=60)
        assert r.text == f"{hashlib.sha256(upload).hexdigest()} {20 * MB}"
        chunked = requests.put(f"https://localhost:{srv.port}/lines", data=iter([b"one\ntw", b"o\n", b"three"]),
                               verify=tls_files["ca"], timeout=60)
        assert chunked.text == "one|two|three", chunked.text
    finally:
        srv.stop(timeout=2)


def test_a_streamed_body_that_stalls_is_answered_408_and_closed(monkeypatch):
    """granian: a body that falls behind its minimum rate (bodies.Pace) ends in 408 and a closed connection."""
    real_pace = bodies.Pace
    monkeypatch.setattr(bodies, "Pace", lambda: real_pace(grace_s=0.5, min_rate=1024 * 1024))
    srv = GranianServer(app, "127.0.0.1", 0)
    srv.start()
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
            sock.sendall(b"PUT /sha256 HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n" + b"x" * 200_000)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout" in answer, answer[:300]
    finally:
        srv.stop(timeout=2)
