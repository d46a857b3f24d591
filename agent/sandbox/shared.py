"""One sandbox shared by the elements of one job on this worker, instead of one bwrap per element.

Making and ending a mount namespace is most of what a bwrap launch costs (about 20 of its 25 ms on this
machine under load, docs/benchmarks/issue-25.md, "Arrays: one sandbox per job"), and a job array of short elements pays it per element.
The elements of one job belong to one owner, so a worker gives them one sandbox: a *holder*, a bwrap of the
same mounts as a task's but binding the job's directory (``tasks/job-<id>/``, under which each element has its
own working directory), whose command, as the task user, is the job's launcher (agent/sandbox/launcher.py): it forks
each element itself, as its own process group that the agent signals, and tells the agent its pid and exit
status. Without a launcher (it ended, or did not start in time), an element is started by the agent as before,
through ``nsenter`` into the holder's mount, PID and IPC (and, for ``network: none``, network) namespaces and
``setpriv`` down to the task user with no new privileges: the same view, user and capabilities as a bwrap'd
task, at the cost of two execs (the holder then sleeps).

What elements of one job share: the PID namespace (they see, and may signal, each other), ``/tmp``,
``/dev/shm`` and IPC, and the job's directory (each writes its own working dir). Nothing of another job's or
of the agent's: a different job has its own holder (docs/security.md, "Array elements share a sandbox").

A holder ends ``LINGER_S`` after its last element, or with the worker; killing the agent ends it too
(``--die-with-parent``: its PID namespace, and so every element in it, is killed), and its process group is
recorded with the running tasks (``job-<id>``) for the next agent to reap.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import TaskSetupError
from ..events import log_event
from .bwrap import Sandbox
from .launcher import SOURCE, Launched, Launcher, pid_namespace
from .leftovers import RunningTasks

#: Seconds a job's holder stays after its last element ended (the next element of a busy array comes sooner).
LINGER_S = 5.0
#: Seconds a holder may take to be ready.
READY_TIMEOUT_S = 10.0


@dataclass
class Holder:
    """A job's shared sandbox (started on the first launch) and how many elements hold it."""

    key: tuple[int, bool]
    job_dir: Path
    users: int = 0
    last_used: float = field(default_factory=time.monotonic)
    proc: subprocess.Popen | None = None
    pid: int | None = None  # the host pid of the sandbox's init, which nsenter joins
    #: The holder's command, which forks each element itself (agent/sandbox/launcher.py); None: elements use nsenter.
    launcher: Launcher | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class SharedSandboxes:
    """The holders of one worker, by (job, network)."""

    def __init__(self, sandbox: Sandbox, tasks_dir: Path, running: RunningTasks | None, *,
                 keep_dirs: bool = False, linger_s: float = LINGER_S, launcher: str | None = sys.executable):
        self.sandbox, self.tasks_dir, self.running = sandbox, tasks_dir, running
        #: The interpreter that runs each job's launcher inside its sandbox; None: elements enter by nsenter.
        self.python = launcher
        self.keep_dirs, self.linger_s = keep_dirs, linger_s
        self.holders: dict[tuple[int, bool], Holder] = {}
        self.lock = threading.Lock()
        self.closed = threading.Event()
        self._reaper: threading.Thread | None = None
        #: Holders are started from this one long-lived thread: bwrap's --die-with-parent is the death of the
        #: thread that started it, and a task's thread ends with its element.
        self._starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shared-sandbox-start")

    def hold(self, job_id: int, network: bool) -> Holder:
        """The job's holder, held until release(): its directory stays while an element uses it."""
        with self.lock:
            key = (job_id, network)
            holder = self.holders.get(key)
            made = holder is None
            if holder is None:
                holder = self.holders[key] = Holder(key, self.tasks_dir / f"job-{job_id}{'' if network else '-netless'}")
            holder.users += 1
            if self._reaper is None:
                self._reaper = threading.Thread(target=self._reap_loop, name="shared-sandboxes", daemon=True)
                self._reaper.start()
        if made:  # it stays until the holder ends (out of `holders` first); an element's mkdir makes it anyway
            holder.job_dir.mkdir(parents=True, exist_ok=True)
        return holder

    def release(self, holder: Holder) -> None:
        with self.lock:
            holder.users -= 1
            holder.last_used = time.monotonic()

    def started(self, holder: Holder) -> int:
        """The holder's init pid, starting it on first use; TaskSetupError when it cannot start."""
        return self._starter.submit(self._started, holder).result()

    def _started(self, holder: Holder) -> int:
        with holder.lock:
            if holder.proc is not None and holder.proc.poll() is None and holder.pid is not None:
                return holder.pid
            if holder.proc is not None:  # it ended (killed from outside): start another
                self._end(holder)
            read, write = os.pipe()
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) if self.python else (None, None)
            try:
                argv = self.sandbox.holder_argv(str(holder.job_dir), network=holder.key[1], info_fd=write,
                                                launcher=[self.python, SOURCE] if self.python else None)
                # Its stdin is the launcher's socket; the root parts see PATH only, never the job's environment.
                proc = subprocess.Popen(argv, env={"PATH": os.environ.get("PATH", os.defpath)}, pass_fds=[write],
                                        stdin=theirs.fileno() if theirs else subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
            except OSError as exc:
                os.close(read)
                if ours is not None:
                    ours.close()
                raise TaskSetupError(f"the job's shared sandbox did not start: {exc}") from None
            finally:
                os.close(write)
                if theirs is not None:
                    theirs.close()
            holder.proc = proc
            try:
                holder.pid = _child_pid(read, proc)
            finally:
                os.close(read)
            if self.running is not None:
                self.running.add(holder.job_dir.name, proc.pid)
            log_event("shared_sandbox_started", job_id=holder.key[0], pid=holder.pid)
            if ours is not None:
                holder.launcher = Launcher(ours, holder.key[0], pid_namespace(holder.pid))
                holder.launcher.wait_ready()
            return holder.pid

    def launch(self, holder: Holder, argv: list[str], env: dict[str, str], cwd: str,
               system: Callable[[str], None], cpus: frozenset[int] | None = None) -> Launched | None:
        """The element started by the job's launcher (on ``cpus``, where given); None when it has none (enter by
        nsenter). Raises OSError as exec would."""
        launcher = holder.launcher
        return launcher.spawn(argv, env, cwd, system, cpus) if launcher is not None else None

    def _reap_loop(self) -> None:
        while not self.closed.wait(min(1.0, self.linger_s)):
            now = time.monotonic()
            with self.lock:  # held throughout: a hold() of the same job waits for its directory's removal
                for holder in [h for h in self.holders.values() if h.users == 0 and now - h.last_used >= self.linger_s]:
                    del self.holders[holder.key]
                    with holder.lock:
                        self._end(holder)

    def _end(self, holder: Holder) -> None:
        """Kill the holder's sandbox (and with it whatever still runs in it); remove its directory."""
        proc, holder.proc, holder.pid = holder.proc, None, None
        launcher, holder.launcher = holder.launcher, None
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
            log_event("shared_sandbox_ended", job_id=holder.key[0])
        if launcher is not None:
            launcher.close()
        if self.running is not None:
            self.running.remove(holder.job_dir.name)
        if not self.keep_dirs and holder.users == 0:
            shutil.rmtree(holder.job_dir, ignore_errors=True)

    def close(self) -> None:
        """End every holder (the worker stops)."""
        self.closed.set()
        with self.lock:
            holders = list(self.holders.values())
            self.holders.clear()
        for holder in holders:
            with holder.lock:
                self._end(holder)
        self._starter.shutdown(wait=False)


def _child_pid(read: int, proc: subprocess.Popen) -> int:
    """The sandbox init's pid from bwrap's --info-fd, once the holder said ``ready`` (its mounts made)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    data = b""
    while b"}" not in data and time.monotonic() < deadline:
        chunk = os.read(read, 4096)
        if not chunk:
            break
        data += chunk
    assert proc.stdout is not None
    line = proc.stdout.readline() if b"}" in data else b""
    try:
        pid = int(json.loads(data[:data.index(b"}") + 1])["child-pid"])
    except (ValueError, KeyError, TypeError):
        pid = 0
    if line.strip() != b"ready" or pid <= 0:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        raise TaskSetupError(f"the job's shared sandbox did not start (bwrap exited {proc.returncode})")
    return pid
