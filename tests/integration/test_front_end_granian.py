"""`gpulayer server start --http granian`: what the cheroot front end guarantees, through granian.

Real server processes on loopback: TLS with the certificates `gpulayer up`
makes (`ensure_tls`), a parked long-poll acquire while heartbeats are served,
SIGTERM flushing acknowledged writes (stop waits for requests in progress),
slowloris heads that cost no heartbeats, a 64 MiB artifact round trip with
flat memory, a 503 without spinning when file descriptors run out, and plain
HTTP on the TLS port closed at once. The whole real-server suite runs under
granian with GPULAYER_TEST_HTTP=granian (docs/benchmarks/early.md, "Front ends").
"""
from __future__ import annotations

import hashlib
import os
import resource
import socket
import threading
import time

import pytest
import requests

from gpulayer.protocol import PROTOCOL, PROTOCOL_HEADER
from gpulayer.testing import ControlPlaneProcess, stop_process, wait_for

pytest.importorskip("granian")
pytestmark = pytest.mark.timeout(120)

GRANIAN = ["--http", "granian"]


def _headers(plane, token: str) -> dict:
    return {**plane.headers(token), PROTOCOL_HEADER: str(PROTOCOL)}


def _worker(plane, name: str) -> dict:
    r = requests.post(plane.url + "/v1/workers/register", verify=plane.verify, timeout=10,
                      json={"name": name, "labels": {}, "resources": {"cpus": 4, "gpus": 0, "memory_mb": 1024},
                            "version": "test", "slots": 1},
                      headers=_headers(plane, plane.join_token))
    assert r.status_code in (200, 201), r.text
    return r.json()


def _worker_post(plane, token: str, path: str, body: dict, timeout: float = 10) -> requests.Response:
    return requests.post(plane.url + path, json=body, headers=_headers(plane, token), verify=plane.verify,
                         timeout=timeout)


def test_tls_with_the_certificates_up_makes(tmp_path):
    from gpulayer.server.security.certs import ensure_tls
    made = ensure_tls(tmp_path / "up-home")  # what `gpulayer up` calls
    (tmp_path / "tls").mkdir()
    for key, name in (("ca", "ca.pem"), ("cert", "server.pem"), ("key", "server-key.pem")):
        (tmp_path / "tls" / name).write_bytes(made[key].read_bytes())  # where ControlPlaneProcess looks
    with ControlPlaneProcess(tmp_path, tls=True, args=GRANIAN) as plane:
        assert plane.url.startswith("https://")
        r = requests.get(plane.url + "/v1/health", verify=str(made["ca"]), timeout=5)
        assert r.status_code == 200
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(plane.url + "/v1/health", timeout=5)  # the system's CAs do not know ours
        job_id = plane.submit({"command": ["true"]})
        assert plane.job(job_id)["state"] == "queued"


def test_a_parked_acquire_does_not_hold_up_heartbeats_and_wakes_on_submit(tmp_path):
    with ControlPlaneProcess(tmp_path, args=GRANIAN) as plane:
        idle, busy = _worker(plane, "idle"), _worker(plane, "busy")
        got: dict = {}

        def park():
            began = time.monotonic()
            r = _worker_post(plane, idle["session_token"], "/v1/worker/acquire", {"wait_s": 20}, timeout=30)
            got.update(r.json(), waited=time.monotonic() - began)

        parked = threading.Thread(target=park)
        parked.start()
        time.sleep(0.5)  # let it park; nothing to poll for
        for _ in range(20):
            began = time.monotonic()
            r = _worker_post(plane, busy["session_token"], "/v1/worker/heartbeat", {"tasks": []})
            assert r.status_code == 200 and time.monotonic() - began < 1.0
        job_id = plane.submit({"command": ["true"]})
        parked.join(25)
        assert got["task"]["job_id"] == job_id and got["waited"] < 10, got


def test_sigterm_flushes_every_acknowledged_write(tmp_path):
    plane = ControlPlaneProcess(tmp_path, args=GRANIAN).start()
    acknowledged: list[int] = []
    stop = threading.Event()

    def submit():
        s = requests.Session()
        while not stop.is_set():
            try:
                r = s.post(plane.url + "/v1/jobs", json={"command": ["true"]}, headers=plane.headers(), timeout=5)
            except requests.RequestException:
                return
            if r.status_code != 201:
                return
            acknowledged.append(r.json()["id"])

    pool = [threading.Thread(target=submit) for _ in range(4)]
    for t in pool:
        t.start()
    time.sleep(1.5)
    assert stop_process(plane.proc) == 0, plane.logs()
    stop.set()
    for t in pool:
        t.join(10)
    assert len(acknowledged) > 10
    stored = {row[0] for row in plane.sql("SELECT id FROM jobs")}
    assert set(acknowledged) <= stored


