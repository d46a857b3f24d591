"""One home, one control plane (issue 22 item 12): `server start`, `up`, `up --no-worker` and a local run
each hold an flock on HOME/control-plane.lock; a second one on that home exits at once naming the first's
pid and touches nothing (client.json, the state file); after a SIGKILL of the first, a new one starts."""
from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from gpulayer.testing import CLI, ControlPlaneProcess, clean_env, free_port, run_cli, stop_process, wait_for

pytestmark = pytest.mark.timeout(240)

SECOND_AS = {
    "server start": ["server", "start", "--port", "0"],
    "up": ["up", "--host", "127.0.0.1", "--port", "0", "--parallel", "1"],
    "up --no-worker": ["up", "--no-worker", "--host", "127.0.0.1", "--port", "0"],
}


def _up(home: Path, log: Path, *extra: str) -> subprocess.Popen:
    """`gpulayer up` on `home` (a free port), once it has written client.json."""
    proc = subprocess.Popen([*CLI, "up", "--host", "127.0.0.1", "--port", str(free_port()), "--parallel", "1", *extra],
                            env=clean_env(GPULAYER_HOME=str(home), PYTHONUNBUFFERED="1"),
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)
    wait_for(lambda: proc.poll() is not None or "gpulayer join" in log.read_text(), 60, "`up` to print its join line")
    assert proc.poll() is None, log.read_text()
    return proc


def _holder(home: Path) -> dict:
    """The lock file's record; {} in the instant the holder rewrites it."""
    try:
        return json.loads((home / "control-plane.lock").read_text())
    except ValueError:
        return {}


def _files(home: Path) -> dict:
    """What a refused second control plane must leave as it was: client.json, the tokens, the TLS files."""
    names = ["client.json", "local-tokens.json", "server-credentials.json",
             *(str(p.relative_to(home)) for p in sorted(home.glob("tls/*")))]
    return {name: (home / name).read_bytes() for name in names if (home / name).exists()}


def _refused(home: Path, argv: list[str], pid: int) -> str:
    second = run_cli(*argv, env={"GPULAYER_HOME": str(home)}, timeout=60)
    assert second.returncode != 0, second
    assert f"pid {pid}" in second.stderr and "Traceback" not in second.stderr, second.stderr
    return second.stderr


@pytest.mark.parametrize("second", list(SECOND_AS))
def test_a_second_control_plane_on_a_home_served_by_server_start_exits_at_once(tmp_path, second):
    with ControlPlaneProcess(tmp_path / "first") as first:
        home = first.home
        # The URL is noted once the server listens, which may be just after the health check answered.
        holder = wait_for(lambda: (h := _holder(home)).get("url") and h, 10, "the holder's URL in the lock file")
        assert holder["pid"] == first.pid and holder["url"] == first.url
        before = _files(home)
        message = _refused(home, SECOND_AS[second], first.pid)
        assert "is in use by gpulayer server start" in message and first.url in message
        assert _files(home) == before and not (home / "client.json").exists()
        assert first.healthy()


@pytest.mark.parametrize("first_args", [(), ("--no-worker",)], ids=["up", "up --no-worker"])
@pytest.mark.parametrize("second", list(SECOND_AS))
def test_a_second_control_plane_on_a_home_served_by_up_leaves_its_client_json(tmp_path, first_args, second):
    home = tmp_path / "home"
    first = _up(home, tmp_path / "up.log", *first_args)
    try:
        before = _files(home)
        _refused(home, SECOND_AS[second], first.pid)
        assert _files(home) == before  # client.json still names the first one's port
        ran = run_cli("submit", "--wait", "--", "echo", "still-first", env={"GPULAYER_HOME": str(home)}, timeout=60) \
            if not first_args else run_cli("worker", "list", env={"GPULAYER_HOME": str(home)}, timeout=60)
        assert ran.returncode == 0, ran.stderr
    finally:
        assert stop_process(first) == 0, (tmp_path / "up.log").read_text()


def test_a_local_run_on_a_home_that_up_serves_says_where_to_send_the_job(tmp_path):
    home = tmp_path / "home"
    first = _up(home, tmp_path / "up.log")
    try:
        before = _files(home)
        message = _refused(home, ["submit", "--target", "local", "--", "echo", "here"], first.pid)
        assert "serves" in message and "without --target local" in message
        assert _files(home) == before
        listed = run_cli("job", "list", "--json", env={"GPULAYER_HOME": str(home)}, timeout=60)
        assert json.loads(listed.stdout) == [], listed.stderr
    finally:
        assert stop_process(first) == 0, (tmp_path / "up.log").read_text()


def test_a_second_local_run_waits_for_nothing_and_job_commands_ask_the_running_one(tmp_path):
    """Two `--target local` runs on one home: the second is refused (naming the first); `job list` and
    `job status` go to the running one's control plane (its URL is in the lock file)."""
    home = tmp_path / "home"
    first = subprocess.Popen([*CLI, "submit", "--", "sh", "-c", "echo started; sleep 60"],
                             env=clean_env(GPULAYER_HOME=str(home)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        job_id = first.stdout.readline().strip()
        assert first.stdout.readline() == "started\n"
        message = _refused(home, ["submit", "--", "echo", "second"], first.pid)
        assert "another `--target local` run" in message
        status = run_cli("job", "status", job_id, "--json", env={"GPULAYER_HOME": str(home)}, timeout=60)
        assert status.returncode == 0 and json.loads(status.stdout)["state"] == "running", status.stderr
    finally:
        first.send_signal(signal.SIGINT)
        assert first.wait(60) == 130, first.stderr.read()


@pytest.mark.parametrize("first_is", ["server start", "up"])
def test_after_a_sigkill_of_the_first_a_new_control_plane_starts_on_the_home(tmp_path, first_is):
    if first_is == "server start":
        plane = ControlPlaneProcess(tmp_path / "first").start()
        home, pid = plane.home, plane.pid
        plane.kill()
    else:
        home = tmp_path / "home"
        up = _up(home, tmp_path / "up.log")
        home, pid = home, up.pid
        os.kill(pid, signal.SIGKILL)
        up.wait(30)
    assert _holder(home)["pid"] == pid  # the file stays; the kernel dropped the lock
    log = tmp_path / "again.log"
    again = subprocess.Popen([*CLI, "up", "--no-worker", "--host", "127.0.0.1", "--port", str(free_port())],
                             env=clean_env(GPULAYER_HOME=str(home), PYTHONUNBUFFERED="1"), stdout=open(log, "w"),
                             stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: again.poll() is not None or "gpulayer join" in log.read_text(), 60, "the new `up`")
        assert again.poll() is None, log.read_text()
        assert _holder(home)["pid"] == again.pid
    finally:
        assert stop_process(again) == 0, log.read_text()
    assert (home / "control-plane.lock").read_text() == ""  # a clean stop leaves no pid to read
