"""`exec` streams: a command run in a running task's place, its stdio through the relay (`gpulayer exec`).

The command gets the task's environment (GPULAYER_*, the job's env, CUDA_VISIBLE_DEVICES, a service's PORT), its working
directory, and its user and sandbox: in a bubblewrap sandbox it enters the task's namespaces with nsenter
and drops to the task user with setpriv, as agent/sandbox/shared.py starts an array's elements in their job's
sandbox (`Sandbox.enter_argv`); without a sandbox (`--sandbox none`) it runs as the agent, as the task does.
It leads its own process group, which a SIGNAL frame signals and a CLOSE from the client (or a lost link, or
more control frames waiting than the protocol allows) kills at once.
stdout is DATA, stderr is EXT_DATA channel 2; DATA towards it is stdin, EOF closes stdin; the stream
ends with CLOSE `exit_code` (128+N for a death by signal N), or `error` when it could not start.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass

from gpulayer.protocol.control import Close, Signal, StreamOpen
from gpulayer.protocol.fields import from_wire, to_wire
from gpulayer.protocol.relay import CLOSE, DATA, EOF, EXT_DATA, SIGNAL, SIGNALS, STDERR, Frame
from gpulayer.relaylink.streams import Stream

from ..cpusets import pinned
from ..events import log_event
from ..run.supervision import TaskHandle, TaskRunnerView
from ..sandbox.bwrap import TaskUser, loader_variables
from ..sandbox.imagerun import helper, staged
from ..sandbox.process import READ_BYTES, exit_code_of, live_group_members


class ExecRefused(Exception):
    """The command cannot run in this task (the message says why)."""


def task_cpus(handle: TaskHandle) -> frozenset[int] | None:
    """The CPUs the task runs on (--pin-cpus), for what exec, shell and SSH start in it; None: unpinned."""
    return handle.runner.cpus if handle.runner is not None else None


def command_in(handle: TaskHandle, argv: list[str]) -> tuple[list[str], dict[str, str], str]:
    """The argv, environment and cwd that run `argv` in the task's place; ExecRefused when it cannot."""
    runner = _running(handle)
    env = runner.environment(runner.extra_env)
    workdir = str(runner.workdir)
    sandbox = runner.ctx.sandbox
    if sandbox.mode == "none":
        return argv, env, workdir
    if sandbox.nsenter is None:
        raise ExecRefused("this worker has no nsenter (Debian package util-linux): exec cannot enter the task's sandbox")
    network = runner.assignment.network != "none"
    pid, own_userns = _sandbox_init(handle, runner)
    spaces = [*(["-U", "--preserve-credentials"] if own_userns else []), "-m", "-p", "-i", *([] if network else ["-n"])]
    if runner.image is not None:  # the image's root: its env is the host's, under /.gpulayer
        env, cwd = runner.image_place(env)
        outer, loader = loader_variables(env)
        user = None if own_userns else sandbox.drops_to(runner.assignment.run_as_root)
        inner_env = helper(shutil.which(sandbox.env) or sandbox.env)[1]
        return [*_image_drop(sandbox.setpriv), sandbox.nsenter, "-t", str(pid), *spaces, "-r", *_nsenter_user(user), "--",
                *inner_env, f"--chdir={cwd}", *loader, "--", *argv], outer, "/"
    outer, loader = loader_variables(env)
    if own_userns:
        return [sandbox.nsenter, "-t", str(pid), *spaces, "-r", "--", sandbox.env, f"--chdir={workdir}", *loader, "--", *argv], outer, "/"
    return sandbox.enter_argv(pid, argv, workdir, network=network, loader=loader), outer, "/"


def _image_drop(setpriv: str | None) -> list[str]:
    """What starts nsenter into an image task: setpriv (the host's, in the host's root) sets no_new_privs, which
    nsenter and what it execs in the image keep."""
    return [setpriv or shutil.which("setpriv") or "/usr/bin/setpriv", "--no-new-privs"]