def test_slowloris_heads_do_not_cost_heartbeats(tmp_path):
    with ControlPlaneProcess(tmp_path, args=GRANIAN) as plane:
        worker = _worker(plane, "w")
        clients = []
        for _ in range(400):
            s = socket.create_connection(("127.0.0.1", plane.port), timeout=5)
            s.sendall(b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\n")
            clients.append(s)
        try:
            end = time.monotonic() + 4
            while time.monotonic() < end:
                for s in clients:
                    try:
                        s.sendall(b"X-Slow: 1\r\n")
                    except OSError:
                        pass
                began = time.monotonic()
                r = _worker_post(plane, worker["session_token"], "/v1/worker/heartbeat", {"tasks": []}, timeout=2)
                assert r.status_code == 200 and time.monotonic() - began < 1.0
                time.sleep(0.5)  # the attacker's pace
        finally:
            for s in clients:
                s.close()


SIZE, CHUNK = 64 * 1024 * 1024, 1024 * 1024
BLOCK = os.urandom(CHUNK)


def _chunks():
    for i in range(SIZE // CHUNK):
        yield BLOCK[:-8] + i.to_bytes(8, "big")


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))


def test_a_64_mib_artifact_round_trip_with_flat_memory(tmp_path):
    with ControlPlaneProcess(tmp_path, args=GRANIAN) as plane:
        digest = hashlib.sha256()
        for chunk in _chunks():
            digest.update(chunk)
        name = "sha256:" + digest.hexdigest()
        before = _rss_kb(plane.pid)
        put = plane.request("PUT", f"/v1/artifacts/{name}", data=_chunks(), timeout=60,
                            headers={"Content-Type": "application/octet-stream"})
        assert put.status_code == 201, put.text
        back = hashlib.sha256()
        with plane.request("GET", f"/v1/artifacts/{name}", stream=True, timeout=60) as got:
            assert got.status_code == 200 and int(got.headers["Content-Length"]) == SIZE
            for chunk in got.iter_content(CHUNK):
                back.update(chunk)
        assert back.hexdigest() == digest.hexdigest()
        # Whole in memory would be at least SIZE (64 MiB); under a loaded machine granian's own
        # buffers grew 39 MiB once (the Python side reads slower), so the bound is 3/4 of SIZE.
        assert _rss_kb(plane.pid) - before < SIZE * 3 // 4 // 1024


def test_stop_returns_once_a_request_in_progress_has_answered():
    from gpulayer.server.frontends.granian_server import GranianServer

    def slow(environ, start_response):
        time.sleep(1.0)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"done"]

    server = GranianServer(slow, "127.0.0.1", 0, threads=2)
    server.start()
    got: dict = {}
    request = threading.Thread(target=lambda: got.update(
        r=requests.get(f"http://127.0.0.1:{server.port}/", timeout=10).text, at=time.monotonic()))
    request.start()
    time.sleep(0.3)  # the request is in the app
    server.stop(timeout=5)
    stopped = time.monotonic()
    request.join(10)
    assert got["r"] == "done" and got["at"] <= stopped + 0.1  # the state file closes only after this
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{server.port}/", timeout=2)


def _cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_out_of_descriptors_a_503_without_spinning_then_recovery(tmp_path):
    with ControlPlaneProcess(tmp_path, args=GRANIAN) as plane:
        pid = plane.pid
        in_use = len(os.listdir(f"/proc/{pid}/fd"))
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (in_use + 16, in_use + 16))
        idle: list[socket.socket] = []
        try:
            for _ in range(10):  # half-sent heads take what is free (silent ones never reach granian)
                for _ in range(8):
                    idle.append(socket.create_connection(("127.0.0.1", plane.port), timeout=5))
                    idle[-1].sendall(b"GET /v1/health HTTP/1.1\r\n")
                began = time.monotonic()
                answer = requests.get(f"{plane.url}/v1/health", timeout=10)
                if answer.status_code == 503:
                    break
            assert answer.status_code == 503 and answer.json()["error"]["code"] == "overloaded"
            assert time.monotonic() - began < 2  # granian retries accept every 0.5 s; each retry sheds
            cpu = _cpu_s(pid)
            time.sleep(1.0)
            assert _cpu_s(pid) - cpu < 0.5, "the accept loop spins while out of descriptors"
        finally:
            for sock in idle:
                sock.close()
        wait_for(plane.healthy, 30, "health once the descriptors are back")
        assert plane.submit({"command": ["true"]}) > 0
        assert plane.logs(200_000).count("http_fd_exhausted") <= 2  # one line per 10 s, not per retry
        assert "Failed to accept" not in plane.logs(200_000)


@pytest.mark.parametrize("front_end", ["granian", "cheroot"])
def test_plain_http_on_the_tls_port_is_refused_and_the_cli_says_https(tmp_path, front_end):
    with ControlPlaneProcess(tmp_path, tls=True, args=["--http", front_end]) as plane:
        began = time.monotonic()
        with socket.create_connection(("127.0.0.1", plane.port), timeout=5) as sock:
            sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            answer = b""
            try:
                while chunk := sock.recv(4096):
                    answer += chunk
            except ConnectionResetError:
                pass
        # cheroot: a readable 400; granian (rustls): a TLS alert record, read by gpulayer's client as
        # "use https://" (gpulayer/client/api.py); either closes at once.
        readable = b"HTTP/1.1 400" if front_end == "cheroot" else b"\x15\x03"
        assert answer == b"" or answer.startswith(readable), answer
        assert time.monotonic() - began < 2
        rc, _out, err = plane.cli("job", "list", GPULAYER_URL=plane.url.replace("https://", "http://"))
        assert rc != 0 and "https://" in err and "Traceback" not in err, err
        assert requests.get(plane.url + "/v1/health", verify=plane.verify, timeout=5).status_code == 200
