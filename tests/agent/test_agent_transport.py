"""The agent's HTTP transport (agent/link/transport.py, agent/link/connections.py) against small real servers.

Keep-alive connections each used by one thread at a time, a connection the
server closed replaced, the error mapping, streamed artifacts, proxies from
the environment (plain and CONNECT), and the CA bundle requests' default named.
"""

import hashlib
import json
import select
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import agent.link.connections
from agent.errors import AgentError, Forbidden, Rejected, Unauthorized, Unreachable
from agent.link.transport import Transport

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy",
                   "no_proxy", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


@pytest.fixture(autouse=True)
def no_proxies(monkeypatch):
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


class Origin:
    """An HTTP/1.1 keep-alive server: records each request and the connection it came on."""

    def __init__(self, context: ssl.SSLContext | None = None):
        self.requests: list[dict] = []
        self.active: set[int] = set()
        self.overlaps = 0
        self.artifacts: dict[str, bytes] = {}
        self.close_after_answer = False
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        if context is not None:
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        scheme = "https" if context is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()  # shutdown() waits out one poll

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def connections(self) -> set[int]:
        return {entry["port"] for entry in self.requests}

    def _handler(self):
        origin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _answer(self, status, body=b"", content_type="application/json", chunked=False, headers=()):
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                for name, value in headers:
                    self.send_header(name, value)
                if chunked and self.command == "GET":
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for start in range(0, len(body), 100_000):
                        piece = body[start:start + 100_000]
                        self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                    self.wfile.write(b"0\r\n\r\n")
                else:
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(body)
                if origin.close_after_answer:  # without a Connection: close header
                    self.close_connection = True

            def _serve(self):
                port = self.client_address[1]
                with origin.lock:
                    if port in origin.active:
                        origin.overlaps += 1
                    origin.active.add(port)
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                    body = self.rfile.read(length) if length else b""
                    with origin.lock:
                        origin.requests.append({"method": self.command, "path": self.path, "port": port,
                                                "headers": dict(self.headers), "body": body})
                    self._route(body)
                finally:
                    with origin.lock:
                        origin.active.discard(port)

            def _route(self, body):
                path = self.path
                if path.startswith("/v1/status/"):
                    status = int(path.rsplit("/", 1)[1])
                    error = {"error": {"code": f"code_{status}", "message": f"message {status}"}, "protocol": 2}
                    return self._answer(status, json.dumps(error).encode(), headers=[("X-GpuLayer-Protocol", "2")])
                if path == "/v1/slow":
                    time.sleep(0.005)
                    return self._answer(200, b'{"ok": true}')
                if path == "/v1/text":
                    return self._answer(200, b"not json", "text/plain")
                if path == "/v1/empty":
                    return self._answer(200)
                if path.startswith("/v1/artifacts/"):
                    digest = path.rsplit("/", 1)[1]
                    if self.command == "PUT":
                        origin.artifacts[digest] = body
                        return self._answer(201, b"{}")
                    if digest not in origin.artifacts:
                        return self._answer(404, b'{"error": {"code": "not_found", "message": "no"}}')
                    data = origin.artifacts[digest]
                    return self._answer(200, data, "application/octet-stream", chunked=digest.startswith("c"))
                return self._answer(200, json.dumps({"path": path, "body": body.decode()}).encode())

            do_GET = do_POST = do_PUT = do_HEAD = _serve

        return Handler


@pytest.fixture
def origin():
    server = Origin()
    yield server
    server.stop()


def test_threads_never_share_a_connection_and_connections_are_kept(origin):
    transport = Transport(origin.url)
    errors = []

    def calls():
        try:
            for _ in range(20):
                assert transport.request("POST", "/slow", {"x": 1}) == {"ok": True}
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=calls) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert len(origin.requests) == 160
    assert origin.overlaps == 0
    assert len(origin.connections()) <= 8  # never more than the callers at once
    transport.close()


def test_headers_json_body_and_path_prefix(origin):
    transport = Transport(origin.url + "/")
    transport.set_token("glw_abc")
    assert transport.request("POST", "/worker/heartbeat", {"tasks": []}) == {"path": "/v1/worker/heartbeat",
                                                                               "body": '{"tasks":[]}'}
    sent = origin.requests[-1]["headers"]
    assert sent["X-GpuLayer-Protocol"] == "1"
    assert sent["Authorization"] == "Bearer glw_abc"
    assert sent["Content-Type"] == "application/json"
    assert transport.request("GET", "/empty") == {}