def _nsenter_user(user: TaskUser | None) -> list[str]:
    """nsenter's own drop to the task user (no groups), after it joined the namespaces and the image's root and
    before it execs anything there: nothing of the image runs as root (its ld.so.preload; issue 36)."""
    return [f"--setgid={user.gid}", f"--setuid={user.uid}"] if user is not None else []


@dataclass(frozen=True)
class ImageEntry:
    """What a process of the agent's needs to join an image task's place itself (agent/relay/ssh.py): the
    sandbox's init, the namespaces to join (in order: its user namespace first, when it has one of its own),
    the user to become (None: stay who the agent is in there), the task's environment and working directory."""

    pid: int
    namespaces: tuple[str, ...]
    user: TaskUser | None
    env: dict[str, str]
    cwd: str


def image_entry(handle: TaskHandle) -> ImageEntry:
    """The place of an image job's running task, as exec enters it (command_in); ExecRefused when it cannot."""
    runner = _running(handle)
    assert runner.image is not None
    pid, own_userns = _sandbox_init(handle, runner)
    env, cwd = runner.image_place(runner.environment(runner.extra_env))
    user = None if own_userns else runner.ctx.sandbox.drops_to(runner.assignment.run_as_root)
    network = runner.assignment.network != "none"
    spaces = (*(("user",) if own_userns else ()), "ipc", *(() if network else ("net",)), "pid", "mnt")
    return ImageEntry(pid, spaces, user, env, cwd)


def _running(handle: TaskHandle) -> TaskRunnerView:
    runner, process = handle.runner, handle.process
    if runner is None or process is None or process.poll() is not None:
        raise ExecRefused(f"task {handle.task_id} is not running on this worker now")
    return runner


def _sandbox_init(handle: TaskHandle, runner: TaskRunnerView) -> tuple[int, bool]:
    """The pid of the task's sandbox's init, and whether its sandbox has a user namespace of its own (a
    non-root agent's bwrap)."""
    pid = sandbox_init_pid(handle)
    if pid is None:
        raise ExecRefused(f"task {handle.task_id}'s sandbox is not there (it is ending)")
    return pid, _namespace(pid, "user") != _namespace(os.getpid(), "user")


def host_tool(handle: TaskHandle, path: str) -> list[str]:
    """The argv prefix that runs host tool `path` in the task's place: `path` itself, or in an image job's task
    the copy bound under /.gpulayer (agent/sandbox/imagerun.py ENTER_TOOLS), through the host's loader."""
    runner = handle.runner
    return helper(path)[1] if runner is not None and runner.image is not None else [path]


def sandbox_init_pid(handle: TaskHandle) -> int | None:
    """The pid of a running task's sandbox's init (None once it is gone): its job's shared sandbox's, or the
    child of the task's bwrap, or in an image task that a root agent started through a stage (agent/sandbox/imagerun.py
    Sources) the child of the inner bwrap, the outer's child."""
    runner, process = handle.runner, handle.process
    if runner is not None and runner.holder is not None:
        return runner.holder.pid
    if process is None:
        return None
    pid = _sandbox_pid(process.pid)
    if pid is not None and runner is not None and runner.image is not None and staged(runner.ctx.sandbox,
                                                                                       runner.assignment.run_as_root):
        pid = _sandbox_pid(pid)
    return pid


def _sandbox_pid(bwrap_pid: int) -> int | None:
    """The pid of the sandbox's init: bwrap's child (bwrap itself stays outside the namespaces)."""
    try:
        with open(f"/proc/{bwrap_pid}/task/{bwrap_pid}/children") as handle:
            children = handle.read().split()
    except OSError:
        return None
    return int(children[0]) if children else None


