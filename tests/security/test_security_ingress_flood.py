"""The ingress under a flood of requests nobody reads (issue 36 item 10), against real processes.

A real `server start` (granian), a real worker, a real service behind a `public` ingress whose replica answers
GET /big with bytes without end (and echoes a POST), and another user's job on the same worker. 400 anonymous requests from ten
client addresses (127.0.0.2 to .11) are sent over raw sockets that never read a byte. Before the fix each was
a relay stream and two agent threads for as long as the client held it, and the control plane read the
replica's answer into memory without bound (granian's transport queues whatever it is given). Now: at most
`--ingress-max-requests-per-client` (429) and `--ingress-max-requests-per-job` (503) go through, the agent's
threads stay bounded (/proc/<pid>/task), an `exec true` into the other user's job answers promptly, the
control plane's memory stays flat, and once the clients have read nothing for `--ingress-send-timeout` they
are dropped and the agent's threads go back to what they were.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

import pytest

from gpulayer.testing import ControlPlaneProcess, wait_for

from sockets import WS_ACCEPT

pytest.importorskip("granian")
pytestmark = pytest.mark.timeout(300)

PER_JOB, PER_CLIENT, SEND_TIMEOUT_S = 48, 8, 3
ADDRESSES = [f"127.0.0.{n}" for n in range(2, 12)]
PER_ADDRESS = 40

REPLICA = WS_ACCEPT + r"""
import http.server, os, struct, time

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        if self.path == "/ws":  # a WebSocket that sends 64 KiB messages without end
            ws_accept(self)
            block = b"\x82\x7f" + struct.pack("!Q", 65536) + b"x" * 65536
        elif self.path == "/big":
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            block = b"x" * 65536
        else:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
            return
        while True:  # without end: only the client's reading (or its dropping) stops it
            self.wfile.write(block)
            time.sleep(0.02)

    def do_POST(self):  # an echo (test_security_framing_ingress.py)
        body = b""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while size := int(self.rfile.readline().split(b";")[0], 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024

Server(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
"""


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    args = ["--http", "granian", "--ingress-max-requests-per-job", str(PER_JOB),
            "--ingress-max-requests-per-client", str(PER_CLIENT), "--ingress-send-timeout", str(SEND_TIMEOUT_S)]
    with ControlPlaneProcess(tmp_path_factory.mktemp("flood"), heartbeat_interval=0.5, lease_ttl=5, args=args) as plane:
        plane.start_worker("flood-w", parallel=4, timeout=60)
        yield plane


@pytest.fixture(scope="module")
def service(plane) -> int:
    """The replica above behind a `public` ingress: its job id."""
    done = plane.cli("submit", "--service", "--ingress", "public", "--", sys.executable, "-c", REPLICA, timeout=180)
    assert done.returncode == 0, done.stderr + plane.logs()
    return int(done.stdout.split()[0])


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _settled_threads(pid: int) -> int:
    """The agent's threads once their count has held for a second (streams of an earlier test ending)."""
    counts: list[int] = []

    def held() -> int | None:
        counts.append(_threads(pid))
        time.sleep(0.25)
        return counts[-1] if len(counts) >= 5 and len(set(counts[-5:])) == 1 else None

    return wait_for(held, 30, "the agent's threads to settle")


def _rss_mib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(f.read().split("VmRSS:")[1].split()[0]) // 1024


def _flood(port: int, job_id: int) -> list[socket.socket]:
    """PER_ADDRESS requests from each of ADDRESSES, each on its own connection that never reads."""
    held = []
    for address in ADDRESSES:
        for _ in range(PER_ADDRESS):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.bind((address, 0))
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /ingress/%d/big HTTP/1.1\r\nHost: x\r\n\r\n" % job_id)
            held.append(s)
    return held


def _status(s: socket.socket) -> int | None:
    """The status line's code of what came on `s`, read without taking it (MSG_PEEK): the window stays shut."""
    try:
        head = s.recv(64, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (BlockingIOError, OSError):
        return None
    return int(head.split(b" ")[1]) if head.startswith(b"HTTP/1.1 ") else None


def test_never_read_requests_are_capped_paced_and_dropped(plane, service):
    made = plane.cli("user", "add", "flood-other", "--json")
    assert made.returncode == 0, made.stderr
    other = json.loads(made.stdout)["token"]
    submitted = plane.cli("submit", "--", "sleep", "600", GPULAYER_TOKEN=other)
    assert submitted.returncode == 0, submitted.stderr
    theirs = int(submitted.stdout.split()[0])
    plane.wait_task_running(theirs, timeout=60)  # the job reads running once assigned; exec needs the task started

    from gpulayer.client.api import connect
    their_job = connect(url=plane.url, token=other).get_job(theirs)
    assert their_job.exec(["true"]).returncode == 0  # the relay link is up; the baseline below is warm
    agent = plane.workers["flood-w"].pid
    assert agent is not None and plane.proc is not None
    threads_before, rss_before = _settled_threads(agent), _rss_mib(plane.proc.pid)

    held = _flood(plane.port, service)
    try:
        time.sleep(2)  # the admitted ones are streaming by now, and their clients read nothing
        threads_during = _threads(agent)
        # two threads per admitted request at most, and the cap per job holds over the ten addresses
        assert threads_during <= threads_before + 2 * PER_JOB + 16, (threads_before, threads_during)
        started = time.monotonic()
        assert their_job.exec(["true"]).returncode == 0
        took = time.monotonic() - started
        assert took < 5, f"exec into another user's job took {took:.1f} s under the flood"
        codes = [_status(s) for s in held]
        assert codes.count(200) == PER_JOB and codes.count(429) + codes.count(503) == len(held) - PER_JOB, codes
        for n in range(len(ADDRESSES)):  # no address past its cap, however the job's places were shared
            assert codes[n * PER_ADDRESS:(n + 1) * PER_ADDRESS].count(200) <= PER_CLIENT, codes
        full = next(s for s, code in zip(held, codes) if code == 503)
        assert b"retry-after: 1" in full.recv(4096, socket.MSG_PEEK).lower()
        refused = next(s for s, code in zip(held, codes) if code == 429)
        body = refused.recv(4096, socket.MSG_PEEK).split(b"\r\n\r\n", 1)[1]
        assert json.loads(body)["error"]["code"] == "too_many_requests", body
        # the clients still read nothing: past the send deadline they are dropped, their streams ended
        wait_for(lambda: _threads(agent) <= threads_before + 4, SEND_TIMEOUT_S + 30,
                 "the agent's threads for the stalled requests to end")
        grown = _rss_mib(plane.proc.pid) - rss_before
        assert grown < 150, f"the control plane grew {grown} MiB buffering answers nobody reads"
    finally:
        for s in held:
            s.close()
    page = socket.create_connection(("127.0.0.1", plane.port), timeout=10)
    with page:
        page.sendall(b"GET /ingress/%d/small HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % service)
        answer = b""
        while chunk := page.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"ok"), answer  # the caps were given back


def test_a_slow_reader_is_paced_not_dropped(plane, service):
    """A client that reads slowly but steadily, for longer than the send deadline, keeps its answer."""
    with socket.create_connection(("127.0.0.1", plane.port), timeout=30) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(b"GET /ingress/%d/big HTTP/1.1\r\nHost: x\r\n\r\n" % service)
        got = 0
        until = time.monotonic() + 3 * SEND_TIMEOUT_S
        while time.monotonic() < until:
            chunk = s.recv(65536)
            assert chunk, f"the answer was cut after {got} bytes"
            got += len(chunk)
            time.sleep(0.25)  # a quarter of a second between reads: slow, never stalled for the deadline
        assert got > 64 * 1024, got


def test_a_websocket_nobody_reads_is_dropped(plane, service):
    """The same send deadline for a WebSocket whose client reads none of the replica's messages."""
    agent = plane.workers["flood-w"].pid
    assert agent is not None
    before = _settled_threads(agent)
    held = []
    for _ in range(4):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", plane.port))
        s.sendall(b"GET /ingress/%d/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n" % service)
        held.append(s)
    try:
        wait_for(lambda: all(_status(s) == 101 for s in held), 30, "the upgrades to be answered")
        wait_for(lambda: _threads(agent) >= before + 8, 30, "the streams to be open on the agent")
        wait_for(lambda: _threads(agent) <= before + 1, SEND_TIMEOUT_S + 30,
                 "the agent's threads for the unread WebSockets to end")
        assert "ingress_client_stalled" in (plane.root / "server.log").read_text()
    finally:
        for s in held:
            s.close()
