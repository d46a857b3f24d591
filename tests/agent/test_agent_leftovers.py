"""Task process groups a killed agent left running are killed by the next agent on the same state dir."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys

from agent.sandbox.leftovers import RunningTasks, start_time
from agent.sandbox.process import live_group_members


def _orphan_group() -> subprocess.Popen:
    """A task-like process group: a shell, a background grandchild and a foreground child."""
    return subprocess.Popen(["sh", "-c", "sleep 300 & sleep 300"], start_new_session=True)


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def _as_if_owned_by(path, pid: int) -> None:
    record = json.loads(path.read_text())
    record.update(agent=pid, agent_start=start_time(pid))
    path.write_text(json.dumps(record))


def test_a_dead_agents_task_group_is_killed_grandchildren_included(tmp_path):
    group = _orphan_group()
    try:
        records = RunningTasks(tmp_path)
        records.add("7-1", group.pid)
        _as_if_owned_by(tmp_path / "running" / "7-1.json", _dead_pid())
        assert len(live_group_members(group.pid)) >= 2
        assert records.reap(grace_s=2) == [("7-1", group.pid)]
        group.wait(5)
        assert live_group_members(group.pid) == []
        assert list((tmp_path / "running").iterdir()) == []
    finally:
        if group.poll() is None:
            group.kill()


def test_a_live_agents_tasks_and_reused_pids_are_left_alone(tmp_path):
    group = _orphan_group()
    try:
        records = RunningTasks(tmp_path)
        records.add("8-1", group.pid)  # owned by this process, which runs
        assert records.reap() == []
        assert (tmp_path / "running" / "8-1.json").exists()
        path = tmp_path / "running" / "8-1.json"
        _as_if_owned_by(path, _dead_pid())
        record = json.loads(path.read_text())
        path.write_text(json.dumps({**record, "start": record["start"] - 1}))  # the pid now names another process
        assert records.reap() == []
        assert group.poll() is None and not path.exists()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group.pid, signal.SIGKILL)
        group.wait(5)


def test_a_finished_task_leaves_no_record(tmp_path):
    records = RunningTasks(tmp_path)
    records.add("9-1", _dead_pid())
    records.remove("9-1")
    records.remove("9-1")
    assert records.reap() == [] and list((tmp_path / "running").iterdir()) == []


def test_the_sweeper_removes_ended_tasks_dirs_and_close_waits_for_them(tmp_path):
    from agent.run.reports import DirSweeper
    sweeper = DirSweeper()
    dirs = []
    for n in range(5):
        workdir = tmp_path / f"{n}-1"
        (workdir / ".gpulayer-checkpoint").mkdir(parents=True)
        if n % 2:
            (workdir / "out.txt").write_text("x")  # not empty: removed whole
        dirs.append(workdir)
        sweeper.remove(workdir)
    sweeper.remove(tmp_path / "gone-already")
    sweeper.close()
    assert not any(d.exists() for d in dirs) and list(tmp_path.iterdir()) == []
    sweeper.close()  # twice is fine
