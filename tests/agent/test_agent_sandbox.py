"""agent/sandbox/bwrap.py: the bwrap argv a task gets, who it runs as, and a real bwrap running it.

The end-to-end attack against real workers is tests/integration/test_sandbox.py.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from agent.errors import AgentError
from agent.gpu.nvml import Device
from agent.sandbox.process import TaskProcess, exit_code_of
from agent.sandbox.bwrap import (PASSED_SIGNALS, loader_variables, Sandbox, SandboxError, TaskUser, gpu_minors, gpu_nodes, parse_bind, resolve, startable,
                           untraversable)

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
NOBODY = TaskUser("nobody", 65534, 65534)


def boxed(tmp_path, **kw) -> Sandbox:
    return Sandbox(mode="bwrap", bwrap="/usr/bin/bwrap", env="/usr/bin/env", setpriv="/usr/bin/setpriv", **kw)


def test_none_leaves_the_command_alone(tmp_path):
    assert Sandbox().wrap(["true"], str(tmp_path), gpu_nodes=[]) == ["true"]


def test_the_argv_hides_shows_binds_and_drops_in_that_order(tmp_path):
    work = tmp_path / "state" / "tasks" / "1-1"
    work.mkdir(parents=True)
    sandbox = boxed(tmp_path, user=NOBODY, hidden=[str(tmp_path / "state")], shown=[sys.prefix])
    argv = sandbox.wrap(["python", "x.py"], str(work), gpu_nodes=["/dev/nvidia1"], network=False)
    assert argv[:3] == ["/usr/bin/env", f"--ignore-signal={PASSED_SIGNALS}", "/usr/bin/bwrap"]
    assert argv[-4:] == [f"--default-signal={PASSED_SIGNALS}", "--", "python", "x.py"]
    assert PASSED_SIGNALS.startswith("TERM,INT,HUP,") and "USR1" in PASSED_SIGNALS
    assert argv[argv.index("--") + 1:argv.index("--") + 5] == ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
                                                               "--clear-groups"]
    hide, bind = argv.index(str(tmp_path / "state")), argv.index("--bind")
    assert hide < bind and argv[bind + 1] == str(work)  # the working dir is bound after its parent is hidden
    assert "--unshare-net" in argv and "--unshare-pid" in argv and "--die-with-parent" in argv
    assert "--new-session" not in argv  # the command stays in the process group the agent signals
    assert argv[argv.index("--dev-bind-try") + 1] == "/dev/nvidia1"


def test_root_asked_and_allowed_keeps_the_agents_user(tmp_path):
    sandbox = boxed(tmp_path, user=NOBODY, allow_root_tasks=True)
    assert "/usr/bin/setpriv" not in sandbox.wrap(["id"], str(tmp_path), gpu_nodes=[], root_asked=True)
    assert sandbox.drops_to(False) == NOBODY
    assert boxed(tmp_path, user=NOBODY).drops_to(True) == NOBODY  # asked, not allowed


def test_untraversable_finds_the_highest_closed_parent():
    top = Path(tempfile.mkdtemp(prefix="gpulayer-sandbox-"))  # in /tmp itself: pytest's tmp_path is under a 0700 dir
    try:
        top.chmod(0o755)
        closed = top / "closed"
        (closed / "inner" / "work").mkdir(parents=True)
        closed.chmod(0o700)
        (closed / "inner").chmod(0o700)
        assert untraversable([str(closed / "inner" / "work"), str(top)], NOBODY) == [str(closed)]
    finally:
        shutil.rmtree(top)


def test_gpu_nodes_and_minors():
    assert gpu_nodes([]) == []
    nodes = gpu_nodes([3, 1, 3])
    assert nodes[:2] == ["/dev/nvidia1", "/dev/nvidia3"] and "/dev/nvidiactl" in nodes
    mig = Device(gpu=2, uuid="MIG-a", name="1g.10gb", mig=True)
    assert gpu_minors(["MIG-a", "1", "GPU-x"], {0: mig}) == [2, 1, 2]


def test_startable_remembers_where_a_command_is_and_checks_it_at_each_use(tmp_path):
    folder = tmp_path / "bin"
    folder.mkdir()
    command = folder / "arr41-tool"
    command.write_text("#!/bin/sh\n")
    command.chmod(0o755)
    env = {"PATH": f"{folder}:/usr/bin"}
    startable(["arr41-tool"], env, str(tmp_path))
    startable(["arr41-tool"], env, str(tmp_path))  # found again (remembered)
    command.chmod(0o644)
    with pytest.raises(PermissionError):  # what was found is checked again
        startable(["arr41-tool"], env, str(tmp_path))
    command.unlink()
    with pytest.raises(FileNotFoundError):
        startable(["arr41-tool"], env, str(tmp_path))


def test_startable_says_what_exec_would(tmp_path):
    with pytest.raises(FileNotFoundError):
        startable(["no-such-command-xyz"], {"PATH": "/usr/bin"}, str(tmp_path))
    (tmp_path / "script").write_text("#!/bin/sh\n")
    with pytest.raises(PermissionError):
        startable(["./script"], {}, str(tmp_path))
    startable(["sh"], {"PATH": "/usr/bin:/bin"}, str(tmp_path))


def test_bad_mode_and_bad_user_are_one_line_errors(monkeypatch):
    with pytest.raises(SandboxError, match="--sandbox box: expected one of auto, bwrap, none"):
        resolve("box")
    assert issubclass(SandboxError, AgentError) and SandboxError.exit_code == 2
    if os.geteuid() == 0:
        with pytest.raises(SandboxError, match="--run-as no-such-user-xyz: no such user"):
            resolve("bwrap", run_as="no-such-user-xyz")
        with pytest.raises(SandboxError, match="that is root"):
            resolve("bwrap", run_as="root")


def test_auto_without_bwrap_is_none_with_a_warning(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    sandbox = resolve("auto")
    assert sandbox.mode == "none" and "bwrap is not installed" in sandbox.isolation()["warning"]
    assert sandbox.summary().startswith("none (tasks are not sandboxed")
    with pytest.raises(SandboxError, match="--sandbox bwrap: bwrap is not installed"):
        resolve("bwrap")


@needs_bwrap
def test_a_sandboxed_task_gets_its_sigterm_and_grace_and_its_exit_code(tmp_path):
    sandbox = resolve("bwrap", shown=[sys.base_prefix, sys.prefix])
    sandbox.give(tmp_path)
    lines: list[tuple[str, str]] = []
    trap = "trap 'echo got-term; exit 3' TERM; echo ready; sleep 600 & wait"
    proc = TaskProcess(sandbox.wrap(["sh", "-c", trap], str(tmp_path), gpu_nodes=[]), {"PATH": "/usr/bin:/bin"},
                       str(tmp_path), lambda stream, text: lines.append((stream, text)))
    deadline = time.monotonic() + 20
    while ("stdout", "ready") not in lines and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.kill_group(grace_s=10)
    proc.finish_readers()
    assert ("stdout", "got-term") in lines and exit_code_of(proc.poll()) == 3
    assert not proc.group_alive()

    proc = TaskProcess(sandbox.wrap(["sh", "-c", "kill -KILL $$"], str(tmp_path), gpu_nodes=[]),
                       {"PATH": "/usr/bin:/bin"}, str(tmp_path), lambda *_: None)
    assert exit_code_of(proc.popen.wait()) == 128 + signal.SIGKILL


@needs_bwrap
def test_a_root_agents_task_runs_as_the_task_user_and_owns_its_working_dir(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the agent is not root here: tasks run as its user")
    sandbox = resolve("bwrap", run_as="nobody", shown=[sys.base_prefix, sys.prefix])
    work = tmp_path / "work"
    (work / "in").mkdir(parents=True)
    (work / "in" / "data.txt").write_text("x")
    sandbox.give(work)
    done = subprocess.run(sandbox.wrap(["sh", "-c", "id -u; echo y >> in/data.txt; ls /root | wc -l"], str(work),
                                       gpu_nodes=[]), capture_output=True, text=True, cwd=work)
    assert done.returncode == 0, done.stderr
    uid, entries = done.stdout.split()
    assert uid == "65534" and (work / "in" / "data.txt").read_text() == "xy\n"
    assert int(entries) <= 1  # /root is an empty mount, but for the interpreter bound back (.pyenv here)


@needs_bwrap
def test_a_sandboxed_command_that_ended_leaves_nothing_to_kill(tmp_path):
    """bwrap exits on its command's status while the namespace's init is still ending: not a leftover."""
    from agent.run.supervision import Limits, TaskHandle, supervise
    sandbox = resolve("bwrap", shown=[sys.base_prefix, sys.prefix])
    sandbox.give(tmp_path)
    system: list[str] = []
    for task_id in range(30):
        proc = TaskProcess(sandbox.wrap(["sh", "-c", "echo hi | cat"], str(tmp_path), gpu_nodes=[]),
                           {"PATH": "/usr/bin:/bin"}, str(tmp_path), lambda *_: None, sandboxed=True)
        assert supervise(proc, TaskHandle(task_id), Limits(None, None, proc.started), system.append, 1.0) is None
        assert exit_code_of(proc.popen.wait()) == 0
    assert system == []


@needs_bwrap
def test_the_namespaces_end_is_seen_on_its_inits_pidfd_without_walking_proc(tmp_path, monkeypatch):
    """bwrap's --info-fd names the sandbox's init; its pidfd says when the namespace (and what ran in it, a
    background child too) is gone. A short task no longer reads every /proc/<pid>/stat to learn it."""
    import agent.sandbox.process
    from agent.run.supervision import Limits, TaskHandle, supervise
    walks: list[int] = []
    walk = agent.sandbox.process.live_group_members
    monkeypatch.setattr(agent.sandbox.process, "live_group_members", lambda pgid, *a: walks.append(pgid) or walk(pgid, *a))
    sandbox = resolve("bwrap", shown=[sys.base_prefix, sys.prefix])
    sandbox.give(tmp_path)
    system: list[str] = []
    for task_id in range(5):
        info = os.pipe()
        argv = sandbox.wrap(["sh", "-c", "sleep 600 & echo $! > bg.pid; exit 4"], str(tmp_path), gpu_nodes=[],
                            info_fd=info[1])
        proc = TaskProcess(argv, {"PATH": "/usr/bin:/bin"}, str(tmp_path), lambda *_: None, sandboxed=True, info=info)
        assert proc.init_pidfd is not None
        assert supervise(proc, TaskHandle(task_id), Limits(None, None, proc.started), system.append, 1.0) is None
        assert exit_code_of(proc.popen.wait()) == 4 and proc.init_pidfd is None  # seen ended, and let go
        proc.finish_readers()
        assert walks == [] and walk(proc.pid) == []  # nothing of the group lives: the background sleep died with it
    assert system == []
    with pytest.raises(OSError):  # the pipe's ends are the task's: both closed once it started
        os.fstat(info[0])


def test_bind_specs_parse_or_say_what_is_wrong(tmp_path):
    assert parse_bind(str(tmp_path)) == (str(tmp_path), str(tmp_path), False)
    assert parse_bind(f"{tmp_path}:/data:ro") == (str(tmp_path), "/data", True)
    assert parse_bind(f"{tmp_path}/:{tmp_path}:rw") == (str(tmp_path), str(tmp_path), False)
    for spec, said in ((f"{tmp_path}/missing", "no such path"), ("data", "must be absolute"),
                       (f"{tmp_path}:data", "must be absolute"), (f"{tmp_path}:/a:/b", "expected HOST"),
                       (":/a", "expected HOST")):
        with pytest.raises(SandboxError, match=f"--sandbox-bind .*{said}"):
            parse_bind(spec)
    with pytest.raises(SandboxError, match="no such path"):
        resolve("none", binds=[f"{tmp_path}/missing"])  # checked even where no sandbox makes it


def test_the_cli_default_is_the_agents():
    from agent.sandbox.bwrap import DEFAULT_MODE
    from gpulayer.cli.workers import SANDBOX_DEFAULT
    assert SANDBOX_DEFAULT == DEFAULT_MODE == "auto"


@needs_bwrap
def test_a_bound_dir_is_seen_read_write_or_read_only_and_nothing_else_of_the_hosts_tmp(tmp_path):
    shared, ro = tmp_path / "shared", tmp_path / "ro"
    for path in (shared, ro):
        path.mkdir()
        path.chmod(0o1777)
    (ro / "in.txt").write_text("read me")
    (tmp_path / "secret").write_text("not bound")
    work = tmp_path / "work"
    work.mkdir()
    sandbox = resolve("bwrap", shown=[sys.base_prefix, sys.prefix],
                      binds=[str(shared), f"{ro}:/tmp/data:ro"])
    sandbox.give(work)
    script = (f"echo out > {shared}/out.txt; cat /tmp/data/in.txt; echo; "
              f"touch /tmp/data/x 2>/dev/null || echo read-only; cat {tmp_path}/secret 2>/dev/null || echo hidden")
    done = subprocess.run(sandbox.wrap(["sh", "-c", script], str(work), gpu_nodes=[]), capture_output=True,
                          text=True, cwd=work)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["read me", "read-only", "hidden"]
    assert (shared / "out.txt").read_text() == "out\n" and not (ro / "x").exists()


def test_variables_glibc_distrusts_reach_the_command_only_through_the_inner_env():
    """GCONV_PATH, LOCPATH, GLIBC_TUNABLES, ... (glibc's unsecure list, beside LD_*) from a job or its image are
    set by the inner env, inside the sandbox: the root env, setpriv, nsenter and bwrap that start it (not setuid,
    so glibc would honour them there) never get them (issue 36). A unit test: what a root tool does with a gconv
    module or locale data of the job's choosing needs no bug of ours to be shown, only the variable reaching it."""
    env = {"PATH": "/bin", "HOME": "/h", "LD_PRELOAD": "./evil.so", "GCONV_PATH": "/gpulayer/task/gconv",
           "LOCPATH": "/gpulayer/task/locale", "GLIBC_TUNABLES": "glibc.malloc.check=3", "TMPDIR": "/tmp/x",
           "LANG": "C.UTF-8"}
    outer, inner = loader_variables(env)
    assert outer == {"PATH": "/bin", "HOME": "/h", "LANG": "C.UTF-8"}
    assert inner == ["GCONV_PATH=/gpulayer/task/gconv", "GLIBC_TUNABLES=glibc.malloc.check=3", "LD_PRELOAD=./evil.so",
                     "LOCPATH=/gpulayer/task/locale", "TMPDIR=/tmp/x"]
    if shutil.which("bwrap") is None or not sys.platform.startswith("linux"):
        return
    sandbox = resolve("bwrap")
    with tempfile.TemporaryDirectory() as workdir:
        sandbox.give(Path(workdir))
        argv = sandbox.wrap([*inner, "sh", "-c", 'echo "$GCONV_PATH $LOCPATH $TMPDIR"'], workdir, gpu_nodes=[])
        done = subprocess.run(argv, env=outer, capture_output=True, text=True, timeout=30)
    assert done.stdout.strip() == "/gpulayer/task/gconv /gpulayer/task/locale /tmp/x", (done.stdout, done.stderr)
