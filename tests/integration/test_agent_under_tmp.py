"""An agent installed under /tmp (issue 36, items 13 and 19): a real venv made with `python3 -m venv
--system-site-packages` in a folder of /tmp that everyone may enter, the worker started from it as an activated
venv would (`gpulayer worker start`, its PATH beginning with the venv's bin), its --state-dir under /tmp too, a
real control plane on granian with TLS and a root worker with a bubblewrap sandbox.

The sandbox's own /tmp used to hide both: the README's `--source . -- python train.py` ended `env: 'python': No
such file or directory` (127), and SSH into a task could not start the agent's interpreter. The task, exec,
shell and SSH must all reach the venv's Python, read-only, as the task user.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from integration_cluster import Cluster

from gpulayer.testing import CLI, clean_env, wait_for
from terminal import Terminal

pytest.importorskip("granian")
pytest.importorskip("asyncssh")
pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("bwrap") is None, reason="needs bubblewrap"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the task user's view is a root agent's"),
    pytest.mark.timeout(300),
]

TRAIN = "import os, sys\nprint('trained-with', sys.prefix, 'uid', os.getuid())\n"


@pytest.fixture(scope="module")
def place():
    """A folder of /tmp anyone may enter (0755, as /tmp/xyz is), removed at the end."""
    folder = Path(tempfile.mkdtemp(prefix="gl-under-tmp-", dir="/tmp"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def venv(place) -> Path:
    made = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(place / "venv")],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    return place / "venv"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, place, venv):
    c = Cluster(tmp_path_factory.mktemp("under-tmp"), tls=True).start_server()
    try:
        python = str(venv / "bin" / "python")  # the venv's interpreter, not this one
        c.start_worker("tmpw", env={"PATH": f"{venv / 'bin'}:{os.environ.get('PATH', os.defpath)}",
                                    "VIRTUAL_ENV": str(venv)},
                       argv=[python, "-m", "gpulayer.cli", "--url", c.url, "--ca-file", str(c.ca_file), "worker", "start",
                             "--name", "tmpw", "--state-dir", str(place / "state"), "--gpus", "0", "--label",
                             "pool=tmpw", "--sandbox", "bwrap", "--parallel", "4"])
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def job(cluster, tmp_path_factory, venv):
    """The README's `--source . -- python train.py`, then a sleep: a task to enter."""
    source = tmp_path_factory.mktemp("train")
    (source / "train.py").write_text(TRAIN)
    done = cluster.cli("submit", "--label", "pool=tmpw", "--source", str(source), "--", "sh", "-c",
                       "python train.py && exec sleep 600", timeout=120)
    assert done.returncode == 0, done.stderr
    job_id = int(done.stdout.split()[0])
    text = wait_for(lambda: "trained-with" in (t := cluster.log_text(job_id)) and t, 90, "train.py to run",
                    details=lambda: f"{cluster.job(job_id)}\n{cluster.log_text(job_id)}")
    yield job_id, text
    cluster.request("POST", f"/v1/jobs/{job_id}/cancel")


def test_python_train_py_runs_with_the_agents_venv(cluster, job, venv, tmp_path):
    _, text = job
    uid = int(subprocess.run(["id", "-u", "gpulayer-task"], capture_output=True, text=True).stdout)
    assert f"trained-with {venv} uid {uid}" in text, text
    (tmp_path / "train.py").write_text(TRAIN)
    done = cluster.cli("submit", "--label", "pool=tmpw", "--source", str(tmp_path), "--wait", "--", "python",
                       "train.py", timeout=120)  # as the README has it: `python` itself found on PATH
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert f"trained-with {venv} uid {uid}" in cluster.log_text(int(done.stdout.split()[0]))


def test_exec_and_shell_reach_the_venvs_python(cluster, job, venv):
    job_id, _ = job
    ran = cluster.client().get_job(job_id).exec(["python", "-c", "import sys; print(sys.prefix)"])
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.decode().strip() == str(venv), ran.stdout
    env = clean_env(**cluster.cli_env(TERM="xterm"))
    terminal = Terminal([*CLI, "shell", str(job_id), "--", "sh", "-c", 'python -c "print(6*7)"; exit 3'], env,
                        cluster.root)
    assert terminal.exit_code() == 3, terminal.output
    assert "42" in terminal.output, terminal.output


def test_ssh_into_the_task_runs_the_agents_server(cluster, job, tmp_path):
    job_id, _ = job
    printed = cluster.cli("ssh-config")
    assert printed.returncode == 0, printed.stderr
    config = tmp_path / "config"
    config.write_text(printed.stdout + "    BatchMode yes\n    ConnectTimeout 60\n")
    got = subprocess.run(["ssh", "-F", str(config), f"gpulayer-{job_id}", "echo via-ssh $(id -u)"],
                         env=clean_env(**cluster.cli_env()), capture_output=True, timeout=120, cwd=cluster.root)
    assert got.returncode == 0, got.stderr
    assert got.stdout.decode().startswith("via-ssh "), got.stdout
