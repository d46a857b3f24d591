"""Clients that go away mid-TLS or mid-request leave one line at most in the terminal, with its time (issue 22 item 21).

A real `gpulayer server start` (cheroot, then granian) and a real `gpulayer
up`, over TLS; clients reset or close in the handshake, in the head, in a
sized or chunked body, and before reading the answer. Then the server still
answers, its output has no traceback, and every log line starts with a time.
Loopback only.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import ssl
import struct
import subprocess
import time

import pytest
import requests

from gpulayer.testing import CLI, ControlPlaneProcess, free_port, wait_for

pytestmark = pytest.mark.timeout(120)

STAMPED = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")
FRONT_ENDS = ["cheroot", pytest.param("granian", marks=pytest.mark.skipif(
    importlib.util.find_spec("granian") is None, reason="no granian"))]


def _reset(s: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a killed client does."""
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    socket.socket.close(s)


def _disconnect_in_every_way(port: int, cafile: str, token: str) -> None:
    ctx = ssl.create_default_context(cafile=cafile)

    def tls() -> ssl.SSLSocket:
        return ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5), server_hostname="127.0.0.1")

    upload = f"PUT /v1/artifacts/sha256:{'0' * 64} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    raw.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # a ClientHello's start, then a reset
    _reset(raw)
    tls().close()                                                      # a handshake, then nothing
    for request in (b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\n",          # half a head
                    (upload + "Content-Length: 1000000\r\n\r\nabc").encode(),          # a sized body cut short
                    (upload + "Transfer-Encoding: chunked\r\n\r\n5\r\nab").encode(),   # a chunked body cut short
                    b"GET /v1/openapi.json HTTP/1.1\r\nHost: x\r\n\r\n"):              # gone before the answer
        for close in (lambda s: s.close(), _reset):
            s = tls()
            s.sendall(request)
            time.sleep(0.2)  # let the server be part-way through it
            close(s)


def _check_output(text: str) -> None:
    assert "Traceback" not in text, text
    unstamped = [line for line in text.splitlines() if line.strip() and not STAMPED.match(line)]
    assert unstamped == [], text


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_server_start_logs_disconnects_in_one_stamped_line_at_most(tmp_path, front_end):
    with ControlPlaneProcess(tmp_path, tls=True, args=["--http", front_end]) as plane:
        _disconnect_in_every_way(plane.port, str(plane.ca_file), plane.client_token)
        assert requests.get(f"{plane.url}/v1/health", verify=plane.verify, timeout=5).status_code == 200
        time.sleep(0.5)  # the server's last lines about the clients (nothing to await)
        _check_output((tmp_path / "server.log").read_text())


def test_up_logs_disconnects_in_one_stamped_line_at_most(tmp_path):
    home, port = tmp_path / "home", free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    with open(tmp_path / "out.txt", "w") as out, open(tmp_path / "err.txt", "w") as err:
        proc = subprocess.Popen([*CLI, "up", "--home", str(home), "--host", "127.0.0.1", "--port", str(port)],
                                stdout=out, stderr=err, env=env)
    try:
        client = home / "client.json"
        wait_for(lambda: client.exists() and "Ctrl-C" in (tmp_path / "out.txt").read_text(), 60, "gpulayer up")
        settings = json.loads(client.read_text())
        _disconnect_in_every_way(port, settings["ca_file"], settings["token"])
        assert requests.get(f"{settings['url']}/v1/health", verify=settings["ca_file"], timeout=5).ok
        time.sleep(0.5)  # the last lines about the clients (nothing to await)
    finally:
        proc.terminate()
        proc.wait(30)
    assert "Traceback" not in (tmp_path / "out.txt").read_text()  # stdout: the join line, to copy as it is
    _check_output((tmp_path / "err.txt").read_text())
