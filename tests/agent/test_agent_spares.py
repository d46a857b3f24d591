"""agent/sandbox/spares.py: sandboxes made ahead for plain tasks, with a real bwrap, setpriv and bash (issue 25).

A task run in a spare must read exactly as one in its own bwrap: its exit code, its output, its environment (the
loader's variables reaching the command only), its working dir and user, the signals of a stop, and nothing of the
agent's (not the status pipe, not another task's box); each spare serves one task and goes with it.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

from agent.sandbox.leftovers import RunningTasks
from agent.sandbox.process import TaskProcess, exit_code_of
from agent.sandbox.bwrap import resolve
from agent.sandbox.spares import Spares
from gpulayer.testing import pid_alive, wait_for

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or shutil.which("bash") is None or not sys.platform.startswith("linux")
    or os.geteuid() != 0, reason="sandboxes made ahead need bwrap and bash on Linux, and a root agent")


@pytest.fixture
def spares(tmp_path):
    sandbox = resolve("bwrap", shown=[sys.base_prefix, sys.prefix])
    made = Spares(sandbox, tmp_path / "tasks", RunningTasks(tmp_path), most=2)
    yield made
    made.close()


def ready(spares: Spares, network: bool = True):
    """A spare, once one was made (the first take only asks for one)."""
    found = []
    wait_for(lambda: found.append(spares.take(network)) or found[-1] is not None, 20, "a spare sandbox")
    return found[-1]


def run(spares: Spares, spare, argv: list[str], env: dict[str, str] | None = None) -> tuple[TaskProcess, list, Path]:
    workdir = spare.box / "7-1"
    workdir.mkdir()
    spares.sandbox.give(workdir)
    lines: list[tuple[str, str]] = []
    started = spares.start(spare, argv, env or {"PATH": "/usr/bin:/bin"}, str(workdir))
    pidfd, spare.init_pidfd = spare.init_pidfd, None
    proc = TaskProcess([], {}, "", lambda stream, text: lines.append((stream, text)), sandboxed=True,
                       started=started, init_pidfd=pidfd)
    return proc, lines, workdir


def test_a_task_in_a_spare_reads_as_one_in_its_own_sandbox(spares, tmp_path):
    assert spares.take(True) is None  # none is made until a plain task asks: this take makes one
    spare = ready(spares)
    assert (tmp_path / "running" / f"{spare.box.name}.json").exists()  # reaped by the next agent if this one dies
    script = ("id -u; pwd; echo \"$LD_GL_TEST $JOB_VAR ${AGENT_ONLY:-unset}\"; ls /proc/self/fd | tr '\\n' ' '; echo;"
              f" ls {spare.box.parent}; echo oops >&2; exit 7")
    os.environ["AGENT_ONLY"] = "agent"  # the agent's own environment reaches no task
    try:
        proc, lines, workdir = run(spares, spare, ["sh", "-c", script],
                                   {"PATH": "/usr/bin:/bin", "LD_GL_TEST": "loader", "JOB_VAR": "job"})
        assert exit_code_of(proc.popen.wait(timeout=20)) == 7
    finally:
        del os.environ["AGENT_ONLY"]
    assert not proc.group_alive() and proc.init_pidfd is None  # the namespace ended, seen on the init's pidfd
    proc.finish_readers()
    out = [text for stream, text in lines if stream == "stdout"]
    assert out[0] == str(spares.sandbox.drops_to(False).uid) and out[1] == str(workdir)
    assert out[2] == "loader job unset"
    assert out[3].split() == ["0", "1", "2", "3"], out  # stdin, stdout, stderr and ls's own: no status pipe
    assert out[4:] == [spare.box.name]  # its own box, not the others of tasks/
    assert ("stderr", "oops") in lines
    spares.done(spare)
    wait_for(lambda: not spare.box.exists(), 10, "the box to go with its sandbox")
    assert not (tmp_path / "running" / f"{spare.box.name}.json").exists()


def test_a_stop_reaches_the_command_with_its_grace_and_a_kill_reads_137(spares):
    spares.take(True)
    spare = ready(spares)
    trap = "trap 'echo got-term; exit 3' TERM; echo ready; sleep 600 & wait"
    proc, lines, _ = run(spares, spare, ["sh", "-c", trap])
    wait_for(lambda: ("stdout", "ready") in lines, 20, "the command to run")
    proc.kill_group(grace_s=10)
    proc.finish_readers()
    assert ("stdout", "got-term") in lines and exit_code_of(proc.popen.wait()) == 3
    spares.done(spare)

    other = ready(spares)
    proc, lines, _ = run(spares, other, ["sh", "-c", "trap '' TERM; echo ready; sleep 600"])
    wait_for(lambda: ("stdout", "ready") in lines, 20, "the command to run")
    began = time.monotonic()
    proc.kill_group(grace_s=0.5)
    assert exit_code_of(proc.popen.wait()) == 128 + signal.SIGKILL and time.monotonic() - began < 10
    assert not proc.group_alive()
    spares.done(other)


def test_each_spare_serves_one_task_and_at_most_one_a_slot_is_made(spares):
    spares.take(False)
    first = ready(spares, network=False)
    second = ready(spares, network=False)
    assert first.box != second.box and first.taken and second.taken
    wait_for(lambda: len(spares.ready[False]) + spares.making[False] == 2, 20, "the spares behind them")
    time.sleep(0.3)
    assert len(spares.ready[False]) <= 2 and spares.ready[True] == []  # network and none are made apart
    proc, lines, _ = run(spares, first, ["sh", "-c", "cat /sys/class/net/*/operstate 2>/dev/null | sort -u | tr -d '\\n'; "
                                                   "ls /sys/class/net"])
    assert proc.popen.wait(timeout=20) == 0
    proc.finish_readers()
    assert [text for _, text in lines][-1:] == ["lo"]  # network none: a loopback only
    for spare in (first, second):
        spares.done(spare)


def test_close_ends_the_spares_not_taken_and_removes_their_boxes(tmp_path):
    sandbox = resolve("bwrap", shown=[sys.base_prefix, sys.prefix])
    spares = Spares(sandbox, tmp_path / "tasks", RunningTasks(tmp_path), most=2)
    spares.take(True)
    wait_for(lambda: len(spares.ready[True]) == 1, 20, "a spare")
    spare = spares.ready[True][0]
    spares.close()
    assert not pid_alive(spare.proc.pid) and not spare.box.exists()
    assert list((tmp_path / "running").glob("box-*")) == []
    assert spares.take(True) is None  # closed: tasks make their own


def test_without_bash_a_worker_makes_none(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "bash" else "/usr/bin/" + name)
    spares = Spares(resolve("bwrap", shown=[sys.base_prefix, sys.prefix]), tmp_path / "tasks", None, most=1)
    assert spares.off and spares.take(True) is None and not (tmp_path / "tasks").exists()
    spares.close()


def test_a_spare_left_unused_is_ended(tmp_path):
    sandbox = resolve("bwrap", shown=[sys.base_prefix, sys.prefix])
    spares = Spares(sandbox, tmp_path / "tasks", None, most=1, idle_s=0.5)
    try:
        spares.take(True)
        wait_for(lambda: len(spares.ready[True]) == 1, 20, "a spare")
        spare = spares.ready[True][0]
        wait_for(lambda: not spare.box.exists() and not pid_alive(spare.proc.pid), 20, "the idle spare to end")
        assert spares.ready[True] == []
    finally:
        spares.close()


def test_a_spare_ended_under_a_running_command_reads_as_killed_and_its_pipe_is_not_read_again(spares):
    spares.take(True)
    spare = ready(spares)
    proc, lines, _ = run(spares, spare, ["sh", "-c", "echo ready; exec sleep 600"])
    wait_for(lambda: ("stdout", "ready") in lines, 20, "the command to run")
    spares.done(spare)  # the task's thread gave up on it (an agent error): its sandbox is killed, its pipe closed
    wait_for(lambda: spare.status == -1, 20, "the spare to end")
    reused = os.pipe()  # descriptor numbers the closed pipe had may be handed out again
    try:
        assert proc.popen.poll() in (-signal.SIGKILL, 128 + signal.SIGKILL)
        assert exit_code_of(proc.popen.wait()) == 128 + signal.SIGKILL
    finally:
        for fd in reused:
            os.close(fd)
    proc.finish_readers()
