"""The relay's bounds under a hostile client (issue 36 items 3, 4, 9 and 17): a real control plane on granian, a real
worker, a raw WebSocket client speaking the relay protocol by hand.

- A client that grants itself a huge window and never reads: the control plane passes on at most a capped credit
  per stream and per connection and queues at most that, so its memory stays flat while `head -c 1G` runs.
- Each OPEN on an open socket is authorised afresh (a revoked token, a demoted admin), and a socket that opens
  no stream is closed.
- SIGNAL frames past the control frames' size, or more of them than may wait in the agent, end the stream with
  a clear error and leave the agent's memory flat.
- A frame that breaks the protocol closes the connection with 1008, as docs/protocol.md says.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from gpulayer.protocol import PROTOCOL, PROTOCOL_HEADER, wsclient
from gpulayer.protocol.relay import (
    CLOSE,
    DATA,
    EXT_DATA,
    INITIAL_WINDOW,
    MAX_DATA_HEADER,
    MAX_STREAM_ID,
    OPEN,
    SETTINGS,
    SIGNAL,
    WINDOW,
    decode,
    encode,
)
from gpulayer.testing import ControlPlaneProcess, wait_for

pytest.importorskip("granian")
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    plane = ControlPlaneProcess(tmp_path_factory.mktemp("relay-bounds"), heartbeat_interval=0.5)
    try:
        plane.start(timeout=120)
        plane.start_worker("w1", parallel=4, timeout=120)
        yield plane
    finally:
        plane.close()


@pytest.fixture(scope="module")
def job(plane):
    job_id = plane.submit({"command": ["sleep", "900"], "name": "target"})
    wait_for(lambda: plane.job(job_id)["tasks"][0]["state"] == "running", 60, "the target job to run")
    return job_id


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("VmRSS:")) / 1024


def raw_socket(plane, job_id: int, token: str | None = None, *, large: bool = True) -> wsclient.WebSocket:
    """A relay WebSocket to the job, no keepalive (nothing reads it unless the test does)."""
    headers = {"Authorization": f"Bearer {token or plane.client_token}", PROTOCOL_HEADER: str(PROTOCOL)}
    if large:
        headers[MAX_DATA_HEADER] = "262144"
    return wsclient.connect(f"ws://127.0.0.1:{plane.port}/v1/jobs/{job_id}/relay", headers=headers, ping_interval=None,
                            max_size=1 << 20, timeout=30)


def frames_until_close(ws: wsclient.WebSocket, stream_id: int, timeout: float = 30) -> tuple[int, dict]:
    """Read (granting back what came) until stream `stream_id`'s CLOSE: the bytes of DATA read and its fields."""
    got = 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        frame = decode(ws.recv(timeout=timeout), 262144)
        if frame.stream_id != stream_id:
            continue
        if frame.type in (DATA, EXT_DATA):
            got += frame.cost()
            ws.send(encode(stream_id, WINDOW, frame.cost()))
        elif frame.type == CLOSE:
            return got, frame.fields
    raise AssertionError(f"stream {stream_id} did not close within {timeout} s")


def test_a_huge_window_and_a_client_that_never_reads_leave_the_control_plane_flat(plane, job):
    """Item 3: two `head -c 1G /dev/zero` streams on one socket, each granted 2**32-1 bytes, never read."""
    assert plane.pid is not None
    before = rss_mib(plane.pid)
    ws = raw_socket(plane, job)
    ws.sock.setsockopt(__import__("socket").SOL_SOCKET, __import__("socket").SO_RCVBUF, 64 * 1024)
    streams = (1, 3)
    for sid in streams:
        ws.send(encode(sid, OPEN, {"kind": "exec", "argv": ["head", "-c", str(1 << 30), "/dev/zero"]}))
        ws.send(encode(sid, WINDOW, MAX_STREAM_ID - INITIAL_WINDOW))
    peak = before
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        peak = max(peak, rss_mib(plane.pid))
        time.sleep(0.2)
    print(f"control plane RSS {before:.0f} MiB, peak {peak:.0f} MiB while the client read nothing")
    assert peak - before < 64, f"the control plane grew {peak - before:.0f} MiB for a client that reads nothing"
    # Flow-controlled, not broken: once the client reads, the bytes come (within its window, never over it).
    got = 0
    while got < 32 * 1024 * 1024:
        frame = decode(ws.recv(timeout=30), 262144)
        assert frame.type in (DATA, EXT_DATA, WINDOW, SETTINGS), frame
        got += frame.cost()
    ws.close()
    assert plane.healthy()
    assert rss_mib(plane.pid) - before < 64

