"""Clients that hold connections open against a real `gpulayer server start`, without stalling heartbeats.

More connections than the server has threads (320): slowloris request heads
(a header line every so often), partial TLS ClientHellos, parked log
long-polls, and request bodies trickled a byte at a time (issue 22 item 1:
on both front ends, plain and TLS; issue 25: every test here runs on both). Meanwhile a real worker heartbeats at a 3 s lease TTL while it
runs a task: the task must finish on its first attempt, never be lost, and
/v1/health must answer throughout. Loopback only; every loop is bounded. One control plane
and worker per front end and transport (four) serve the tests that attack it, one test after another.
"""
from __future__ import annotations

import socket
import ssl
import time

import pytest
import requests

from gpulayer.testing import ControlPlaneProcess, task_dirs, wait_for

pytestmark = pytest.mark.timeout(180)

CONNECTIONS = 400
ATTACK_S = 7.0  # more than twice the lease TTL
#: The task runs until the test has done attacking and creates this file in its working directory.
UNTIL_GO = "i=0; while [ ! -e go ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done; [ -e go ]"

FRONT_ENDS = [pytest.param("granian", id="granian"), pytest.param("cheroot", id="cheroot")]


def _plane(request, tmp_path_factory, tls: bool):
    """One control plane and worker per front end and transport, shared by the tests that attack it: each
    test's attack ends (its sockets closed) and its task finishes before the next one starts."""
    front_end = request.param
    root = tmp_path_factory.mktemp(f"{front_end}-{'tls' if tls else 'plain'}")
    with ControlPlaneProcess(root, tls=tls, heartbeat_interval=0.5, lease_ttl=3, args=["--http", front_end]) as plane:
        plane.start_worker("w1")
        yield plane


@pytest.fixture(scope="module")
def plain(request, tmp_path_factory):
    """The plain-HTTP plane of the front end the test is parametrized with (`indirect`)."""
    yield from _plane(request, tmp_path_factory, tls=False)


@pytest.fixture(scope="module")
def tls(request, tmp_path_factory):
    """The TLS plane of the front end the test is parametrized with (`indirect`)."""
    yield from _plane(request, tmp_path_factory, tls=True)


def _running_job(plane) -> int:
    job_id = plane.submit({"command": ["sh", "-c", UNTIL_GO]})
    plane.wait_job(job_id, states=("running",))
    return job_id


def _hold(plane, clients: list, trickle: bytes | None) -> None:
    """Keep the clients open for ATTACK_S, trickling a line each second; health must answer all along."""
    end = time.monotonic() + ATTACK_S
    while time.monotonic() < end:
        began = time.monotonic()
        r = requests.get(f"{plane.url}/v1/health", verify=plane.verify, timeout=2)
        assert r.status_code == 200 and time.monotonic() - began < 2
        if trickle:
            for s in clients:
                try:
                    s.sendall(trickle)
                except OSError:
                    pass
        time.sleep(1.0)  # the attacker's pace; nothing to await


def _not_lost(plane, job_id: int) -> None:
    """The task ran through the attack: told to end now, it finishes on its first attempt, never lost."""
    task_id = plane.job(job_id)["tasks"][0]["task_id"]
    workdir = next(path for path in task_dirs(plane.workers["w1"].state_dir) if path.name == f"{task_id}-1")
    (workdir / "go").touch()
    job = plane.wait_job(job_id, timeout=30)
    kinds = [e["kind"] for e in plane.events(job_id)]
    assert job["state"] == "succeeded" and "task_lost" not in kinds, (job, kinds, plane.logs())
    assert [t["attempt"] for t in job["tasks"]] == [1]


def _connect(plane, first: bytes) -> list:
    clients = []
    for _ in range(CONNECTIONS):
        s = socket.create_connection(("127.0.0.1", plane.port), timeout=5)
        s.sendall(first)
        clients.append(s)
    return clients


