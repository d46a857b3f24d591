"""The agent, then the control plane, killed (SIGKILL) while exec, shell, port-forward and SSH streams run
(issue 26 section 4): each client ends on its own with a clear error (a non-zero exit and an `Error:` line or
ssh's own, never a traceback) within a bounded wait, port-forward keeps listening and serves again once the
relay is back, the job's state is untouched (still running: its lease outlives the agent's death, and the
control plane's restart), and every stream's `sessions` row is closed with the reason it ended.

One cluster: a control plane on granian with TLS, one real worker, a job serving an echo; the four clients
are the real CLIs (`gpulayer exec`, `gpulayer shell` on a pseudo-terminal driven by the test,
`gpulayer port-forward`, OpenSSH's `ssh` with the printed config).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from gpulayer.testing import CLI, ControlPlaneProcess, clean_env, wait_for
from terminal import Terminal

pytest.importorskip("granian")
pytest.importorskip("websockets")
pytestmark = pytest.mark.timeout(300)

HAS_SSH = shutil.which("ssh") is not None and __import__("importlib").util.find_spec("asyncssh") is not None
ECHO = r"""
import socket, socketserver, sys

class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while chunk := self.request.recv(65536):
            self.request.sendall(chunk)

class Server(socketserver.ThreadingTCPServer):
    daemon_threads = allow_reuse_address = True

