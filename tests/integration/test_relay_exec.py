"""`gpulayer exec` through the relay, end to end (issue 26 part 1, docs/access.md).

A real control plane on granian with TLS, real agents (bubblewrap sandboxes where bwrap works), the module's
worker behind a NAT (tests/netns.py's NatNamespace: it dials out, nothing reaches it), real child processes:
a listener in the task no direct connect reaches, exit codes, stdin, a 50 MB stdout under flow control with
the control plane's memory flat, the task's environment, policy (teams' `manage`), caps, `--no-exec`, an
agent from before the relay, sessions rows and events, heartbeats answered during a big stream, and
malformed frames. The agent and the control plane killed mid-stream: tests/integration/test_relay_kills.py,
for exec, shell, port-forward and SSH at once.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time

import pytest
import requests
from gpulayer.relaylink.wsclient import ConnectionClosed

from gpulayer.client.api import connect
from gpulayer.client.errors import ApiError, ConnectionFailed
from gpulayer.protocol.control import Close
from gpulayer.client.relay import open_exec, run_exec
from gpulayer.protocol import PROTOCOL, PROTOCOL_HEADER
from gpulayer.protocol.relay import DATA
from gpulayer.relaylink.streams import connect as ws_connect
from gpulayer.testing import CLI, ControlPlaneProcess, clean_env, wait_for

from netns import nat_namespace, plane_behind_nat

pytest.importorskip("granian")
pytest.importorskip("websockets")
pytestmark = [pytest.mark.timeout(180), pytest.mark.netns]

BIG = 50 * 1000 * 1000


@pytest.fixture(scope="module")
def nat():
    yield from nat_namespace("ex")


@pytest.fixture(scope="module")
def plane(nat, tmp_path_factory):
    with plane_behind_nat(nat, tmp_path_factory.mktemp("relay"), "w1", lease_ttl=5, args=["--relay-max-streams-per-job", "3"]) as plane:
        yield plane


@pytest.fixture(scope="module")
def job(plane):
    """A job that runs for the module: it writes where it runs, as whom, and its job id, then sleeps."""
    job_id = plane.submit({"command": ["sh", "-c", "echo place=$(pwd) user=$(id -un) job=$GPULAYER_JOB_ID; exec sleep 600"], "name": "target"})
    wait_for(lambda: plane.job(job_id)["state"] == "running", 30, "the target job to run")
    wait_for(lambda: any("place=" in line["text"] for line in plane.get_json(f"/v1/jobs/{job_id}/logs")["lines"]), 30, "the target job's first line")
    return job_id


def _client(plane, token=None):
    return connect(url=plane.url, token=token or plane.client_token, ca_file=plane.ca_file and str(plane.ca_file))


def _exec_ready(plane, job_id: int, script: str) -> subprocess.Popen:
    """`gpulayer exec JOB -- sh -c SCRIPT` as a child, once SCRIPT printed its first line (`ready`)."""
    proc = subprocess.Popen(
        [*CLI, "exec", str(job_id), "--", "sh", "-c", script],
        env=clean_env(**plane.cli_env()),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    first = proc.stdout.readline().strip()
    if first != "ready":
        proc.kill()
        _, err = proc.communicate(timeout=10)
        raise AssertionError(f"exec printed {first!r}, not 'ready'; its stderr: {err!r}; the logs: {plane.logs()}")
    return proc


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("VmRSS:"))


def test_exit_codes_streams_and_the_tasks_place(plane, job):
    client = _client(plane)
    done = client.get_job(job).exec(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (done.returncode, done.stdout, done.stderr) == (3, b"out\n", b"err\n")
    assert client.get_job(job).exec(["true"]).returncode == 0
    assert client.get_job(job).exec(["sh", "-c", "kill -9 $$"]).returncode == 137
    seen = client.get_job(job).exec(["sh", "-c", "echo place=$(pwd) user=$(id -un) job=$GPULAYER_JOB_ID"])
    first = next(line["text"] for line in plane.get_json(f"/v1/jobs/{job}/logs")["lines"] if "place=" in line["text"])
    assert seen.stdout.decode().strip() == first.strip()  # the task's own cwd, user and environment
    missing = client.get_job(job).exec(["no-such-command-xyz"])
    assert missing.returncode == 127 and b"no-such-command-xyz" in missing.stderr


def test_behind_the_nat_exec_reaches_what_a_direct_connect_cannot(plane, nat, job):
    """The task listens on 0.0.0.0 (a command run through exec): nothing reaches it from outside, exec does."""
    client = _client(plane)
    listen = "import socket, time; s = socket.create_server(('0.0.0.0', 18811)); print('ready', flush=True); time.sleep(120)"
    link, stream = open_exec(client, job, ["python3", "-c", listen])
    try:
        heard = b""
        while b"ready\n" not in heard:  # the line may come in more than one frame
            frame = stream.recv(60)
            assert frame is not None and frame.type == DATA, (frame, heard)
            heard += frame.data
        assert not nat.reachable(18811), "the NAT namespace let a connection in"
        probe = "import socket; socket.create_connection(('127.0.0.1', 18811), 10).close(); print('inside')"
        done = client.get_job(job).exec(["python3", "-c", probe])
        assert (done.returncode, done.stdout) == (0, b"inside\n"), done.stderr
    finally:
        link.close()


def test_cli_pipes_stdin_and_exits_with_the_commands_code(plane, job):
    rc, out, err = plane.cli("exec", str(job), "--", "cat", input="hi\n")
    assert (rc, out, err) == (0, "hi\n", ""), err
    rc, out, err = plane.cli("exec", str(job), "--", "sh", "-c", "wc -c; exit 7", input="x" * 100_000)
    assert rc == 7 and out.strip() == "100000", (out, err)
    rc, _, err = plane.cli("exec", str(job), "--index", "1", "--rank", "1", "--", "true")
    assert rc == 2 and "--rank" in err
    rc, _, err = plane.cli("exec", str(job))
    assert rc == 2 and "CMD" in err


def test_ctrl_c_signals_the_remote_command(plane, job):
    proc = _exec_ready(plane, job, "trap 'echo got-int; exit 42' INT; echo ready; while :; do sleep 0.1; done")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 42 and "got-int" in out, (out, err)


def test_50_mb_through_flow_control_with_the_servers_memory_flat(plane, job):
    client = _client(plane)
    pid = plane.pid
    assert pid is not None
    before = _rss_kb(pid)
    peak = [before]
    received = [0]
    beats: list[int] = []
    stop = threading.Event()

    def watch() -> None:  # the server's RSS, and a health request answered, all along the stream
        while not stop.is_set():
            peak[0] = max(peak[0], _rss_kb(pid))
            beats.append(requests.get(plane.url + "/v1/health", verify=plane.verify, timeout=30).status_code)
            stop.wait(0.1)

    def slow_reader(chunk: bytes) -> None:
        received[0] += len(chunk)
        if received[0] < 4 * 1024 * 1024:
            time.sleep(0.001)  # a slow start: the window, not the server, holds the rest

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        code = run_exec(client, job, ["head", "-c", str(BIG), "/dev/zero"], on_stdout=slow_reader, on_stderr=lambda b: None)
    finally:
        stop.set()
        watcher.join()
    assert code == 0 and received[0] == BIG
    assert beats and set(beats) == {200}
    grown_mb = (peak[0] - before) / 1024
    assert grown_mb < 24, f"the control plane grew {grown_mb:.1f} MiB while 50 MB went through"
    # The exit reaches the client before the session's row is closed (rows are written off the byte path).
    wait_for(lambda: plane.sql("SELECT 1 FROM sessions WHERE detail LIKE '%/dev/zero%' AND closed_at IS NOT NULL"),
             30, "the session's row closed")
    rows = plane.sql("SELECT bytes_out, exit_code FROM sessions WHERE detail LIKE '%/dev/zero%'")
    assert rows == [(BIG, 0)]


def test_heartbeats_are_answered_during_a_big_stream(plane, job):
    worker = requests.post(
        plane.url + "/v1/workers/register",
        verify=plane.verify,
        timeout=10,
        json={"name": "beater", "labels": {}, "resources": {"cpus": 1, "gpus": 0, "memory_mb": 64}, "version": "test", "slots": 1},
        headers={**plane.headers(plane.join_token), PROTOCOL_HEADER: str(PROTOCOL)},
    ).json()
    headers = {"Authorization": f"Bearer {worker['session_token']}", PROTOCOL_HEADER: str(PROTOCOL)}
    answers: list[int] = []
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            answers.append(
                requests.post(plane.url + "/v1/worker/heartbeat", json={"tasks": []}, headers=headers, verify=plane.verify, timeout=30).status_code
            )
            stop.wait(0.05)

    beater = threading.Thread(target=beat)
    beater.start()
    try:
        code = run_exec(_client(plane), job, ["head", "-c", str(BIG // 2), "/dev/zero"], on_stdout=lambda b: None, on_stderr=lambda b: None)
    finally:
        stop.set()
        beater.join()
    assert code == 0
    assert len(answers) >= 2 and set(answers) == {200}
    requests.post(plane.url + "/v1/worker/deregister", json={}, headers=headers, verify=plane.verify, timeout=10)


def test_sessions_rows_and_events(plane, job):
    client = _client(plane)
    assert client.get_job(job).exec(["sh", "-c", "cat; exit 5"], input=b"abc").stdout == b"abc"
    wait_for(lambda: plane.sql("SELECT 1 FROM sessions WHERE detail LIKE '%exit 5%' AND closed_at IS NOT NULL"),
             30, "the session's row closed")
    rows = plane.sql(
        "SELECT user, kind, detail, bytes_in, bytes_out, exit_code, end_reason, closed_at IS NOT NULL FROM sessions WHERE detail LIKE '%exit 5%'"
    )
    assert len(rows) == 1
    user, kind, detail, bytes_in, bytes_out, code, reason, closed = rows[0]
    assert (user, kind, json.loads(detail)["argv"][0], bytes_in, bytes_out, code, closed) == ("user:admin", "exec", "sh", 3, 3, 5, 1), rows
    assert reason
    kinds = [e["kind"] for e in plane.events(job)]
    assert "session_opened" in kinds and "session_closed" in kinds
    closed_event = [e for e in plane.events(job) if e["kind"] == "session_closed"][-1]
    assert closed_event["data"]["exit_code"] is not None
    rc, out, err = plane.cli("sql", "--state", str(plane.state), "select kind, exit_code from sessions where detail like '%exit 5%'")
    assert rc == 0 and "exec" in out, err


def test_who_may_exec_follows_the_teams_rules(plane, job):
    assert plane.cli("project", "add", "relayp").returncode == 0
    tokens = {}
    for name, role in (("owner1", "member"), ("boss1", "manager"), ("peer1", "member")):
        rc, out, err = plane.cli("user", "add", name, "--project", f"relayp:{role}", "--json")
        assert rc == 0, err
        tokens[name] = json.loads(out)["token"]
    rc, out, err = plane.cli("user", "add", "stranger1", "--json")
    assert rc == 0, err
    tokens["stranger1"] = json.loads(out)["token"]
    rc, out, err = plane.cli("submit", "--project", "relayp", "--", "sleep", "600", GPULAYER_TOKEN=tokens["owner1"])
    assert rc == 0, err
    owned = int(out.split()[0])
    wait_for(lambda: plane.job(owned)["tasks"][0]["state"] == "running", 30, "the owned job to run")
    for who in ("owner1", "boss1"):
        assert _client(plane, tokens[who]).get_job(owned).exec(["id", "-un"]).returncode == 0, who
    assert _client(plane).get_job(owned).exec(["true"]).returncode == 0  # admin
    with pytest.raises(ApiError) as refused:
        run_exec(_client(plane, tokens["peer1"]), owned, ["true"], on_stdout=print, on_stderr=print)
    assert refused.value.status == 403 and "owner" in refused.value.message
    with pytest.raises(ApiError) as hidden:
        run_exec(_client(plane, tokens["stranger1"]), owned, ["true"], on_stdout=print, on_stderr=print)
    assert hidden.value.status == 404
    rc, _, err = plane.cli("exec", str(owned), "--", "true", GPULAYER_TOKEN=tokens["peer1"])
    assert rc == 255 and "owner" in err
    plane.cli("job", "cancel", str(owned))


def test_caps_and_bad_requests(plane, job):
    client = _client(plane)
    held = [open_exec(client, job, ["sleep", "60"]) for _ in range(3)]  # the job's cap: 3 open at once
    try:
        for _link, stream in held:
            assert stream.recv(timeout=0.5) is None  # running: nothing came back yet
        with pytest.raises(ApiError) as capped:
            run_exec(client, job, ["true"], on_stdout=print, on_stderr=print)
        assert capped.value.status == 429 and capped.value.code == "too_many_streams"
    finally:
        for link, stream in held:
            stream.close(Close(reason="test done"))
            link.close()
    wait_for(lambda: client.get_job(job).exec(["true"]).returncode == 0, 30, "the cap to free up")
    with pytest.raises(ApiError) as nothing:
        run_exec(client, 999999, ["true"], on_stdout=print, on_stderr=print)
    assert nothing.value.status == 404
    with pytest.raises(ApiError) as empty:
        run_exec(client, job, [], on_stdout=print, on_stderr=print)
    assert empty.value.status == 400 and empty.value.code == "invalid_field"
    plain = requests.get(plane.url + f"/v1/jobs/{job}/relay", headers=plane.headers(), verify=plane.verify, timeout=10)
    assert plain.status_code == 400 and plain.json()["error"]["code"] == "websocket_required"
    with pytest.raises(ApiError) as unauthorized:
        run_exec(connect(url=plane.url, token="glc_nope", ca_file=str(plane.ca_file)), job, ["true"], on_stdout=print, on_stderr=print)
    assert unauthorized.value.status == 401


def test_finished_job_is_refused_with_a_clear_conflict(plane):
    done = plane.submit({"command": ["true"], "name": "quick"})
    plane.wait_job(done)
    with pytest.raises(ApiError) as refused:
        run_exec(_client(plane), done, ["true"], on_stdout=print, on_stderr=print)
    assert refused.value.status == 409 and "running" in refused.value.message


def test_malformed_frames_close_the_link_not_the_server(plane, job):
    ws = ws_connect(f"{plane.url}/v1/jobs/{job}/relay", plane.client_token, str(plane.ca_file))
    ws.send("text is not a frame")
    with pytest.raises(ConnectionClosed):
        ws.recv(timeout=10)
    ws = ws_connect(f"{plane.url}/v1/jobs/{job}/relay", plane.client_token, str(plane.ca_file))
    ws.send(b"\x00\x00\x00\x01\x63")  # type 99
    with pytest.raises(ConnectionClosed):
        ws.recv(timeout=10)
    assert requests.get(plane.url + "/v1/health", verify=plane.verify, timeout=10).status_code == 200
    assert _client(plane).get_job(job).exec(["true"]).returncode == 0


def test_no_exec_workers_and_agents_without_the_relay_are_refused_at_once(plane):
    for name, options, words in (
        ("noexec", {"args": ["--no-exec"]}, "--no-exec"),
        ("oldagent", {"env": {"GPULAYER_AGENT_RELAY": "off"}}, "does not support the relay"),
    ):
        plane.start_worker(name, labels={"only": name}, **options)
        job_id = plane.submit({"command": ["sleep", "600"], "labels": {"only": name}})
        wait_for(lambda job_id=job_id: plane.job(job_id)["tasks"][0]["state"] == "running", 30, f"the job on {name} to run")
        with pytest.raises(ApiError) as refused:
            run_exec(_client(plane), job_id, ["true"], on_stdout=print, on_stderr=print)
        assert refused.value.status == 409 and refused.value.code == "relay_unavailable"
        assert words in refused.value.message and name in refused.value.message
        plane.cli("job", "cancel", str(job_id))


def test_cheroot_serves_no_relay(tmp_path):
    with ControlPlaneProcess(tmp_path, args=["--http", "cheroot"]) as plane:
        answer = requests.get(plane.url + "/v1/jobs/1/relay", headers=plane.headers(), timeout=10)
        assert answer.status_code == 501 and answer.json()["error"]["code"] == "relay_unavailable"
        with pytest.raises((ApiError, ConnectionFailed)):
            run_exec(_client(plane), 1, ["true"], on_stdout=print, on_stderr=print)
