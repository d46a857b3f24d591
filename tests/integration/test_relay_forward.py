"""`gpulayer port-forward` and the agent's `tcp` streams, end to end through a worker behind a NAT (issue 26).

The worker runs in a network namespace whose iptables drop every NEW inbound connection (tests/netns.py's
NatNamespace): it dials out to the control plane, and nothing reaches it. Its task serves HTTP, an echo and
a byte counter on 0.0.0.0; a direct connect to them fails, and through the relay: the HTTP answer, a transfer
both ways checksummed, 20 connections at once, a half-close, a port nothing listens on, a `network: none`
task (its own namespace, entered with setns), bad OPENs refused, and (on loopback) the CLI surviving its
agent's death and restart, then Ctrl-C.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import threading

import pytest
import requests

from gpulayer.client.api import connect
from gpulayer.client.forward import PortForward
from gpulayer.protocol.relay import CLOSE, DATA, EOF, LARGE_DATA, MAX_DATA, data
from gpulayer.relaylink.streams import Link
from gpulayer.relaylink.streams import connect as ws_connect
from gpulayer.testing import CLI, ControlPlaneProcess, clean_env, echo_round_trip, wait_for

from netns import nat_namespace, plane_behind_nat

pytest.importorskip("granian")
pytest.importorskip("websockets")
pytestmark = [pytest.mark.timeout(300), pytest.mark.netns]

HTTP, ECHO, COUNT = 18801, 18802, 18803
#: Bytes each way of the checksummed transfer (GPULAYER_TEST_FORWARD_MIB; the bench moves 1 GiB).
TRANSFER = int(os.environ.get("GPULAYER_TEST_FORWARD_MIB", "256")) * 1024 * 1024

TASK = r"""
import hashlib, http.server, socket, socketserver, sys, threading

class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while chunk := self.request.recv(65536):
            self.request.sendall(chunk)
        self.request.shutdown(socket.SHUT_WR)

class Count(socketserver.BaseRequestHandler):
    def handle(self):
        digest, size = hashlib.sha256(), 0
        while chunk := self.request.recv(65536):
            digest.update(chunk)
            size += len(chunk)
        self.request.sendall(f"{size} {digest.hexdigest()}\n".encode())

class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"hello from the task\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

class Server(socketserver.ThreadingTCPServer):
    daemon_threads = allow_reuse_address = True

for port, handler in ((18801, Hello), (18802, Echo), (18803, Count)):
    threading.Thread(target=Server((sys.argv[1], port), handler).serve_forever, daemon=True).start()
