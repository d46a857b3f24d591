"""The caller's token never reaches a replica, however its name is spelled (issue 36 item 12).

The ingress reads `?token=` with parse_qsl, which decodes the name, but took out of the query it passes on only
a literal `token=`: a WebSocket upgrade to `/ingress/<id>/ws?%74oken=<token>` was let in and the replica got
(and logged) the caller's token. Real `server start` (granian), worker and service behind `--ingress`
(token); the replica prints every request's head to its log, which the test then reads whole (`gpulayer job
logs`), with the control plane's own log.
"""

from __future__ import annotations

import sys

import pytest
import requests

from gpulayer.testing import ControlPlaneProcess, wait_for

pytest.importorskip("granian")
pytestmark = pytest.mark.timeout(240)

REPLICA = r"""
import base64, hashlib, os, socket, threading

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

def serve(conn):
    reader, lines = conn.makefile("rb"), []
    while line := reader.readline().rstrip(b"\r\n"):
        lines.append(line.decode("latin-1"))
    print("request " + " | ".join(lines), flush=True)  # what a replica logs of its requests
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if headers.get("upgrade", "").lower() == "websocket":
        accept = base64.b64encode(hashlib.sha1((headers["sec-websocket-key"] + GUID).encode()).digest()).decode()
        conn.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      "Sec-WebSocket-Accept: " + accept + "\r\n\r\n").encode())
        while conn.recv(65536):
            pass
    else:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
    conn.close()

listener = socket.create_server(("127.0.0.1", int(os.environ["PORT"])))
while True:
    threading.Thread(target=serve, args=(listener.accept()[0],), daemon=True).start()
"""

SPELLINGS = ["%74oken", "tok%65n", "%74%6F%6B%65%6E"]


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    with ControlPlaneProcess(tmp_path_factory.mktemp("token"), heartbeat_interval=0.5, args=["--http", "granian"]) as plane:
        plane.start_worker("token-w", timeout=60)
        yield plane


def test_a_token_spelled_otherwise_is_taken_out_of_what_the_replica_gets(plane):
    from websockets.sync.client import connect

    done = plane.cli("submit", "--service", "--ingress", "--", sys.executable, "-c", REPLICA, timeout=180)
    assert done.returncode == 0, done.stderr + plane.logs()
    job_id = int(done.stdout.split()[0])
    token = plane.client_token
    for n, name in enumerate(SPELLINGS):
        with connect(f"ws://127.0.0.1:{plane.port}/ingress/{job_id}/ws{n}?{name}={token}&keep=1", open_timeout=30) as ws:
            assert ws.response.status_code == 101  # the token let the upgrade in
    seen = requests.get(f"{plane.url}/ingress/{job_id}/page?%74oken={token}&keep=2",
                        headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert seen.status_code == 200 and seen.text == "ok"

    # Wait for each expected request by name: the worker's readiness probe opens a connection that sends
    # nothing (an empty "request " line), so counting lines could stop before the last one is uploaded.
    expected = [f"GET /ws{n}?keep=1 HTTP/1.1" for n in range(len(SPELLINGS))] + ["GET /page?keep=2 HTTP/1.1"]

    def logged() -> str:
        out = plane.cli("job", "logs", str(job_id)).stdout
        return out if all(line in out for line in expected) else ""

    log = wait_for(logged, 30, "the replica's log of its requests")
    assert token not in log, log
    assert token not in (plane.root / "server.log").read_text(errors="replace")
