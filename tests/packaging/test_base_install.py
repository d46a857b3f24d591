"""The base install (no `server` extra) is the client, the CLI and the agent, and says so when asked for more.

`pip install gpulayer` must be enough for a GPU host: its worker runs jobs of a
control plane elsewhere, without apsw, falcon or cheroot. The commands that run
a control plane (`up`, `server ...`, `explore`, `submit --target local`, `sql`)
then end with one line naming `pip install 'gpulayer[server]'`, never a
traceback. The first test proves it on a real base install: this checkout's
wheel in a venv without system site packages, its dependencies from the package
registry. The second blocks the server's packages in a child of this checkout,
so that each command's message is checked without a network.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpulayer.cli.app import SERVER_PACKAGES
from gpulayer.testing import ControlPlaneProcess, clean_env, stop_process, wait_for
from wheels import build_wheel, venv_env

HINT = "pip install 'gpulayer[server]'"


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory) -> Path:
    """A venv (no system site packages) with this checkout's wheel and its base dependencies only."""
    work = tmp_path_factory.mktemp("base")
    wheel, venv = build_wheel(work), work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                           str(wheel)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        pytest.skip(f"could not install the base dependencies from the package registry: "
                    f"{done.stderr.strip().splitlines()[-1:]}")
    return venv


def test_base_install_runs_a_job_without_the_server_packages(base_venv, tmp_path):
    python, gpulayer = str(base_venv / "bin" / "python"), str(base_venv / "bin" / "gpulayer")
    found = subprocess.run([python, "-c", "import importlib.util as u; "
                            "print([m for m in ('apsw', 'falcon', 'cheroot') if u.find_spec(m)])"],
                           cwd=tmp_path, env=venv_env(base_venv), capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "[]"

    with ControlPlaneProcess(tmp_path / "plane", heartbeat_interval=0.5) as plane, \
            open(tmp_path / "worker.log", "w") as worker_log:
        worker = subprocess.Popen([gpulayer, "worker", "start", "--name", "lean", "--gpus", "0",
                                   "--state-dir", str(tmp_path / "lean")], cwd=tmp_path,
                                  env=venv_env(base_venv, GPULAYER_URL=plane.url,
                                               GPULAYER_JOIN_TOKEN=plane.join_token),
                                  stdout=worker_log, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: worker.poll() is not None or plane.online_worker("lean"), 60, "worker lean online",
                     details=lambda: (tmp_path / "worker.log").read_text())
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()
            job = plane.wait_job(plane.submit({"command": ["echo", "from-the-base-install"]}))
            assert job["state"] == "succeeded", (job, (tmp_path / "worker.log").read_text())
            rc, out, _ = plane.cli("job", "logs", str(job["id"]))
            assert rc == 0 and "from-the-base-install" in out
        finally:
            assert stop_process(worker) == 0, (tmp_path / "worker.log").read_text()

    up = subprocess.run([gpulayer, "up", "--home", str(tmp_path / "up-home")], cwd=tmp_path,
                        env=venv_env(base_venv), capture_output=True, text=True, timeout=60)
    assert up.returncode != 0
    assert HINT in up.stderr and "Traceback" not in up.stderr
    assert up.stderr.count("\n") == 1, up.stderr


@pytest.mark.parametrize("args", [
    ["up"],
    ["server", "init"],
    ["server", "start"],
    ["explore"],
    ["submit", "--target", "local", "--", "echo", "hi"],
    ["sql", "SELECT 1"],
])
def test_server_commands_name_the_extra_when_its_packages_are_missing(args, tmp_path):
    block = "; ".join(f"sys.modules[{name!r}] = None" for name in sorted(SERVER_PACKAGES))
    code = f"import sys; {block}; from gpulayer.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=tmp_path,
                          env=clean_env(GPULAYER_HOME=str(tmp_path / "home")), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stderr.startswith("Error: ") and HINT in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
