"""Sandboxes made ahead for plain tasks: a task's bubblewrap start off its launch's path.

A plain task (no GPU, no image, not a gang, one of its own: not an array element, which shares its job's
sandbox, agent/sandbox/shared.py) gets a sandbox of its own, and making one (bwrap's clone into new namespaces, its
mounts, ``setpriv``) is most of the time between a short task's assignment and its exit (about 7 of 10 ms on an
idle 2-core machine, more under load: docs/benchmarks/issue-25.md, "Plain tasks: sandboxes made ahead"). So a worker keeps a *spare*
per free slot, made while other tasks run: the same ``env --ignore-signal bwrap [mounts] -- setpriv`` as a
task's, binding an empty box (``tasks/box-<n>/``, under which the task's working dir is made), whose command is
a few lines of ``bash`` as the task user that wait on their stdin. A task that takes one writes its argv (the
inner ``env -i`` with the task's environment, working dir and default signals, then the command) to the box
(``.argv``, NUL-separated) and a line to the stdin; bash reads them and runs the command as its child, in the
same process group the agent signals, with the write end of a status pipe closed for it, and writes the
command's exit status (a death by signal N as 128 + N, as bwrap gives it) there once it ended. Nothing else
changes: the same mounts, namespaces, user and capabilities as a task's own bwrap, one task a sandbox, and the
sandbox ends with its command (bwrap's init then ends the namespace and what is left in it), seen on the init's
pidfd as for any sandboxed task (agent/sandbox/process.py).

A spare is made only once a plain task asked for one (an idle worker keeps none until then), at most one per
slot and kind (with or without network); its box and process group are recorded with the running tasks
(``box-<n>``) for the next agent to reap if this one is killed; ``--die-with-parent`` ties it to the one thread
that makes them. A spare that cannot be made (no bash, bwrap failed) turns them off for this worker: tasks get
their own bwrap, as before.
"""

from __future__ import annotations

import itertools
import os
import select
import shutil
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..events import log_event
from .bwrap import PASSED_SIGNALS, Sandbox
from .leftovers import RunningTasks
from .process import live_group_members, sandbox_init_pidfd

#: Seconds a spare may wait unused before the next take ends it (a worker whose plain tasks stopped coming).
IDLE_S = 300.0
#: The file in a box that holds the task's argv.
ARGV_FILE = ".argv"


@dataclass
class Spare:
    """One sandbox made ahead, not yet used (``taken``: handed to a task)."""

    box: Path
    network: bool
    proc: subprocess.Popen
    #: The read end of the status pipe: the command's exit status, as text, once it ended.
    status: int
    #: The sandbox init's pidfd (handed to the task's TaskProcess, which closes it).
    init_pidfd: int | None
    made: float = field(default_factory=time.monotonic)
    taken: bool = False
    #: Held while the status pipe is read, and while it is closed (-1 then: the spare ended).
    lock: threading.Lock = field(default_factory=threading.Lock)


