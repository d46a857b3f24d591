"""Hostile clients against a real `gpulayer server start` over TLS.

- TLS clients that connect and send nothing (more of them than the server has
  threads), or stop halfway through a handshake, do not stall anyone else;
- oversized headers and bodies (declared, sent, chunked) are refused with a
  4xx, never read into memory whole, and the server keeps serving;
- artifact digests with path characters (raw, URL-encoded) never reach the
  filesystem: 400 or 404, never a file's bytes.
"""
from __future__ import annotations

import http.client
import socket
import ssl
import time

import pytest
import requests

from gpulayer.testing import ControlPlaneProcess

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    server = ControlPlaneProcess(tmp_path_factory.mktemp("tls"), tls=True).start()
    yield server
    server.stop()


def _client(srv) -> requests.Session:
    s = requests.Session()
    s.trust_env = False
    s.verify = srv.verify
    s.headers["Authorization"] = f"Bearer {srv.tokens['client_token']}"
    return s


def _timed_ok(srv, seconds: float = 3.0) -> float:
    """A fresh client submits a job and reads it back; how long it took (fails past `seconds`)."""
    began = time.monotonic()
    with _client(srv) as s:
        r = s.post(f"{srv.url}/v1/jobs", json={"command": ["true"]}, timeout=seconds)
        assert r.status_code == 201, r.text
        assert s.get(f"{srv.url}/v1/jobs/{r.json()['id']}", timeout=seconds).status_code == 200
    return time.monotonic() - began


def _tls(srv) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=srv.verify)
    return ctx


def _raw(srv, request: bytes, timeout: float = 10.0) -> tuple[int, bytes]:
    """Send raw bytes over TLS; the status code (0 when the server closed without one) and the answer."""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=timeout) as sock:
        with _tls(srv).wrap_socket(sock, server_hostname="localhost") as tls:
            try:
                tls.sendall(request)
            except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
                pass
            answer = b""
            try:
                while chunk := tls.recv(65536):
                    answer += chunk
                    if b"\r\n\r\n" in answer and len(answer) > 4096:
                        break
            except (ConnectionResetError, ssl.SSLError, TimeoutError, socket.timeout):
                pass
    if not answer.startswith(b"HTTP/"):
        return 0, answer
    return int(answer.split(b" ", 2)[1]), answer


def test_silent_and_half_handshake_clients_do_not_stall_others(srv):
    silent = [socket.create_connection(("127.0.0.1", srv.port), timeout=5) for _ in range(100)]
    half = []
    for _ in range(20):  # a ClientHello's first bytes, then nothing
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        s.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
        half.append(s)
    try:
        took = [_timed_ok(srv) for _ in range(5)]
        assert max(took) < 3.0, took
    finally:
        for s in silent + half:
            s.close()
    assert _timed_ok(srv) < 3.0


def test_oversized_headers_are_refused_and_the_server_lives(srv):
    token = srv.tokens["client_token"]
    for size in (64 * 1024, 1024 * 1024):
        status, _ = _raw(srv, b"GET /v1/jobs HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer " + token.encode()
                         + b"\r\nX-Big: " + b"a" * size + b"\r\nConnection: close\r\n\r\n")
        assert status == 0 or 400 <= status < 500, status
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(8000))  # ~100 KB of small headers, over the 64 KiB limit
    status, _ = _raw(srv, b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\n" + many + b"Connection: close\r\n\r\n")
    assert status == 0 or 400 <= status < 500, status
    assert _timed_ok(srv) < 3.0


def test_oversized_bodies_are_refused_without_being_read(srv):
    auth = f"Authorization: Bearer {srv.tokens['client_token']}\r\n".encode()
    head = b"POST /v1/jobs HTTP/1.1\r\nHost: localhost\r\n" + auth + b"Content-Type: application/json\r\n"
    # declared 10 GB, nothing sent: refused at once, not after reading
    began = time.monotonic()
    status, answer = _raw(srv, head + b"Content-Length: 10000000000\r\nConnection: close\r\n\r\n", timeout=5)
    assert status == 413 and b"body_too_large" in answer, answer[:300]
    assert time.monotonic() - began < 3.0
    # 2 MiB sent with its length, then 2 MiB chunked with none: a 4xx, or the server closes the
    # connection once it has refused (the client is still sending and cannot read the answer)
    bodies = [b'{"command": ["' + b"x" * (2 << 20) + b'"]}', (b"x" * 65536 for _ in range(32))]
    for body in bodies:
        with _client(srv) as s:
            try:
                r = s.post(f"{srv.url}/v1/jobs", data=body, headers={"Content-Type": "application/json"}, timeout=30)
            except requests.ConnectionError:
                continue
            assert 400 <= r.status_code < 500, r.status_code
    assert _timed_ok(srv) < 3.0
    with _client(srv) as s:
        assert s.get(f"{srv.url}/v1/jobs", params={"limit": 1000}, timeout=10).json()["jobs"][0]["spec"]["command"] \
            == ["true"], "an oversized submit must not have been stored"


@pytest.mark.parametrize("path", [
    "/v1/artifacts/sha256:..%2F..%2Fserver-secret",
    "/v1/artifacts/sha256:../../server-secret",
    "/v1/artifacts/..%2F..%2Fserver-secret",
    "/v1/artifacts/%2e%2e%2f%2e%2e%2fserver-secret",
    "/v1/artifacts/sha256%3A..%2F..%2Fserver-credentials.json",
    "/v1/artifacts/sha256:" + "0" * 62 + "%2F0",
    "/v1/artifacts/sha256:" + "0" * 62 + "/0",
    "/v1/artifacts/sha256:" + "0" * 63 + "%00",
    "/v1/artifacts/sha256:" + "A" * 64,
    "/v1/artifacts/sha256:..%5C..%5Cserver-secret",
    "/v1/artifacts/..;/server-secret",
])
@pytest.mark.parametrize("method", ["GET", "HEAD", "PUT"])
def test_digests_with_path_characters_never_reach_the_filesystem(srv, path, method):
    secret = (srv.home / "server-secret").read_bytes().strip()
    conn = http.client.HTTPSConnection("127.0.0.1", srv.port, context=_tls(srv), timeout=10)
    conn.putrequest(method, path, skip_accept_encoding=True)
    conn.putheader("Authorization", f"Bearer {srv.tokens['client_token']}")
    conn.putheader("Content-Length", "4" if method == "PUT" else "0")
    conn.endheaders(b"data" if method == "PUT" else None)
    r = conn.getresponse()
    body = r.read()
    conn.close()
    assert r.status in (400, 404, 405), (method, path, r.status, body[:200])
    assert secret not in body
    if method == "PUT":
        assert not list((srv.home / "artifacts").rglob("*server-secret*"))
