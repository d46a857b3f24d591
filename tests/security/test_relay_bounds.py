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

import select
import time

import pytest

from gpulayer.relaylink import wsclient
from gpulayer.protocol import PROTOCOL, PROTOCOL_HEADER
from gpulayer.protocol.relay import (
    CLOSE,
    DATA,
    EXT_DATA,
    INITIAL_WINDOW,
    MAX_WAITING_CONTROL,
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



def _exec(ws: wsclient.WebSocket, sid: int, argv: list[str]) -> None:
    ws.send(encode(sid, OPEN, {"kind": "exec", "argv": argv}))


def _quiet(ws: wsclient.WebSocket, seconds: float = 2) -> None:
    """No CLOSE comes back for `seconds` (a stream running `sleep`; its WINDOWs may come)."""
    while ws.buf or select.select([ws.sock], [], [], seconds)[0]:
        frame = decode(ws.recv(), 262144)
        assert frame.type == WINDOW, f"the stream answered {frame} (it was refused?)"


def test_a_revoked_token_loses_its_open_socket_and_streams(plane, job):
    """Item 4: a token revoked while its socket is open: its running stream ends (401), the socket closes."""
    admin = plane.client()
    minted = admin.create_token(kind="client", user="admin")
    ws = raw_socket(plane, job, minted["token"])
    _exec(ws, 1, ["sleep", "600"])
    _exec(ws, 3, ["true"])
    assert frames_until_close(ws, 3)[1].get("exit_code") == 0
    admin.revoke_token(minted["jti"])
    _, fields = frames_until_close(ws, 1)
    assert fields.get("status") == 401 and "token" in fields["error"], fields
    with pytest.raises(wsclient.ConnectionClosed):
        while True:
            ws.recv(timeout=30)


def test_an_expired_token_opens_nothing_on_its_old_socket(plane, job):
    """Item 4: each OPEN is authorised afresh (an expiry reaches no invalidate(): only the OPEN's check sees it)."""
    minted = plane.client().create_token(kind="client", user="admin", expires_in_s=6)
    ws = raw_socket(plane, job, minted["token"])
    _exec(ws, 1, ["true"])
    assert frames_until_close(ws, 1)[1].get("exit_code") == 0
    wait_for(lambda: time.time() > minted["expires_at"] + 0.5, 30, "the token to expire")
    _exec(ws, 3, ["true"])
    _, fields = frames_until_close(ws, 3)
    assert fields.get("status") == 401 and fields.get("code") == "unauthorized", fields


def test_a_demoted_admin_loses_its_streams_into_another_users_job(plane, job):
    """Item 4: an admin's exec into a member's job, on a socket opened while it was admin, ends when it is
    demoted; a new OPEN on that socket is refused."""
    admin = plane.client()
    boss = admin.add_user("boss36", admin=True)["token"]
    owner = admin.add_user("owner36")["token"]
    owned = plane.request("POST", "/v1/jobs", token=owner, json={"command": ["sleep", "900"], "name": "owned"}).json()["id"]
    wait_for(lambda: plane.job(owned)["tasks"][0]["state"] == "running", 60, "the member's job to run")
    ws = raw_socket(plane, owned, boss, large=False)
    _exec(ws, 1, ["sleep", "600"])
    _quiet(ws)
    admin.set_user("boss36", admin=False)
    _, fields = frames_until_close(ws, 1)
    assert fields.get("status") in (403, 404) and "rights changed" in fields["error"], fields
    _exec(ws, 3, ["true"])
    _, fields = frames_until_close(ws, 3)
    assert fields.get("status") in (403, 404), fields
    plane.cli("job", "cancel", str(owned))


def test_a_socket_that_opens_no_stream_is_closed(plane, job):
    """Item 4: an idle socket is timed out (OPEN_TIMEOUT_S for its first OPEN, and the sweep's few seconds)."""
    ws = raw_socket(plane, job)
    started = time.monotonic()
    with pytest.raises(wsclient.ConnectionClosed) as closed:
        ws.recv(timeout=40)
    assert closed.value.rcvd is not None, f"the socket stayed open: {closed.value}"  # not our own timeout
    assert time.monotonic() - started < 25


def _blocked_exec(plane, job_id: int, sid: int = 1) -> wsclient.WebSocket:
    """A socket with an exec stream whose command never reads its stdin, and a full stdin: the agent's feeder is
    stuck writing, so nothing takes the stream's frames out of its inbox."""
    ws = raw_socket(plane, job_id, large=False)
    _exec(ws, sid, ["sleep", "600"])
    for _ in range(INITIAL_WINDOW // 65536):  # the initial window: more than the pipe takes
        ws.send(encode(sid, DATA, b"x" * 65536))
    _quiet(ws)
    return ws


def test_signal_frames_past_the_bound_close_the_stream_and_leave_the_agent_flat(plane, job):
    """Item 9: control frames are outside flow control. Thousands of small SIGNALs while stdin is blocked:
    the stream ends with a clear error once MAX_WAITING_CONTROL wait; a 256 KiB SIGNAL: refused outright."""
    agent = plane.workers["w1"].pid
    before = rss_mib(agent)
    ws = _blocked_exec(plane, job)
    for _ in range(2000):
        ws.send(encode(1, SIGNAL, {"signal": "CONT"}))
    _, fields = frames_until_close(ws, 1)
    assert fields.get("status") == 429 and f"more than {MAX_WAITING_CONTROL} control frames" in fields["error"], fields
    ws.close()
    assert rss_mib(agent) - before < 32, f"the agent grew {rss_mib(agent) - before:.0f} MiB"

    ws = _blocked_exec(plane, job, 3)
    # One is enough: it would wait in the agent for ever (4,000 of them took 1 GiB), and the control plane
    # stops reading a socket it closed, so a client that goes on sending only blocks itself.
    ws.send(encode(3, SIGNAL, {"signal": "CONT", "pad": "x" * (256 * 1024 - 100)}))
    _, fields = frames_until_close(ws, 3)
    assert fields.get("status") == 400 and "over the 1024 a control frame may carry" in fields["error"], fields
    assert rss_mib(agent) - before < 32, f"the agent grew {rss_mib(agent) - before:.0f} MiB"
    assert plane.client().get_job(job).exec(["true"]).returncode == 0  # the agent's link is fine


def test_a_broken_frame_ends_each_stream_with_its_error_then_the_socket(plane, job):
    """Item 17: a frame that breaks the protocol is refused as docs/protocol.md says: each open stream of its
    connection gets a CLOSE with the error (`bad_frame`, 400), then the socket closes: 1008 where the front end
    can say it, granian's close of an accepted WebSocket carries no code (1005)."""
    for bad in ("text is not a frame", b"\x00\x00\x00\x01\x63", encode(1, WINDOW, 1)[:-1]):
        ws = raw_socket(plane, job, large=False)
        _exec(ws, 1, ["sleep", "600"])
        _quiet(ws, 1)
        ws.send(bad)
        _, fields = frames_until_close(ws, 1)
        assert fields.get("code") == "bad_frame" and fields.get("status") == 400, (bad, fields)
        assert fields["error"].startswith("the client broke the relay protocol: "), fields
        with pytest.raises(wsclient.ConnectionClosed) as closed:
            while True:
                ws.recv(timeout=30)
        assert closed.value.rcvd is not None and closed.value.rcvd.code in (1005, 1008), (bad, closed.value)
