"""Service ingress end to end (issue 26): `submit --service --ingress` behind a NAT, reached at `ingress_url`.

Two workers run in a network namespace whose iptables drop every NEW inbound connection (tests/netns.py's
NatNamespace); a service's replicas (REPLICA below: a small threaded HTTP server on $PORT) cannot be reached
there, and through the control plane's ingress: GET and POST, server-sent events token by token (the replica
sends its last token only once the test, having read the first, creates a file it waits for), a 100 MB upload
streamed, two held requests balanced over the two replicas, a dead replica (one that closes connections
before answering) skipped by a retried GET while a POST gets a 502, X-Forwarded-* as the replica sees them,
an OpenAI-shaped streaming chat completion through plain `requests`, a WebSocket echo from a real Chromium
page, and access: 401 without a token, 404 for a user who may not read the job, the service's key, `public`.
The test tells a replica what to do by `exec`ing `touch` into it (its task is sandboxed: its files are its own).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import requests

from gpulayer.testing import ControlPlaneProcess, wait_for

from netns import nat_namespace, netns_exec
from sockets import WS_ACCEPT

pytest.importorskip("granian")
pytestmark = [pytest.mark.timeout(300), pytest.mark.netns]

KEY = "the-service-key-" + "x" * 24
UPLOAD = 100 * 1024 * 1024

REPLICA = WS_ACCEPT + r"""
import hashlib, http.server, json, os, socket, struct, sys, time
INDEX = os.environ["GPULAYER_TASK_INDEX"]

def wait_file(name):  # created by the test through `exec` into this replica (its cwd)
    while not os.path.exists(name):
        time.sleep(0.005)

PAGE = b'''<!doctype html><title>waiting</title><script>
const ws = new WebSocket(location.href.replace(/^http/, "ws").replace(/page.*$/, "ws"));
ws.onopen = () => ws.send("ping from chromium");
ws.onmessage = (e) => { document.title = "echo: " + e.data; };
ws.onerror = () => { document.title = "error"; };
</script>'''

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def handle(self):
        if os.path.exists("deaf"):
            self.request.close()  # a dead replica: closed before the first byte of an answer
            return
        super().handle()

    def answer(self, body, type_="application/json", status=200):
        self.send_response(status)
        self.send_header("Content-Type", type_)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return
                left = size
                while left:
                    chunk = self.rfile.read(min(left, 1 << 20))
                    left -= len(chunk)
                    yield chunk
                self.rfile.readline()
        left = int(self.headers.get("Content-Length") or 0)
        while left:
            chunk = self.rfile.read(min(left, 1 << 20))
            left -= len(chunk)
            yield chunk

    def do_GET(self):
        if self.path.startswith("/sse"):
            tag = self.path.split("id=")[1]
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(f"data: first from {INDEX}\n\n".encode())
            self.wfile.flush()
            wait_file(f"release-{tag}")
            self.wfile.write(b"data: last\n\n")
            self.close_connection = True
            return
        if self.path == "/page":
            return self.answer(PAGE, "text/html")
        if self.path == "/ws" and self.headers.get("Upgrade", "").lower() == "websocket":
            return self.websocket()
        seen = {"index": INDEX, "path": self.path, "headers": dict(self.headers.items())}
        self.answer(json.dumps(seen).encode())

    def do_POST(self):
        if self.path == "/v1/chat/completions":
            asked = json.loads(b"".join(self.body()))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for word in ("Hello", " from", " " + asked["model"]):
                event = json.dumps({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": word}}]})
                data = f"data: {event}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            data = b"data: [DONE]\n\n"
            self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
            return
        if self.path == "/upload":
            digest, size = hashlib.sha256(), 0
            for chunk in self.body():
                digest.update(chunk)
                size += len(chunk)
            return self.answer(json.dumps({"size": size, "sha256": digest.hexdigest(), "index": INDEX}).encode())
        self.answer(b"".join(self.body()), "application/octet-stream")

    def websocket(self):
        ws_accept(self)
        self.wfile.flush()
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            opcode, size = head[0] & 0x0F, head[1] & 0x7F
            if size == 126:
                size = struct.unpack("!H", self.rfile.read(2))[0]
            elif size == 127:
                size = struct.unpack("!Q", self.rfile.read(8))[0]
            mask = self.rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(size)))
            if opcode == 8:
                self.wfile.write(b"\x88\x00")
                return
            reply = b"echo " + payload
            self.wfile.write(bytes([0x80 | opcode, len(reply)]) + reply)
            self.wfile.flush()

class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