print("listening", flush=True)
threading.Event().wait()
"""


@pytest.fixture(scope="module")
def nat():
    yield from nat_namespace("fw")


@pytest.fixture(scope="module")
def plane(nat, tmp_path_factory):
    with plane_behind_nat(nat, tmp_path_factory.mktemp("forward"), "behind-nat", lease_ttl=5, args=["--relay-max-streams-per-user", "64"]) as plane:
        yield plane


def _serve(plane, **spec) -> int:
    """A job running TASK (HTTP, echo and count servers), once it listens."""
    job_id = plane.submit({"command": [sys.executable, "-c", TASK, spec.pop("host", "0.0.0.0")], **spec})
    wait_for(lambda: any("listening" in line["text"] for line in plane.get_json(f"/v1/jobs/{job_id}/logs")["lines"]), 120, "the task's servers")
    return job_id


@pytest.fixture(scope="module")
def served(plane) -> int:
    return _serve(plane, name="served")


@pytest.fixture(scope="module")
def job(plane, served):
    return connect(url=plane.url, token=plane.client_token, ca_file=str(plane.ca_file)).get_job(served)


def _echo(port: int, payload: bytes) -> bytes:
    """`payload` through the echo server, written and read at once; what came back."""
    with socket.create_connection(("127.0.0.1", port), 30) as conn:
        sender = threading.Thread(target=lambda: (conn.sendall(payload), conn.shutdown(socket.SHUT_WR)))
        sender.start()
        back = bytearray()
        while chunk := conn.recv(1 << 16):
            back += chunk
        sender.join()
    return bytes(back)


def _said(stream) -> str:
    """What a running process wrote to a pipe so far (not waiting for more)."""
    os.set_blocking(stream.fileno(), False)
    try:
        return os.read(stream.fileno(), 1 << 16).decode(errors="replace")
    except (BlockingIOError, OSError):
        return ""


def test_behind_the_nat_only_the_relay_reaches_the_task(plane, nat, served, job):
    assert not nat.reachable(HTTP), "the NAT namespace let a connection in"
    heard: list[str] = []
    with job.port_forward(HTTP, on_event=heard.append) as forward:
        try:
            answer = requests.get(f"http://127.0.0.1:{forward.local_port}/", timeout=30)
        except requests.ConnectionError as exc:
            raise AssertionError(f"the forwarded connection failed: {heard}") from exc
        assert (answer.status_code, answer.text) == (200, "hello from the task\n")
        again = requests.get(f"http://127.0.0.1:{forward.local_port}/again", timeout=30)
        assert again.status_code == 200
    wait_for(lambda: len(plane.sql("SELECT 1 FROM sessions WHERE kind = 'tcp' AND closed_at IS NOT NULL")) >= 2, 30, "the sessions rows")
    rows = plane.sql("SELECT detail, job_id FROM sessions WHERE kind = 'tcp'")
    assert {detail for detail, _ in rows} == {'{"port":18801}'} or {detail for detail, _ in rows} == {'{"port": 18801}'}, rows
    assert {job_id for _, job_id in rows} == {served}


def test_a_big_transfer_both_ways_is_checksummed(job):
    with job.port_forward(ECHO) as forward:
        echo_round_trip(forward.local_port, TRANSFER, os.urandom(4 * 1024 * 1024), timeout=30)


def test_twenty_connections_at_once(job):
    payloads = [os.urandom(1024 * 1024 + i) for i in range(20)]
    results: dict[int, bytes] = {}
    start = threading.Barrier(20)
    with job.port_forward(ECHO) as forward:

        def one(i: int) -> None:
            start.wait(30)
            results[i] = _echo(forward.local_port, payloads[i])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    assert sorted(results) == list(range(20))
    assert all(results[i] == payloads[i] for i in range(20))


def test_half_close_the_server_still_answers(job):
    payload = os.urandom(300_000)
    with job.port_forward(COUNT) as forward, socket.create_connection(("127.0.0.1", forward.local_port), 30) as conn:
        conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)  # the client is done writing; the server answers after that
        answer = b""
        while chunk := conn.recv(4096):
            answer += chunk
    assert answer.decode() == f"{len(payload)} {hashlib.sha256(payload).hexdigest()}\n"


def test_a_port_nothing_listens_on_ends_the_connection_with_a_clear_error(plane, served):
    heard: list[str] = []
    client = connect(url=plane.url, token=plane.client_token, ca_file=str(plane.ca_file))
    with PortForward(client, served, 18809, on_event=heard.append) as forward:
        with socket.create_connection(("127.0.0.1", forward.local_port), 30) as conn:
            assert conn.recv(10) == b""
        wait_for(lambda: heard, 30, "the connection's error")
    task_id = plane.job(served)["tasks"][0]["task_id"]
    assert heard == [f"connection 1: nothing listens on port 18809 in job {served} (task {task_id})"]


def test_a_task_with_a_network_of_its_own(plane):
    job_id = _serve(plane, name="netless", network="none", host="127.0.0.1")
    client = connect(url=plane.url, token=plane.client_token, ca_file=str(plane.ca_file))
    try:
        with client.get_job(job_id).port_forward(HTTP) as forward:
            answer = requests.get(f"http://127.0.0.1:{forward.local_port}/", timeout=30)
            assert answer.text == "hello from the task\n"
    finally:
        plane.cli("job", "cancel", str(job_id))


def test_bad_opens_are_refused_with_a_400(plane, served):
    ws = ws_connect(f"{plane.url}/v1/jobs/{served}/relay?kind=tcp", plane.client_token, str(plane.ca_file))
    link = Link(ws)
    link.start()
    try:
        for fields, words in (
            ({"port": 0}, "port"),
            ({"port": "80"}, "port"),
            ({"port": 18801, "host": "10.0.0.1"}, "loopback"),
            ({"port": 18801, "host": "example.com"}, "loopback"),
        ):
            stream = link.open({"kind": "tcp", **fields})
            frame = stream.recv(30)
            assert frame is not None and frame.type == CLOSE, frame
            assert frame.fields.get("status") == 400 and words in frame.fields["error"], frame.fields
    finally:
        link.close()


def _received(stream, want: int) -> bytes:
    """DATA from `stream` until `want` bytes (granting them back), or its CLOSE (AssertionError)."""
    got = bytearray()
    while len(got) < want:
        frame = stream.recv(60)
        assert frame is not None and frame.type in (DATA, EOF), frame
        if frame.type == EOF:
            break
        got += frame.data
        stream.consumed(len(frame.data))
    return bytes(got)


def test_frames_are_larger_between_peers_that_say_so(plane, served):
    """A client that announces LARGE_DATA hears (SETTINGS) that this agent takes it too, and sends frames of that
    size, which the agent takes (an agent that did not would drop the link): the byte count comes back right."""
    ws = ws_connect(f"{plane.url}/v1/jobs/{served}/relay?kind=tcp", plane.client_token, str(plane.ca_file))
    link = Link(ws)
    link.start()
    try:
        stream = link.open({"kind": "tcp", "port": COUNT})
        wait_for(lambda: stream.max_out == LARGE_DATA, 30, "the control plane's SETTINGS")
        payload = os.urandom(4 * 1024 * 1024)
        assert stream.write(payload)
        stream.eof()
        answer = _received(stream, 200)
        assert answer == f"{len(payload)} {hashlib.sha256(payload).hexdigest()}\n".encode(), answer
    finally:
        link.close()


def test_a_client_that_says_nothing_keeps_64_kib_frames_both_ways(plane, served):
    """An older client (no MAX_DATA_HEADER, a 64 KiB limit) gets no SETTINGS and no frame over 64 KiB (its Link
    would drop the connection at the first), and one it sends over 64 KiB costs it its connection."""
    ws = ws_connect(f"{plane.url}/v1/jobs/{served}/relay?kind=tcp", plane.client_token, str(plane.ca_file), max_data=MAX_DATA)
    link = Link(ws, max_data=MAX_DATA)
    link.start()
    try:
        stream = link.open({"kind": "tcp", "port": ECHO})
        payload = os.urandom(8 * 1024 * 1024)
        sender = threading.Thread(target=lambda: (stream.write(payload), stream.eof()))
        sender.start()
        assert _received(stream, len(payload)) == payload
        sender.join()
        assert stream.max_out == MAX_DATA and not link.closed.is_set()
        other = link.open({"kind": "tcp", "port": COUNT})
        link.send(data(other.id, b"x" * (MAX_DATA + 1)))
        wait_for(link.closed.is_set, 30, "the control plane to drop the connection")
    finally:
        link.close()


def test_cli_usage_errors(plane, served):
    rc, _, err = plane.cli("port-forward", str(served), "1:2:3")
    assert rc == 2 and "LOCAL" in err, err
    rc, _, err = plane.cli("port-forward", "999999", "80")
    assert rc == 1 and "999999" in err, err


def test_cli_survives_the_agent_restarting_and_ctrl_c_ends_it(tmp_path):
    with ControlPlaneProcess(tmp_path, tls=True, heartbeat_interval=0.5, lease_ttl=3).start(timeout=120) as plane:
        plane.start_worker("victim", timeout=120)
        job_id = _serve(plane, retry={"max_attempts": 3})
        proc = subprocess.Popen(
            [*CLI, "port-forward", str(job_id), f":{ECHO}"],
            env=clean_env(**plane.cli_env()),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.startswith("Forwarding from 127.0.0.1:") and line.endswith(f" -> {ECHO}\n"), line
            port = int(line.split(":")[1].split()[0])
            first = _echo(port, b"before")
            assert first == b"before", f"the first echo gave {first!r}; port-forward said {_said(proc.stderr)!r}"
            held = socket.create_connection(("127.0.0.1", port), 30)
            held.sendall(b"x")
            assert held.recv(1) == b"x"

            plane.workers["victim"].kill()  # the agent dies, and its task with it
            held.settimeout(60)
            assert held.recv(10) == b"", "the open connection ends"
            held.close()
            plane.start_worker("victim", args=["--no-exec"], timeout=120)  # back, and tcp is no command kind
            wait_for(lambda: plane.job(job_id)["tasks"][-1]["state"] == "running", 120, "the task's next attempt")
            wait_for(lambda: sum("listening" in line["text"] for line in plane.get_json(f"/v1/jobs/{job_id}/logs")["lines"]) >= 2, 120, "its servers")
            assert _echo(port, b"after" * 1000) == b"after" * 1000  # the same listener, a new agent link
        finally:
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "Error: connection 2:" in err and "agent" in err, err