def test_a_connection_the_server_closed_is_replaced(origin, monkeypatch):
    origin.close_after_answer = True
    transport = Transport(origin.url)
    for _ in range(3):  # the idle connection reads as dropped before reuse
        assert transport.request("GET", "/slow") == {"ok": True}
    # closed just after that check: the request goes again on a new connection
    monkeypatch.setattr(agent.link.connections, "is_dropped", lambda connection: False)
    for _ in range(3):
        assert transport.request("POST", "/slow", {}) == {"ok": True}
    assert len(origin.connections()) == 6


@pytest.mark.parametrize("status, error", [(401, Unauthorized), (403, Forbidden), (404, Rejected), (409, Rejected),
                                           (302, Rejected), (408, Unreachable), (429, Unreachable),
                                           (500, Unreachable), (503, Unreachable)])
def test_answers_map_to_errors(origin, status, error):
    with pytest.raises(error) as raised:
        Transport(origin.url).request("GET", f"/status/{status}")
    if isinstance(raised.value, Rejected):
        assert (raised.value.status, raised.value.code, raised.value.message) == (status, f"code_{status}",
                                                                                   f"message {status}")


def test_protocol_mismatch_names_both_versions(origin):
    with pytest.raises(AgentError, match="speaks protocol 2, this worker speaks 1"):
        Transport(origin.url).request("GET", "/status/426")


def test_network_errors_and_non_json_are_unreachable(origin):
    with pytest.raises(Unreachable, match="not JSON"):
        Transport(origin.url).request("GET", "/text")
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    with pytest.raises(Unreachable, match="ConnectionRefusedError"):
        Transport(f"http://127.0.0.1:{port}").request("GET", "/health")


def test_a_silent_server_times_out():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    try:
        started = time.monotonic()
        with pytest.raises(Unreachable, match="TimeoutError"):
            Transport(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout=0.3).request("GET", "/health")
        assert time.monotonic() - started < 5
    finally:
        listener.close()


@pytest.mark.parametrize("prefix", ["c", "f"])  # chunked, or with a Content-Length
def test_artifacts_stream_both_ways(origin, tmp_path, prefix):
    data = bytes(range(256)) * 12_000 + b"tail"
    digest = prefix + hashlib.sha256(data).hexdigest()[1:]
    source = tmp_path / "out.bin"
    source.write_bytes(data)
    transport = Transport(origin.url)
    assert not transport.artifact_exists(digest)
    transport.upload_artifact(digest, str(source))
    put = [entry for entry in origin.requests if entry["method"] == "PUT"]
    assert len(put) == 1 and put[0]["headers"]["Content-Length"] == str(len(data))
    assert origin.artifacts[digest] == data
    transport.upload_artifact(digest, str(source))  # already there: HEAD only
    assert len([entry for entry in origin.requests if entry["method"] == "PUT"]) == 1
    with open(tmp_path / "in.bin", "w+b") as out:
        out.write(b"left from an earlier try")
        transport.download_artifact(digest, out)
    assert (tmp_path / "in.bin").read_bytes() == data
    assert transport.request("GET", "/slow") == {"ok": True}  # the connection is usable after the stream
    assert len(origin.connections()) == 1


def test_a_download_cut_short_is_retried_then_given_up(tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    served = []

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10)
            conn.close()
            served.append(1)

    threading.Thread(target=serve, daemon=True).start()
    transport = Transport(f"http://127.0.0.1:{listener.getsockname()[1]}")
    transport.give_up_at = time.monotonic() + 1.0
    try:
        with pytest.raises(Unreachable, match="IncompleteRead"), open(tmp_path / "in.bin", "w+b") as out:
            transport.download_artifact("a" * 64, out)
    finally:
        listener.close()
    assert len(served) >= 2


class Proxy:
    """A forwarding proxy: absolute-form requests and CONNECT tunnels, each recorded."""

    def __init__(self):
        self.seen: list[tuple[str, str, str | None]] = []
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client):
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = client.recv(65536)
            if not chunk:
                return client.close()
            head += chunk
        first, _, rest = head.partition(b"\r\n")
        method, target, _ = first.decode().split(" ")
        auth = next((line.split(b":", 1)[1].strip().decode() for line in rest.split(b"\r\n")
                     if line.lower().startswith(b"proxy-authorization:")), None)
        self.seen.append((method, target, auth))
        if method == "CONNECT":
            host, port = target.rsplit(":", 1)
            upstream = socket.create_connection((host, int(port)))
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            host_port = target.split("/")[2]
            host, port = host_port.rsplit(":", 1)
            upstream = socket.create_connection((host, int(port)))
            origin_form = target.split(host_port, 1)[1]
            upstream.sendall(f"{method} {origin_form} HTTP/1.1\r\n".encode() + rest)
        self._pipe(client, upstream)

    @staticmethod
    def _pipe(a, b):
        sockets = [a, b]
        try:
            while True:
                readable, _, _ = select.select(sockets, [], [], 10)
                if not readable:
                    return
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    (b if sock is a else a).sendall(data)
        finally:
            a.close()
            b.close()

    def stop(self):
        self.listener.close()