def _namespace(pid: int, name: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{name}")
    except OSError:
        return None


def serve(stream: Stream, opened: StreamOpen, find: Callable[[int], TaskHandle | None]) -> None:
    """Run an OPEN `exec` stream to its end (on its own thread)."""
    argv, task_id = opened.argv, opened.task_id
    handle = find(task_id) if isinstance(task_id, int) else None
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        return stream.close(Close(error="exec: argv must be a non-empty list of strings"))
    if handle is None:
        return stream.close(Close(error=f"task {task_id} is not running on this worker"))
    try:
        launch, env, cwd = command_in(handle, argv)
        with pinned(task_cpus(handle)):
            proc = subprocess.Popen(launch, env=env, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True)
    except ExecRefused as exc:
        return stream.close(Close(error=str(exc)))
    except OSError as exc:  # unsandboxed: the command itself could not start
        code = 127 if isinstance(exc, FileNotFoundError) else 126
        stream.write(f"gpulayer exec: cannot run {argv[0]!r}: {exc.strerror or exc}\n".encode(), STDERR)
        return stream.close(Close(exit_code=code, reason=f"cannot run {argv[0]!r}"))
    log_event("exec_started", task_id=task_id, pid=proc.pid, session_id=opened.session_id)
    # The stream's end (a client's CLOSE, a lost link, too many control frames) kills the command at once: the
    # feeder may be stuck writing to a stdin the command does not read, and would never get to the CLOSE.
    stream.on_end = lambda: _kill_if_running(proc)
    pumps = [
        threading.Thread(target=_pump, args=(pipe, stream, channel), daemon=True, name=f"exec-out-{proc.pid}")
        for pipe, channel in ((proc.stdout, 1), (proc.stderr, STDERR))
    ]
    for pump in pumps:
        pump.start()
    entered = launch is not argv  # nsenter leads the group: a signal spares it (it exits as its child does)
    feeder = threading.Thread(target=_feed, args=(stream, proc, entered), daemon=True, name=f"exec-in-{proc.pid}")
    feeder.start()
    code = exit_code_of(proc.wait())
    for pump in pumps:
        pump.join(5.0)  # a grandchild that keeps the pipes open does not hold the answer for ever
    kill_group(proc, signal.SIGKILL)  # what the command left in its group
    log_event("exec_finished", task_id=task_id, pid=proc.pid, exit_code=code, session_id=opened.session_id)
    stream.close(Close(exit_code=code))
    stream.inbox.put(Frame(stream.id, CLOSE, to_wire(Close(reason="the command ended"))))  # ends the feeder
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def _kill_if_running(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        kill_group(proc, signal.SIGKILL)


def _pump(pipe, stream: Stream, channel: int) -> None:
    """The command's stdout or stderr into the stream, as fast as its credit allows."""
    fd = pipe.fileno()
    stream.pour(lambda size: os.read(fd, size), READ_BYTES, channel)


def _feed(stream: Stream, proc: subprocess.Popen, entered: bool) -> None:
    """The stream's frames into the command: DATA to stdin, EOF closes it, SIGNAL signals its group, CLOSE kills."""
    stdin = proc.stdin
    assert stdin is not None
    while True:
        frame = stream.recv()
        if frame is None:
            continue
        if frame.type in (DATA, EXT_DATA):
            try:
                stdin.write(frame.data)
                stdin.flush()
            except (OSError, ValueError):  # the command closed its stdin or ended: the bytes go nowhere
                pass
            stream.consumed(len(frame.data))
        elif frame.type == EOF:
            _close(stdin)
        elif frame.type == SIGNAL:
            name = from_wire(Signal, frame.fields).signal
            if name in SIGNALS:
                kill_group(proc, getattr(signal, f"SIG{name}"), spare_leader=entered)
        elif frame.type == CLOSE:
            if proc.poll() is None:
                log_event("exec_killed", pid=proc.pid, reason=from_wire(Close, frame.fields).why())
                kill_group(proc, signal.SIGKILL)
            _close(stdin)
            return


def _close(stdin) -> None:
    try:
        stdin.close()
    except OSError:
        pass


def kill_group(proc: subprocess.Popen, sig: int, spare_leader: bool = False) -> None:
    """`sig` to the command's process group; `spare_leader`: to all of it but nsenter, which leads it."""
    if spare_leader:
        for pid in live_group_members(proc.pid) or []:
            if pid != proc.pid:
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        return
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