class MadeAhead:
    """The command a task runs in a spare, read as the subprocess.Popen that TaskProcess and supervise use: its
    group is the spare's (bwrap leads it), its output the spare's pipes, its returncode what bash reported."""

    def __init__(self, spare: Spare, argv: list[str]):
        self.spare, self.args = spare, argv
        self.pid = spare.proc.pid
        self.stdout, self.stderr = spare.proc.stdout, spare.proc.stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._status(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and not self._status(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def _status(self, timeout: float | None) -> bool:
        """Whether the status came within ``timeout``: bash's number, or, when bash died without writing it (a
        SIGKILL of the group), bwrap's own exit."""
        with self.spare.lock:  # the spare's end closes the pipe: never read a descriptor number reused since
            if self.spare.status >= 0:
                if not select.select([self.spare.status], [], [], timeout)[0]:
                    return False
                data = os.read(self.spare.status, 64).strip()
            else:
                data = b""
        self.returncode = int(data) if data.isdigit() else self.spare.proc.wait()
        return True


class Spares:
    """The spares of one worker, by network (with, without)."""

    def __init__(self, sandbox: Sandbox, tasks_dir: Path, running: RunningTasks | None, *, most: int,
                 keep_dirs: bool = False, idle_s: float = IDLE_S):
        self.sandbox, self.tasks_dir, self.running = sandbox, tasks_dir, running
        self.most, self.keep_dirs, self.idle_s = max(1, most), keep_dirs, idle_s
        self.bash = shutil.which("bash")
        self.ready: dict[bool, list[Spare]] = {True: [], False: []}
        self.making: dict[bool, int] = {True: 0, False: 0}
        self.lock = threading.Lock()
        self.closed = False
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None
        #: Set when a spare could not be made: tasks get their own bwrap from then on.
        self.off = self.bash is None
        self.numbers = itertools.count(1)
        #: bwrap's --die-with-parent is the death of the thread that started it: one long-lived maker thread.
        self._maker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spare-sandbox-make")
        self._ender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spare-sandbox-end")

    def take(self, network: bool) -> Spare | None:
        """A spare for a task (None when none is ready: the task makes its own), and another made behind it."""
        dead: list[Spare] = []
        spare = None
        with self.lock:
            if self.off or self.closed:
                return None
            ready = self.ready[network]
            while ready and spare is None:  # one left unused too long is the reaper's (_reap_loop)
                candidate = ready.pop()
                if candidate.proc.poll() is None:
                    spare = candidate
                else:
                    dead.append(candidate)
            if len(ready) + self.making[network] < self.most:
                self.making[network] += 1
                self._maker.submit(self._make, network)
            if self._reaper is None:
                self._reaper = threading.Thread(target=self._reap_loop, name="spare-sandboxes", daemon=True)
                self._reaper.start()
        for old in dead:
            self.done(old)
        if spare is not None:
            spare.taken = True
        return spare

    def start(self, spare: Spare, argv: list[str], env: dict[str, str], workdir: str,
              cpus: frozenset[int] | None = None) -> MadeAhead:
        """Run ``argv`` in the spare as the task: its environment (the loader's variables too: they reach only
        the command), working dir and default signals set by the inner ``env``; on ``cpus`` where given (the
        spare's processes, all waiting, are moved there before bash forks it). Raises OSError as exec would."""
        inner = [self.sandbox.env, "-i", f"--default-signal={PASSED_SIGNALS}", f"--chdir={workdir}", "--",
                 *(f"{name}={value}" for name, value in env.items()), *argv]
        if any("\0" in part for part in inner):
            raise OSError(22, "an argument or environment value holds a NUL byte")
        path = spare.box / ARGV_FILE
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, b"".join(part.encode(errors="surrogateescape") + b"\0" for part in inner))
            user = self.sandbox.drops_to(False)
            if user is not None:
                os.fchown(fd, user.uid, user.gid)
        finally:
            os.close(fd)
        if cpus:
            _pin_group(spare.proc.pid, cpus)
        assert spare.proc.stdin is not None
        try:
            spare.proc.stdin.write(b"go\n")
            spare.proc.stdin.close()
        except OSError as exc:  # the spare ended meanwhile
            raise OSError(exc.errno or 5, f"the sandbox made ahead ended: {exc}") from None
        return MadeAhead(spare, argv)

    def done(self, spare: Spare) -> None:
        """End a spare (its task ended, or it was not used) and remove its box, off the caller's path."""
        try:
            self._ender.submit(self._end, spare)
        except RuntimeError:  # the worker closed its spares: here, then
            self._end(spare)

    def _make(self, network: bool) -> None:
        spare = None
        try:
            spare = self._made(network)
        except OSError as exc:
            self._turn_off(f"{exc}")
        finally:
            with self.lock:
                self.making[network] -= 1
                if spare is not None and not self.closed:
                    self.ready[network].append(spare)
                    spare = None
        if spare is not None:  # closed meanwhile
            self._end(spare)

    def _made(self, network: bool) -> Spare | None:
        box = self.tasks_dir / f"box-{os.getpid()}-{next(self.numbers)}"
        box.mkdir(parents=True, exist_ok=True)
        info_read, info_write = os.pipe()
        status_read, status_write = os.pipe()
        assert self.bash is not None
        argv = self.sandbox.spare_argv(str(box), bash=self.bash, network=network, info_fd=info_write,
                                       status_fd=status_write, argv_file=str(box / ARGV_FILE))
        try:
            proc = subprocess.Popen(argv, env={"PATH": os.environ.get("PATH", os.defpath)},
                                    pass_fds=[info_write, status_write], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except OSError:
            for fd in (info_read, status_read):
                os.close(fd)
            shutil.rmtree(box, ignore_errors=True)
            raise
        finally:
            os.close(info_write)
            os.close(status_write)
        spare = Spare(box, network, proc, status_read, sandbox_init_pidfd(info_read, proc.pid))
        if spare.init_pidfd is None:
            self._end(spare)
            raise OSError(5, f"bwrap did not start (exit {proc.poll()})")
        if self.running is not None:
            self.running.add(box.name, proc.pid)
        return spare

    def _reap_loop(self) -> None:
        """End the spares left unused for ``idle_s`` (a worker whose plain tasks stopped coming)."""
        while not self._stop.wait(min(30.0, self.idle_s)):
            now = time.monotonic()
            with self.lock:
                stale = [spare for kind in self.ready.values() for spare in kind if now - spare.made > self.idle_s]
                for kind in self.ready.values():
                    kind[:] = [spare for spare in kind if spare not in stale]
            for spare in stale:
                self.done(spare)

    def _turn_off(self, why: str) -> None:
        with self.lock:
            if self.off:
                return
            self.off = True
        log_event("spare_sandboxes_off", reason=why)

    def _end(self, spare: Spare) -> None:
        proc = spare.proc
        if proc.stdin is not None and not proc.stdin.closed:
            try:
                proc.stdin.close()  # an unused spare's bash reads end-of-file and exits
            except OSError:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # and whatever is still in it
        except ProcessLookupError:
            pass
        proc.wait()
        if not spare.taken:  # a task's own reader closes them at their end
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        # The init's pidfd is the task's process's once its command started there (set to None then).
        pidfd, spare.init_pidfd = spare.init_pidfd, None
        if pidfd is not None:
            os.close(pidfd)
        with spare.lock:  # after the kill: a reader waiting on the pipe has had its end-of-file
            status, spare.status = spare.status, -1
        if status >= 0:
            os.close(status)
        if self.running is not None:
            self.running.remove(spare.box.name)
        if not self.keep_dirs:
            shutil.rmtree(spare.box, ignore_errors=True)

    def close(self) -> None:
        """End every spare not taken (the worker stops); taken ones end with their tasks."""
        self._stop.set()
        with self.lock:
            self.closed = True
            spares = [spare for kind in self.ready.values() for spare in kind]
            for kind in self.ready.values():
                kind.clear()
        for spare in spares:
            self._end(spare)
        self._maker.shutdown(wait=False)
        self._ender.shutdown(wait=True)


def _pin_group(pgid: int, cpus: frozenset[int]) -> None:
    """Move every process of a spare's group (bwrap, its init, the waiting bash) onto ``cpus``."""
    for pid in live_group_members(pgid) or []:
        try:
            os.sched_setaffinity(pid, cpus)
        except OSError:  # it ended meanwhile
            pass
