"""A built wheel, installed into a fresh virtual environment (not editable), runs a job end to end.

Every other test imports gpulayer from the checkout; this one proves that what
`pip install gpulayer-*.whl` puts in site-packages is complete: the schema, the
named queries, the explorer's templates. It builds the wheel from a copy of the
checkout's files (so the checkout gets no build/ folder), installs it with
`--no-deps` into a venv that sees this interpreter's packages (no network), and
runs the venv's own `gpulayer` script from a folder outside the checkout.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpulayer.testing import free_port, stop_process, wait_for
from wheels import ROOT, build_wheel, venv_env as _env


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A venv with the wheel of this checkout installed (not editable)."""
    work = tmp_path_factory.mktemp("wheel")
    wheel, venv = build_wheel(work), work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--disable-pip-version-check", str(wheel)], check=True, capture_output=True, timeout=300)
    return venv


def test_the_installed_wheel_is_what_runs(venv, tmp_path):
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import gpulayer, agent, explorer; "
                            "print(gpulayer.__file__); print(agent.__file__); print(explorer.__file__)"],
                           cwd=tmp_path, env=_env(venv), capture_output=True, text=True, check=True)
    for path in where.stdout.split():
        assert str(venv) in path, f"imported from outside the venv: {path}"
    assert str(ROOT) not in where.stdout


def test_wheel_serves_a_job_to_succeeded(venv, tmp_path):
    gpulayer = str(venv / "bin" / "gpulayer")
    home, port = tmp_path / "home", free_port()
    env = _env(venv)
    init = subprocess.run([gpulayer, "server", "init", "--home", str(home), "--json"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert init.returncode == 0, init.stderr
    tokens = json.loads(init.stdout)
    url = f"http://127.0.0.1:{port}"
    with open(tmp_path / "server.log", "w") as server_log, open(tmp_path / "worker.log", "w") as worker_log:
        server = subprocess.Popen([gpulayer, "server", "start", "--home", str(home), "--port", str(port),
                                   "--heartbeat-interval", "0.5"], cwd=tmp_path, env=env,
                                  stdout=server_log, stderr=subprocess.STDOUT)
        worker = None
        try:
            wait_for(lambda: _healthy(url) or server.poll() is not None, 30, "the server",
                     details=lambda: (tmp_path / "server.log").read_text())
            assert server.poll() is None, (tmp_path / "server.log").read_text()
            worker = subprocess.Popen([gpulayer, "worker", "start", "--name", "w1", "--gpus", "0",
                                       "--state-dir", str(tmp_path / "w1")], cwd=tmp_path,
                                      env=_env(venv, GPULAYER_URL=url, GPULAYER_JOIN_TOKEN=tokens["join_token"]),
                                      stdout=worker_log, stderr=subprocess.STDOUT)
            client = _env(venv, GPULAYER_URL=url, GPULAYER_TOKEN=tokens["client_token"],
                          GPULAYER_HOME=str(tmp_path / "client-home"))
            done = subprocess.run([gpulayer, "submit", "--wait", "--", "echo", "from-the-wheel"], cwd=tmp_path,
                                  env=client, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, (done.stdout, done.stderr, (tmp_path / "worker.log").read_text())
            job_id = done.stdout.split()[0]
            logs = subprocess.run([gpulayer, "job", "logs", job_id], cwd=tmp_path, env=client,
                                  capture_output=True, text=True, timeout=60)
            assert "from-the-wheel" in logs.stdout
        finally:
            if worker is not None:
                stop_process(worker)
            assert stop_process(server) == 0, (tmp_path / "server.log").read_text()


def _healthy(url: str) -> bool:
    import requests

    try:
        return requests.get(f"{url}/v1/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def test_wheel_runs_gpulayer_up_and_a_job_through_it(venv, tmp_path):
    gpulayer, home, port = str(venv / "bin" / "gpulayer"), tmp_path / "home", free_port()
    env = _env(venv, GPULAYER_HOME=str(home), PYTHONUNBUFFERED="1")
    log_path = tmp_path / "up.log"
    with open(log_path, "w") as log:
        up = subprocess.Popen([gpulayer, "up", "--host", "127.0.0.1", "--port", str(port), "--parallel", "1"],
                              cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: up.poll() is not None or "gpulayer join " in log_path.read_text(), 60,
                     "`up` to print its join line", details=log_path.read_text)
            assert up.poll() is None, log_path.read_text()
            done = subprocess.run([gpulayer, "submit", "--wait", "--", "echo", "up-from-the-wheel"], cwd=tmp_path,
                                  env=env, capture_output=True, text=True, timeout=90)
            assert done.returncode == 0, (done.stdout, done.stderr, log_path.read_text())
            logs = subprocess.run([gpulayer, "job", "logs", done.stdout.split()[0]], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=60)
            assert "up-from-the-wheel" in logs.stdout
        finally:
            assert stop_process(up) == 0, log_path.read_text()
