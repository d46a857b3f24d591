"""Out of file descriptors: 503 and nothing committed, never a 500 whose write went through.

The server raises its soft fd limit at start (a real process); readers are a
pool opened at start, so a request opens no file after its write commits.
"""
from __future__ import annotations

import hashlib
import json
import os
import resource
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import falcon.testing
import pytest

from gpulayer.server.http.app import create_app, new_deps
from gpulayer.testing import ControlPlaneProcess


def _limits(pid: int) -> tuple[int, int]:
    for line in open(f"/proc/{pid}/limits"):
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no Max open files line")


def test_server_start_raises_the_soft_fd_limit_to_the_hard_one(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip(f"the hard fd limit here is only {hard}")
    plane = ControlPlaneProcess(tmp_path)
    plane.init()
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))  # the child inherits it
    try:
        plane.start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        server_soft, server_hard = _limits(plane.pid)
        assert server_soft == server_hard > 256
    finally:
        plane.close()


@contextmanager
def no_free_fds():
    """No file can be opened in this process meanwhile (EMFILE): the soft limit sits at the lowest free fd."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest = os.dup(0)
    os.close(lowest)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _state_file_fds(state) -> int:
    """This process's descriptors open on the state file (and its -wal, -shm): counting only those,
    what else the process opens or closes meanwhile (pytest-xdist's channel, a collected socket) does not
    count."""
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed since listed
            continue
        found += target.startswith(str(state))
    return found


def test_readers_are_a_bounded_pool_opened_at_start(store, config):
    before = _state_file_fds(config.layout.state)
    assert before > 0
    with ThreadPoolExecutor(48) as pool:
        list(pool.map(lambda i: store.read(lambda conn: conn.execute("SELECT count(*) FROM jobs").fetchall()),
                      range(480)))
    assert _state_file_fds(config.layout.state) == before


@pytest.fixture
def app(config, clock):
    deps = new_deps(config, clock=clock)
    yield falcon.testing.TestClient(create_app(deps)), deps
    deps.store.close()


def test_out_of_fds_a_submit_is_acknowledged_and_an_upload_answers_503(app, home):
    api, deps = app
    headers = {"Authorization": f"Bearer {json.loads((home / 'tokens.json').read_text())['client_token']}"}
    data = b"bytes of an artifact"
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    warm = api.simulate_post("/v1/jobs", headers=headers, json={"command": ["true"]})  # lazy imports done
    assert api.simulate_put(f"/v1/artifacts/sha256:{'0' * 64}", headers=headers, body=b"x").status_code == 400
    with ThreadPoolExecutor(1) as fresh, no_free_fds():  # a request thread that never read before
        submitted = fresh.submit(api.simulate_post, "/v1/jobs", headers=headers, json={"command": ["true"]}).result()
        upload = fresh.submit(api.simulate_put, f"/v1/artifacts/{digest}", headers=headers, body=data).result()
    assert submitted.status_code == 201, submitted.text  # the write and its answer need no new file
    assert upload.status_code == 503 and upload.json["error"]["code"] == "unavailable", upload.text
    stored = deps.store.read(lambda conn: conn.execute("SELECT id FROM jobs").fetchall())
    assert [r["id"] for r in stored] == [warm.json["id"], submitted.json["id"]]
    assert deps.store.read(lambda conn: conn.execute("SELECT count(*) AS n FROM artifacts").fetchall())[0]["n"] == 0
    assert not deps.artifacts.exists(digest)
    assert api.simulate_put(f"/v1/artifacts/{digest}", headers=headers, body=data).status_code == 201


def _cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize("front_end", ["granian", "cheroot"])
def test_a_server_out_of_descriptors_answers_503_and_recovers(tmp_path, front_end):
    import socket
    import time

    import requests

    from gpulayer.testing import wait_for

    with ControlPlaneProcess(tmp_path, args=["--http", front_end]) as plane:
        pid = plane.proc.pid
        in_use = len(os.listdir(f"/proc/{pid}/fd"))
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (in_use + 16, in_use + 16))
        holders = []
        try:
            for _ in range(40):  # half-sent heads: each one the server accepts costs it a descriptor
                holders.append(socket.create_connection(("127.0.0.1", plane.port), timeout=5))
                holders[-1].sendall(b"GET /v1/health HTTP/1.1\r\n")  # granian never sees a silent one
            wait_for(lambda: len(os.listdir(f"/proc/{pid}/fd")) >= in_use + 14, 10, "the server to run out")
            # the count can sit a descriptor or two below the limit while a connection is being set up or
            # closed: ask until the server is at it (a 200 meanwhile is a descriptor it still had)
            def out_of_descriptors():
                r = requests.get(f"{plane.url}/v1/health", timeout=10)
                if r.status_code == 503:
                    return (r,)  # (r,): a 503 Response is falsy
                try:  # it still had one (its guard may close a stalled connection when full): take another
                    holders.append(socket.create_connection(("127.0.0.1", plane.port), timeout=5))
                    holders[-1].sendall(b"GET /v1/health HTTP/1.1\r\n")
                except OSError:
                    pass
                return None

            answer, = wait_for(out_of_descriptors, 30, "a 503 while out of descriptors")
            assert answer.json()["error"]["code"] == "overloaded"
            before = _cpu_seconds(pid)
            time.sleep(1.0)  # what the server burns while clients wait in the backlog
            assert _cpu_seconds(pid) - before < 0.5, "the accept loop spins while out of descriptors"
        finally:
            for sock in holders:
                sock.close()
        wait_for(lambda: plane.healthy(), 30, "health once the descriptors are back")
        assert plane.submit({"command": ["true"]}) > 0
        assert plane.logs(200_000).count("http_fd_exhausted") <= 3