print("listening", flush=True)
Server(("0.0.0.0", int(os.environ["PORT"])), H).serve_forever()
"""


@pytest.fixture(scope="module")
def nat():
    yield from nat_namespace("ing")


@pytest.fixture(scope="module")
def plane(nat, tmp_path_factory):
    with ControlPlaneProcess(
        tmp_path_factory.mktemp("ingress"), host=nat.host_ip, tls=True, heartbeat_interval=0.5, lease_ttl=5, args=["--http", "granian"]
    ).start(timeout=120) as plane:
        for name in ("nat-a", "nat-b"):
            plane.start_worker(name, parallel=4, prefix=netns_exec(nat.name), timeout=120)
        yield plane


def _service(plane, *options: str) -> tuple[int, list[str]]:
    """Submit REPLICA as a service with `options` through the CLI; its id and what submit printed after it."""
    result = plane.cli("submit", "--service", *options, "--", sys.executable, "-c", REPLICA, timeout=180)
    assert result.returncode == 0, result.stderr + plane.logs()
    lines = result.stdout.split("\n")
    return int(lines[0]), [line for line in lines[1:] if line]


@pytest.fixture(scope="module")
def web(plane):
    """Two replicas behind `--ingress` (a token that may read the job)."""
    job_id, printed = _service(plane, "--replicas", "2", "--ingress")
    return job_id, printed


@pytest.fixture(scope="module")
def url(plane, web) -> str:
    return f"{plane.url}/ingress/{web[0]}"


def _tell(plane, job_id: int, index: int, *argv: str) -> None:
    """Run `argv` in replica `index` of the job (in its cwd, inside its sandbox), through the relay."""
    done = plane.client().get_job(job_id).exec(list(argv), index=index)
    assert done.returncode == 0, done.stderr


def _get(url: str, plane, token: str | None = "", **kwargs) -> requests.Response:
    headers = kwargs.pop("headers", {})
    if token is not None:
        headers["Authorization"] = f"Bearer {token or plane.client_token}"
    return requests.get(url, headers=headers, verify=str(plane.ca_file), timeout=60, **kwargs)


def test_submit_prints_the_url_and_only_the_ingress_reaches_the_replicas(plane, nat, web, url):
    job_id, printed = web
    assert printed[0] == f"ingress {url}", printed
    endpoints = printed[1:]
    assert len(endpoints) == 2
    for endpoint in endpoints:
        assert not nat.reachable(int(endpoint.rsplit(":", 1)[1])), "the NAT namespace let a connection in"
    assert plane.job(job_id)["ingress_url"] == url
    status = plane.cli("job", "status", str(job_id))
    assert status.returncode == 0 and f"ingress_url={url}" in status.stdout, status.stdout
    seen = _get(f"{url}/who?x=1", plane)
    assert seen.status_code == 200, seen.text
    assert seen.json()["path"] == "/who?x=1"
    headers = {k.lower(): v for k, v in seen.json()["headers"].items()}
    assert headers["x-forwarded-for"] == nat.host_ip
    assert headers["x-forwarded-proto"] == "https"
    assert headers["x-forwarded-prefix"] == f"/ingress/{job_id}"
    assert "authorization" not in headers  # the caller's token stays on the control plane
    posted = requests.post(
        f"{url}/echo", data=b"posted bytes", headers={"Authorization": f"Bearer {plane.client_token}"}, verify=str(plane.ca_file), timeout=60
    )
    assert (posted.status_code, posted.content) == (200, b"posted bytes")
    moved = _get(url, plane, allow_redirects=False)
    assert moved.status_code == 308 and moved.headers["location"] == f"/ingress/{job_id}/"


def _sse(url: str, plane, tag: str) -> tuple[requests.Response, object]:
    answer = _get(f"{url}/sse?id={tag}", plane, stream=True)
    assert answer.status_code == 200 and answer.headers["content-type"] == "text/event-stream"
    return answer, answer.iter_lines()


def test_server_sent_events_arrive_token_by_token(plane, web, url):
    answer, lines = _sse(url, plane, "one")
    try:
        first = next(line for line in lines if line)
        assert first.startswith(b"data: first from ")  # before the replica may send its last
        _tell(plane, web[0], int(first.rsplit(b" ", 1)[1]), "touch", "release-one")
        assert [line for line in lines if line] == [b"data: last"]
    finally:
        answer.close()


def test_two_held_requests_go_to_the_two_replicas(plane, web, url):
    held = [_sse(url, plane, f"pair{i}") for i in range(2)]
    try:
        firsts = {next(line for line in lines if line) for _, lines in held}
        assert firsts == {b"data: first from 0", b"data: first from 1"}
    finally:
        for i in range(2):
            _tell(plane, web[0], i, "touch", "release-pair0", "release-pair1")
        for answer, _ in held:
            answer.close()


def test_a_100_mb_upload_streams_through(plane, url):
    block = os.urandom(1024 * 1024)
    want = hashlib.sha256(block * (UPLOAD // len(block))).hexdigest()
    answer = requests.post(
        f"{url}/upload",
        data=(block for _ in range(UPLOAD // len(block))),
        headers={"Authorization": f"Bearer {plane.client_token}"},
        verify=str(plane.ca_file),
        timeout=240,
    )
    assert answer.status_code == 200, answer.text
    assert (answer.json()["size"], answer.json()["sha256"]) == (UPLOAD, want)


def test_an_openai_shaped_streaming_completion(plane, url):
    answer = requests.post(
        f"{url}/v1/chat/completions",
        json={"model": "tiny", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": f"Bearer {plane.client_token}"},
        verify=str(plane.ca_file),
        stream=True,
        timeout=60,
    )
    assert answer.status_code == 200 and answer.headers["content-type"] == "text/event-stream"
    events = [line[len(b"data: ") :] for line in answer.iter_lines() if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    words = [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:-1]]
    assert "".join(words) == "Hello from tiny"


def test_access_token_key_public(plane, web, url):
    job_id = web[0]
    refused = _get(f"{url}/who", plane, token=None)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
    assert refused.headers["www-authenticate"].startswith("Bearer")
    assert _get(f"{url}/who", plane, token="glc_not-a-token").status_code == 401
    made = plane.cli("user", "add", "ingress-stranger", "--json")
    assert made.returncode == 0, made.stderr
    stranger = json.loads(made.stdout)["token"]
    hidden = _get(f"{url}/who", plane, token=stranger)
    assert hidden.status_code == 404 and hidden.json()["error"]["code"] == "not_found"
    # a browser: ?token= once, then a cookie scoped to the prefix
    session = requests.Session()
    first = session.get(f"{url}/who?token={plane.client_token}&keep=1", allow_redirects=False, timeout=60, verify=str(plane.ca_file))
    assert first.status_code == 303 and first.headers["location"] == f"/ingress/{job_id}/who?keep=1"
    cookie = first.headers["set-cookie"]
    assert f"Path=/ingress/{job_id}/" in cookie and "HttpOnly" in cookie and "Secure" in cookie
    followed = session.get(f"{url}/who?keep=1", timeout=60, verify=str(plane.ca_file))
    assert followed.status_code == 200 and "gpulayer_ingress" not in followed.json()["headers"].get("cookie", "")

    keyed, printed = _service(plane, "--ingress-key", KEY)
    keyed_url = f"{plane.url}/ingress/{keyed}"
    assert printed[0] == f"ingress {keyed_url}"
    assert _get(f"{keyed_url}/who", plane, token=KEY).status_code == 200  # as an OpenAI client sends its api key
    assert _get(f"{keyed_url}/who", plane).status_code == 200  # a token that may read the job, too
    assert _get(f"{keyed_url}/who", plane, token=KEY + "x").status_code == 401

    public, _ = _service(plane, "--ingress", "public")
    seen = _get(f"{plane.url}/ingress/{public}/who", plane, token=None, headers={"Authorization": "Bearer its-own"})
    assert seen.status_code == 200 and seen.json()["headers"]["authorization"] == "Bearer its-own"
    for job in (keyed, public):
        plane.cli("job", "cancel", str(job))


def test_a_websocket_echo_from_chromium(plane, url):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    chromium = "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_context(ignore_https_errors=True).new_page()
            page.goto(f"{url}/page?token={plane.client_token}")
            page.wait_for_function("document.title !== 'waiting'", timeout=60_000)
            assert page.title() == "echo: echo ping from chromium"
        finally:
            browser.close()


def test_a_dead_replica_a_get_is_retried_a_post_is_not(plane, web, url):
    _tell(plane, web[0], 0, "touch", "deaf")  # replica 0 closes every connection before answering
    try:
        retried = _get(f"{url}/who", plane)
        assert retried.status_code == 200 and retried.json()["index"] == "1"
        _tell(plane, web[0], 0, "rm", "deaf")
        _tell(plane, web[0], 1, "touch", "deaf")  # replica 0 is passed over a while now: the POST goes to 1
        failed = requests.post(
            f"{url}/echo", data=b"x", headers={"Authorization": f"Bearer {plane.client_token}"}, verify=str(plane.ca_file), timeout=60
        )
        assert failed.status_code == 502 and failed.json()["error"]["code"] == "bad_gateway", failed.text
    finally:
        for i in range(2):
            _tell(plane, web[0], i, "rm", "-f", "deaf")
    metrics = requests.get(f"{plane.url}/metrics", headers=plane.headers(), verify=str(plane.ca_file), timeout=30).text
    assert "gpulayer_ingress_retries_total" in metrics and "gpulayer_ingress_requests_total" in metrics


def test_no_replica_serving_is_a_503(plane, web, url):
    plane.cli("job", "cancel", str(web[0]))
    wait_for(lambda: plane.job(web[0])["state"] != "running", 60, "the service to end")
    # the ingress reads a job's replicas again after CACHE_S (1 s): a request in that second may still be served
    answers = []
    wait_for(lambda: answers.append(_get(f"{url}/who", plane)) or answers[-1].status_code != 200, 10, "the ingress to see it")
    answer = answers[-1]
    assert answer.status_code == 503 and answer.headers["retry-after"] == "1", answer.text
