"""A task cannot read its agent's environment or memory: the join token and the worker's credentials stay out
of reach of a task that reads /proc/$PPID/environ (real control plane, real `gpulayer worker start`).

As root a task could read any process's /proc files (CAP_SYS_PTRACE); the worker then runs with an empty
capability bounding set (setpriv), as an unprivileged user would: still uid 0, but without the capabilities.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agent.__main__ import main as agent_main
from gpulayer.testing import ControlPlaneProcess, run_cli, wait_for
from unprivileged import unprivileged_prefix

pytestmark = pytest.mark.timeout(90)

SECRET_ENV = {"AWS_SECRET_ACCESS_KEY": "s-agent-secret-456", "MY_API_KEY": "k-agent-key-123"}
#: The attack: print the agent's (the task's parent's) environment block and memory map.
READ_PARENT = ["sh", "-c", "tr '\\0' '\\n' < /proc/$PPID/environ; head -c 200 /proc/$PPID/mem; echo read-done"]


@pytest.fixture
def plane(tmp_path):
    with ControlPlaneProcess(tmp_path, heartbeat_interval=0.5, lease_ttl=3) as p:
        yield p


def job_output(plane, argv) -> str:
    job_id = plane.submit({"command": argv})
    done = plane.wait_job(job_id, timeout=30)
    lines = plane.get_json(f"/v1/jobs/{job_id}/logs?limit=1000")["lines"]
    text = "\n".join(line["text"] for line in lines)
    assert "read-done" in text, (done, redacted(text))
    return text


def redacted(text: str) -> str:
    """What a failure message may show of the task's output: not the environment it may have read."""
    return f"the task printed {len(text.splitlines())} lines; those without '=': " + " | ".join(
        line for line in text.splitlines() if "=" not in line)[:2000]


def test_a_task_cannot_read_its_agents_environment_token_in_the_environment(plane):
    plane.start_worker("w", env=SECRET_ENV, prefix=unprivileged_prefix())
    text = job_output(plane, READ_PARENT)
    assert plane.join_token not in text and "GPULAYER_JOIN_TOKEN" not in text, redacted(text)
    for value in SECRET_ENV.values():
        assert value not in text, redacted(text)
    assert "Permission denied" in text or "Operation not permitted" in text, redacted(text)


def test_a_task_cannot_read_its_agents_environment_token_from_a_file(plane, tmp_path):
    token_file = tmp_path / "join-token"
    token_file.write_text(plane.join_token + "\n")
    token_file.chmod(0o600)
    plane.start_worker("w", env={**SECRET_ENV, "GPULAYER_JOIN_TOKEN": ""}, prefix=unprivileged_prefix(),
                       args=["--token-file", str(token_file)])
    text = job_output(plane, READ_PARENT)
    assert plane.join_token not in text, redacted(text)


def test_the_agent_is_not_dumpable_and_drops_the_token_from_its_environ(monkeypatch):
    """In process: what run_worker does first (the real-worker tests above show its effect)."""
    from agent.hardening import forget_join_token
    monkeypatch.setenv("GPULAYER_JOIN_TOKEN", "glj_secret")
    assert forget_join_token() == "glj_secret" and "GPULAYER_JOIN_TOKEN" not in os.environ
    if sys.platform.startswith("linux"):
        code = ("import ctypes; from agent.hardening import make_undumpable; make_undumpable(); "
                "print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))")  # PR_GET_DUMPABLE
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                              cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
        assert done.stdout.strip() == "0", done.stderr


def test_token_file_problems_are_one_line_and_exit_2(tmp_path, capsys):
    missing = tmp_path / "nope"
    assert agent_main(["--url", "http://127.0.0.1:1", "--token-file", str(missing)]) == 2
    err = capsys.readouterr().err
    assert "--token-file" in err and "Traceback" not in err
    empty = tmp_path / "empty"
    empty.write_text("\n")
    assert agent_main(["--url", "http://127.0.0.1:1", "--token-file", str(empty)]) == 2
    assert "empty" in capsys.readouterr().err

    rc, _out, err = run_cli("--url", "http://127.0.0.1:1", "worker", "start", "--token-file", str(missing))
    assert rc == 2 and "--token-file" in err and "Traceback" not in err, err
    rc, _out, err = run_cli("join", "http://127.0.0.1:1", "--token-file", str(empty))
    assert rc == 2 and "empty" in err and "Traceback" not in err, err