@pytest.mark.parametrize("plain", FRONT_ENDS, indirect=True)
def test_slowloris_heads_do_not_cost_heartbeats(plain):
    plane = plain
    job_id = _running_job(plane)
    clients = _connect(plane, b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\n")
    try:
        _hold(plane, clients, b"X-Slow: 1\r\n")
    finally:
        for s in clients:
            s.close()
    _not_lost(plane, job_id)


@pytest.mark.parametrize("tls", FRONT_ENDS, indirect=True)
def test_partial_client_hellos_do_not_cost_heartbeats(tls):
    plane = tls
    job_id = _running_job(plane)
    clients = _connect(plane, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # a ClientHello's start
    try:
        _hold(plane, clients, None)
    finally:
        for s in clients:
            s.close()
    _not_lost(plane, job_id)


LARGE = 10 * 1024 * 1024  # streamed, not buffered: these take a thread each, up to a quarter of them


def _open(plane, head: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", plane.port), timeout=5)
    if plane.tls:
        s = ssl.create_default_context(cafile=str(plane.ca_file)).wrap_socket(s, server_hostname="127.0.0.1")
    s.sendall(head)
    return s


@pytest.mark.parametrize("plain", FRONT_ENDS, indirect=True)
def test_trickled_bodies_do_not_cost_heartbeats(plain):
    """Heads sent whole, then a body byte at a time: small bodies (no token: the explorer's login; with
    one: a job submission) and large ones (an artifact upload). The worker's task at TTL 3 s is not lost."""
    _trickle(plain)


@pytest.mark.parametrize("tls", FRONT_ENDS, indirect=True)
def test_trickled_bodies_over_tls_do_not_cost_heartbeats(tls):
    """The same over TLS."""
    _trickle(tls)


def _trickle(plane) -> None:
    job_id = _running_job(plane)
    token = f"Authorization: Bearer {plane.client_token}\r\n"
    heads = [
        b"POST /explorer/-/login HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n"
        b"Content-Length: 1000\r\n\r\nt",
        f"POST /v1/jobs HTTP/1.1\r\nHost: x\r\n{token}Content-Type: application/json\r\n"
        f"Content-Length: 1000\r\n\r\n{{".encode(),
        f"PUT /v1/artifacts/sha256:{'0' * 64} HTTP/1.1\r\nHost: x\r\n{token}Content-Length: {LARGE}\r\n\r\nx".encode(),
    ]
    clients = [_open(plane, heads[i % len(heads)]) for i in range(CONNECTIONS)]
    try:
        _hold(plane, clients, b" ")
        answered = requests.post(f"{plane.url}/v1/jobs", json={"command": ["true"]}, verify=plane.verify,
                                 headers={"Authorization": f"Bearer {plane.client_token}"}, timeout=5)
        assert answered.status_code == 201, answered.text
    finally:
        for s in clients:
            s.close()
    _not_lost(plane, job_id)


# Last on its planes: its followers may stay parked in the server past the test (their wait_s is 30 s).
@pytest.mark.parametrize("plain", FRONT_ENDS, indirect=True)
def test_parked_log_followers_do_not_cost_heartbeats(plain):
    plane = plain
    job_id = _running_job(plane)
    after = 10 ** 9  # past every line: each follower parks
    request = (f"GET /v1/jobs/{job_id}/logs?wait_s=30&after={after} HTTP/1.1\r\nHost: x\r\n"
               f"Authorization: Bearer {plane.client_token}\r\n\r\n").encode()
    clients = _connect(plane, request)
    try:
        # past the cap a follower is answered at once and told to pause
        page = wait_for(lambda: (p := plane.get_json(f"/v1/jobs/{job_id}/logs", timeout=35, params={
            "wait_s": 30, "after": after})).get("retry_after_s") and p, 30, "a follower past the cap")
        assert page["lines"] == [] and page["retry_after_s"] > 0
        _hold(plane, clients, None)
    finally:
        for s in clients:
            s.close()
    _not_lost(plane, job_id)
