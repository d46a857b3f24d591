"""`gpulayer shell` through the relay, end to end (issue 26 part 2, docs/access.md "Shell").

The CLI runs in a real pseudo-terminal driven by the test (tests/terminal.py), against a real control plane
on granian with TLS and real agents (the module's behind a NAT: tests/netns.py's NatNamespace, which lets
nothing in): the task's shell (in its bubblewrap sandbox, entered with nsenter, where
the worker has one) answers typed commands, follows resizes, takes ^C and ^Z from the remote terminal's line
discipline and keeps job control, exits with its own status, and the local terminal's settings come back as
they were. Refusals: stdin not a terminal, another user's job, a --no-exec worker.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess

import pytest

from gpulayer.client.errors import ApiError
from gpulayer.client.relay import closed_error, open_stream
from gpulayer.protocol.relay import CLOSE
from gpulayer.testing import CLI, ControlPlaneProcess, clean_env, wait_for
from netns import nat_namespace, plane_behind_nat
from terminal import Terminal

pytest.importorskip("granian")
pytest.importorskip("websockets")
pytestmark = [pytest.mark.timeout(240), pytest.mark.netns]


@pytest.fixture(scope="module")
def nat():
    yield from nat_namespace("sh")


@pytest.fixture(scope="module")
def plane(nat, tmp_path_factory):
    with plane_behind_nat(nat, tmp_path_factory.mktemp("shell"), "w1", lease_ttl=10) as plane:
        yield plane


@pytest.fixture(scope="module")
def job(plane):
    job_id = plane.submit({"command": ["sh", "-c", "echo place=$(pwd) user=$(id -un); exec sleep 900"], "name": "target"})
    wait_for(lambda: any("place=" in line["text"] for line in plane.get_json(f"/v1/jobs/{job_id}/logs")["lines"]), 60, "the target job's first line")
    return job_id


def _shell(plane, job_id, *args, **env):
    return Terminal([*CLI, "shell", str(job_id), *args], clean_env(**plane.cli_env(**{"TERM": "xterm-256color", **env})), plane.root)


def test_typed_commands_resizes_ctrl_c_ctrl_z_and_the_exit_status(plane, job):
    terminal = _shell(plane, job)
    before = terminal.settings()
    terminal.type("echo ok-$((6*7))\n")
    terminal.read_until("ok-42")
    terminal.type("stty size; echo sized-$((1+1))\n")
    assert "24 80" in terminal.read_until("sized-2")  # the window at the start (this terminal says 0 x 0: the default)
    terminal.resize(33, 101)
    # the resize goes up from the client's SIGWINCH handler, the keys from its stdin reader: a command typed at
    # once may reach the remote shell first, as in any ssh session. Ask until the new size shows (a few tries).
    for attempt in range(4, 40):
        terminal.type(f"stty size; echo sized-$(({attempt}+0))\n")
        if "33 101" in terminal.read_until(f"sized-{attempt}").rsplit(f"sized-$(({attempt}+0))", 1)[-1]:
            break
    else:
        raise AssertionError(f"the remote terminal never saw the resize:\n{terminal.output}")
    # ^C reaches the remote sleep; the shell survives it. The marker is printed by the job itself, so ^C is sent
    # once the job holds the terminal's foreground (before that, it would go to the shell and the sleep run on)
    terminal.type("sh -c 'echo zz-$((5+5)); exec sleep 100'\n")
    terminal.read_until("zz-10")
    terminal.interrupt()
    terminal.type("echo status-$?-$((3+4))\n")
    terminal.read_until("status-130-7")
    terminal.type("sh -c 'echo yy-$((5+6)); exec sleep 200'\n")  # ^Z stops it: the shell has job control on its terminal
    terminal.read_until("yy-11")
    terminal.type("\x1a")
    terminal.type("jobs; echo jobs-$((6+6))\n")
    assert "Stopped" in terminal.read_until("jobs-12")
    terminal.type("kill -9 %1; wait %1; echo killed-$((6+7))\n")  # reaped: exit meets no "There are stopped jobs"
    terminal.read_until("killed-13")
    terminal.type("exit 7\n")
    assert terminal.exit_code() == 7, terminal.output
    assert terminal.left == before  # raw mode undone
    wait_for(lambda: plane.sql("SELECT 1 FROM sessions WHERE kind = 'shell' AND exit_code = 7 AND closed_at IS NOT NULL"),
             30, "the session's row closed")
    rows = plane.sql("SELECT kind, detail, exit_code, bytes_in > 0, bytes_out > 0 FROM sessions WHERE kind = 'shell' AND exit_code = 7")
    assert len(rows) == 1, rows
    detail = json.loads(rows[0][1])
    assert (detail["rows"], detail["cols"], detail["term"]) == (24, 80, "xterm-256color") and rows[0][3:] == (1, 1)


def test_a_command_on_the_terminal_in_the_tasks_place(plane, job):
    first = next(line["text"] for line in plane.get_json(f"/v1/jobs/{job}/logs")["lines"] if "place=" in line["text"])
    terminal = _shell(
        plane, job, "--", "sh", "-c", "echo place=$(pwd) user=$(id -un); echo term=$TERM; echo tty=$(tty); exit 3", TERM="tmux-256color"
    )
    assert terminal.exit_code() == 3, terminal.output
    assert first.strip() in terminal.output
    assert "term=tmux-256color" in terminal.output
    assert "tty=/dev/pts/" in terminal.output  # the sandbox's own /dev/pts, where it has one: ttyname() works


@pytest.mark.skipif(shutil.which("tmux") is None, reason="no tmux")
def test_under_tmux(plane, job, tmp_path):
    """In a tmux pane: its TERM and its size reach the remote terminal, and the status comes back."""
    socket = str(tmp_path / "tmux")
    shell = shlex.join([*CLI, "shell", str(job), "--", "sh", "-c", "echo size=$(stty size) term=$TERM; exit 4"])
    env = clean_env(**plane.cli_env())
    env.pop("TMUX", None)
    tmux = ["tmux", "-S", socket, "-f", "/dev/null"]
    subprocess.run([*tmux, "new-session", "-d", "-x", "100", "-y", "30", f"{shell}; echo exit=$?; sleep 600"], env=env, check=True, timeout=30)
    try:
        pane = lambda: subprocess.run([*tmux, "capture-pane", "-p", "-J"], env=env, capture_output=True, text=True, timeout=30).stdout  # noqa: E731
        wait_for(lambda: "exit=" in pane(), 90, "the shell in tmux to end")
        text = pane()
        term = subprocess.run([*tmux, "show-options", "-gv", "default-terminal"], env=env, capture_output=True, text=True, timeout=30).stdout.strip()
        rows = subprocess.run([*tmux, "display-message", "-p", "#{pane_height} #{pane_width}"], env=env, capture_output=True, text=True, timeout=30)
        assert f"size={rows.stdout.strip()} term={term}" in text and "exit=4" in text, text
    finally:
        subprocess.run([*tmux, "kill-server"], env=env, timeout=30)


def test_refusals(plane, job):
    rc, _, err = plane.cli("shell", str(job), input="echo hi\n")
    assert rc == 2 and "terminal" in err and "gpulayer exec" in err
    rc, _, err = plane.cli("shell", str(job), "--index", "0", "--rank", "0")
    assert rc == 2 and "--rank" in err
    client = plane.client()
    for fields, name in (({"rows": 0, "cols": 80}, "rows"), ({"rows": 24}, "cols"), ({"rows": 24, "cols": 80, "term": "x;rm -rf"}, "term")):
        link, stream = open_stream(client, job, {"kind": "shell", **fields})
        try:
            frame = stream.recv(timeout=60)
        finally:
            link.close()
        assert frame is not None and frame.type == CLOSE, frame
        refused = closed_error(frame.fields)
        assert isinstance(refused, ApiError) and (refused.status, refused.code) == (400, "invalid_field") and name in refused.message, frame.fields
    rc, out, err = plane.cli("user", "add", "shellpeer", "--json")
    assert rc == 0, err
    terminal = _shell(plane, job, GPULAYER_TOKEN=json.loads(out)["token"])
    before = terminal.settings()
    assert terminal.exit_code() == 255
    assert "Error:" in terminal.output and f"job {job}" in terminal.output, terminal.output
    assert terminal.left == before
    plane.start_worker("noexec", labels={"only": "noexec"}, args=["--no-exec"])
    fenced = plane.submit({"command": ["sleep", "600"], "labels": {"only": "noexec"}})
    wait_for(lambda: plane.job(fenced)["tasks"][0]["state"] == "running", 60, "the job on the --no-exec worker to run")
    terminal = _shell(plane, fenced)
    assert terminal.exit_code() == 255
    assert "--no-exec" in terminal.output and "shell" in terminal.output, terminal.output
    plane.cli("job", "cancel", str(fenced))


def test_an_unsandboxed_worker(tmp_path):
    with ControlPlaneProcess(tmp_path, tls=True, heartbeat_interval=0.5, lease_ttl=10) as plane:
        plane.start_worker("bare", args=["--sandbox", "none"])
        job_id = plane.submit({"command": ["sleep", "600"]})
        wait_for(lambda: plane.job(job_id)["tasks"][0]["state"] == "running", 60, "the job to run")
        terminal = _shell(plane, job_id)
        terminal.type("sh -c 'echo ok-$((6*7)); exec sleep 100'\n")  # the job prints once it holds the foreground
        terminal.read_until("ok-42")
        terminal.interrupt()
        terminal.type("echo status-$?\n")
        terminal.read_until("status-130")
        terminal.type("exit 5\n")
        assert terminal.exit_code() == 5, terminal.output