@pytest.fixture
def proxy():
    server = Proxy()
    yield server
    server.stop()


def test_http_proxy_from_the_environment(origin, proxy, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", proxy.url.replace("http://", "http://user:p%40ss@"))
    transport = Transport(origin.url)
    assert transport.request("GET", "/slow") == {"ok": True}
    assert proxy.seen == [("GET", origin.url + "/v1/slow", "Basic dXNlcjpwQHNz")]  # user:p@ss
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert Transport(origin.url).request("GET", "/slow") == {"ok": True}
    assert len(proxy.seen) == 1


@pytest.fixture
def tls(tmp_path):
    certs = pytest.importorskip("gpulayer.server.security.certs")
    ca, ca_key = certs.make_ca(tmp_path / "ca")
    cert, key = certs.make_server_cert(tmp_path / "ca", ca, ca_key, ["localhost"], ["127.0.0.1"])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = Origin(context)
    yield server, str(ca)
    server.stop()


def test_https_through_a_connect_tunnel(tls, proxy, monkeypatch):
    server, ca = tls
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    transport = Transport(server.url, verify=ca)
    for _ in range(3):
        assert transport.request("GET", "/slow") == {"ok": True}
    assert proxy.seen == [("CONNECT", server.url.split("//")[1], None)]


def test_the_system_bundle_variables_apply_only_without_a_ca(tls, tmp_path, monkeypatch):
    server, ca = tls
    with pytest.raises(Unreachable, match="SSLCertVerificationError"):
        Transport(server.url).request("GET", "/slow")  # certifi's bundle does not hold the test CA
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", ca)
    assert Transport(server.url).request("GET", "/slow") == {"ok": True}
    with pytest.raises(AgentError, match="cannot load the CA"):
        Transport(server.url, verify=str(tmp_path / "missing.pem"))


def test_unsupported_proxy_schemes_are_refused_at_start(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "socks5://127.0.0.1:1080")
    with pytest.raises(AgentError, match="socks5"):
        Transport("https://cp.example:8470")


class Gate(Origin):
    """An origin that answers 401 to every token but `accepted`."""

    def __init__(self, accepted: str):
        super().__init__()
        self.accepted = accepted
        route = self.server.RequestHandlerClass._route

        def gated(handler, body):
            if handler.headers.get("Authorization") != f"Bearer {self.accepted}":
                error = {"error": {"code": "unauthorized", "message": "unknown session"}}
                return handler._answer(401, json.dumps(error).encode())
            return route(handler, body)

        self.server.RequestHandlerClass._route = gated


def test_a_call_answered_401_goes_again_once_the_worker_registered_again():
    """A finish sent while a restored control plane does not know the session is not dropped (run twice)."""
    gate = Gate("new")
    try:
        transport = Transport(gate.url)
        transport.set_token("old")
        threading.Timer(0.3, transport.set_token, args=("new",)).start()  # the heartbeat's rejoin
        assert transport.call("POST", "/worker/tasks/7/finish", {"exit_code": 0})["path"] == "/v1/worker/tasks/7/finish"
        assert [r["headers"]["Authorization"] for r in gate.requests] == ["Bearer old", "Bearer new"]
        with pytest.raises(Unauthorized):  # a plain request is never sent again: its caller decides
            Transport(gate.url).request("POST", "/worker/heartbeat", {})
    finally:
        gate.stop()


def test_a_401_stands_when_no_new_registration_comes_in_time():
    gate = Gate("never")
    try:
        transport = Transport(gate.url)
        transport.set_token("old")
        transport.reauth_wait_s = 0.2
        started = time.monotonic()
        with pytest.raises(Unauthorized):
            transport.call("POST", "/worker/tasks/7/finish", {})
        assert 0.2 <= time.monotonic() - started < 5 and len(gate.requests) == 1
    finally:
        gate.stop()


def test_a_wait_for_a_new_registration_ends_when_the_worker_stops_waiting():
    """A revoked worker sets the wait to 0 while a finish waits (agent/session.py): the 401 stands at once."""
    gate = Gate("never")
    try:
        transport = Transport(gate.url)
        transport.set_token("old")
        threading.Timer(0.2, setattr, args=(transport, "reauth_wait_s", 0.0)).start()
        started = time.monotonic()
        with pytest.raises(Unauthorized):
            transport.call("POST", "/worker/tasks/7/finish", {})
        assert time.monotonic() - started < 5
    finally:
        gate.stop()