server = Server(("127.0.0.1", int(sys.argv[1])), Echo)
print("listening", flush=True)
server.serve_forever()
"""
#: Seconds any client may take to notice its stream ended (bounded: nothing hangs).
ENDS_WITHIN = 60
#: The lease outlives the agent's death long enough for the check that nothing of the job changed (the clients
#: end within a second or two of it), and no longer: the job's next attempt waits for it to run out.
LEASE_TTL = 20


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    # lease_ttl LEASE_TTL: the agent's death leaves the job running as far as the control plane knows, for the check.
    plane = ControlPlaneProcess(tmp_path_factory.mktemp("kills"), tls=True, heartbeat_interval=0.5, lease_ttl=LEASE_TTL)
    try:
        plane.start(timeout=120)  # a loaded machine takes more than the default 30 s to answer /v1/health
        plane.start_worker("victim", timeout=120)
        yield plane
    finally:
        plane.close()


@pytest.fixture(scope="module")
def job(plane):
    port = _free_port()
    job_id = plane.submit({"command": [sys.executable, "-c", ECHO, str(port)], "name": "kills", "retry": {"max_attempts": 3}})
    _listening(plane, job_id, 1)
    return job_id, port


@pytest.fixture(scope="module")
def config(plane, tmp_path_factory):
    rc, out, err = plane.cli("ssh-config")
    assert rc == 0, err
    path = tmp_path_factory.mktemp("ssh") / "config"
    path.write_text(out + "    BatchMode yes\n    ConnectTimeout 60\n")
    return path


def _listening(plane, job_id: int, times: int) -> None:
    wait_for(lambda: sum("listening" in line["text"] for line in plane.get_json(f"/v1/jobs/{job_id}/logs")["lines"]) >= times, 120, "the echo")


class Clients:
    """The four clients, each with a stream open and busy: exec, shell, port-forward (a held connection), ssh."""

    def __init__(self, plane, job_id: int, port: int, config):
        env = clean_env(**plane.cli_env())
        self.exec = subprocess.Popen(
            [*CLI, "exec", str(job_id), "--", "sh", "-c", "echo ready; sleep 600"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.shell = Terminal([*CLI, "shell", str(job_id)], clean_env(**plane.cli_env(TERM="xterm")), plane.root)
        self.forward = subprocess.Popen(
            [*CLI, "port-forward", str(job_id), f":{port}"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.ssh = (
            subprocess.Popen(
                ["ssh", "-F", str(config), f"gpulayer-{job_id}", "echo ready; sleep 600"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=plane.root,
            )
            if HAS_SSH
            else None
        )
        assert self.exec.stdout is not None and self.exec.stdout.readline() == "ready\n"
        self.shell.type("echo up-$((20+22))\n")
        self.shell.read_until("up-42")
        assert self.forward.stdout is not None
        line = self.forward.stdout.readline()
        assert line.startswith("Forwarding from 127.0.0.1:"), line
        self.local = int(line.split(":")[1].split()[0])
        self.held = socket.create_connection(("127.0.0.1", self.local), 30)
        self.held.sendall(b"x")
        assert self.held.recv(1) == b"x"
        if self.ssh is not None:
            assert self.ssh.stdout is not None and self.ssh.stdout.readline() == "ready\n", self.ssh.stderr

    def all_end_with_clear_errors(self) -> None:
        """Each stream ended on its own within ENDS_WITHIN seconds: non-zero exits and clear words, no traceback."""
        _, err = self.exec.communicate(timeout=ENDS_WITHIN)
        assert self.exec.returncode == 255 and "Error:" in err and "Traceback" not in err, err
        assert self.shell.exit_code(timeout=ENDS_WITHIN) == 255, self.shell.output
        assert "Error:" in self.shell.output and "Traceback" not in self.shell.output, self.shell.output
        self.held.settimeout(ENDS_WITHIN)
        assert self.held.recv(10) == b"", "the forwarded connection ends"
        self.held.close()
        assert self.forward.poll() is None, "port-forward keeps listening"
        if self.ssh is not None:
            _, err = self.ssh.communicate(timeout=ENDS_WITHIN)
            assert self.ssh.returncode == 255 and "Traceback" not in err, err


def _closed_rows(plane, since: int) -> list[tuple]:
    return plane.sql(f"SELECT kind, end_reason FROM sessions WHERE id > {since} ORDER BY id")


def test_agent_killed_mid_stream(plane, job, config):
    job_id, port = job
    clients = Clients(plane, job_id, port, config)
    attempt = plane.job(job_id)["attempt"]
    plane.workers["victim"].kill()  # the agent dies (its task with it)
    killed = time.monotonic()
    clients.all_end_with_clear_errors()
    info = plane.job(job_id)  # its lease has not run out: nothing of the job changed
    assert info["state"] == "running" and info["attempt"] == attempt, (info, time.monotonic() - killed)
    kinds = {"exec", "shell", "tcp", *(["ssh"] if HAS_SSH else [])}
    wait_for(lambda: {kind for kind, reason in _closed_rows(plane, 0) if reason} >= kinds, 30, "the sessions rows closed")
    for kind, reason in _closed_rows(plane, 0):
        assert reason and "agent" in reason, (kind, reason)
    # The agent comes back; the job's next attempt runs, and the same port-forward serves it.
    plane.start_worker("victim", timeout=120)
    _listening(plane, job_id, 2)
    assert plane.job(job_id)["state"] == "running"
    with socket.create_connection(("127.0.0.1", clients.local), 30) as conn:
        conn.sendall(b"again")
        assert conn.recv(5) == b"again"
    clients.forward.send_signal(signal.SIGINT)
    _, err = clients.forward.communicate(timeout=30)
    assert clients.forward.returncode == 0 and "Error: connection 1:" in err and "Traceback" not in err, err


def test_control_plane_killed_mid_stream(plane, job, config):
    job_id, port = job
    before = max([row[0] for row in plane.sql("SELECT id FROM sessions")] or [0])
    clients = Clients(plane, job_id, port, config)
    assert plane.pid is not None
    os.kill(plane.pid, signal.SIGKILL)
    clients.all_end_with_clear_errors()
    plane.restart(timeout=120)
    assert plane.job(job_id)["state"] == "running"  # the task ran on, and its agent reports it to the new one
    rows = _closed_rows(plane, before)
    assert len(rows) == 4 if HAS_SSH else 3, rows
    assert {reason for _, reason in rows} == {"the control plane stopped"}, rows
    done = plane.client().get_job(job_id).exec(["echo", "again"])  # the agent connects again when asked
    assert done.stdout == b"again\n", done.stderr
    # The port-forward's listener outlived it: a new connection opens a new relay once the control plane is back.
    with socket.create_connection(("127.0.0.1", clients.local), 30) as conn:
        conn.sendall(b"back")
        assert conn.recv(4) == b"back"
    clients.forward.send_signal(signal.SIGINT)
    _, err = clients.forward.communicate(timeout=30)
    assert clients.forward.returncode == 0 and "Traceback" not in err, err
