"""The agent's end of a job's launcher: elements forked inside the job's shared sandbox, not entered by nsenter.

Entering the job's sandbox costs an element three execs (``nsenter``, ``setpriv``, ``env``: 7.5 ms over a bare
``true``, docs/benchmarks/issue-25.md, "Arrays: one sandbox per job"). The launcher (agent/sandbox/launcher_inside.py) is the holder's own command,
already inside and already the task user: the agent sends it the element's argv, environment and working dir
with the write ends of two pipes, and it forks and execs the command as its own process group. The agent reads
the element's host pid from the pidfd that comes back (checked to be in the job's PID namespace), signals its
group as it signals any task's, reads its output from the pipes, and learns its exit status from the launcher.

If the launcher ends (killed from inside the sandbox, or by anyone), the agent kills the groups of the elements
it started, which end as a SIGKILL would end them, each with a system line saying why, and the job's next
elements are entered by nsenter as before (agent/sandbox/shared.py).
"""

from __future__ import annotations

import array
import itertools
import json
import os
import select
import selectors
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

from ..events import log_event

#: Seconds the job's first element waits for the launcher to be ready (a Python start-up, once per job); elements
#: that come before it are entered by nsenter.
READY_TIMEOUT_S = 2.0
#: Seconds the launcher may take to answer a request, or to report an element that exited, before it is killed.
ANSWER_TIMEOUT_S = 5.0
#: Seconds between looks at an element's pidfd while its exit is waited for.
WAIT_STEP_S = 0.5
#: Largest message to the launcher (argv and environment); a bigger element is entered by nsenter.
MAX_MESSAGE = 1 << 20
#: The program, passed to ``python -I -S -c``.
SOURCE = (Path(__file__).parent / "launcher_inside.py").read_text()


def host_pid(pidfd: int) -> int | None:
    """The pid, as this agent sees it, of the process a pidfd refers to (None once it was reaped)."""
    try:
        with open(f"/proc/self/fdinfo/{pidfd}") as handle:
            for line in handle:
                if line.startswith("Pid:"):
                    pid = int(line.split()[1])
                    return pid if pid > 0 else None
    except (OSError, ValueError, IndexError):
        pass
    return None


def pid_namespace(pid: int) -> int | None:
    """The inode of ``pid``'s PID namespace (None without it)."""
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


class Launched:
    """An element the launcher started, read as the subprocess.Popen that TaskProcess and supervise use."""

    def __init__(self, ident: int, argv: list[str], stdout: int, stderr: int, launcher: Launcher, system: Callable[[str], None]):
        #: The element's pidfd (from the launcher): its exit is seen even when the launcher does not say it.
        self.pidfd: int | None = None
        self.ident, self.args, self.launcher, self.system = ident, argv, launcher, system
        self.stdout, self.stderr = open(stdout, "rb", buffering=0), open(stderr, "rb", buffering=0)
        self.pid = 0
        self.exited_at: float | None = None
        self.returncode: int | None = None
        self.error: OSError | None = None
        self.answered = threading.Event()
        self.ended = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The returncode the launcher reported; a launcher that has not ANSWER_TIMEOUT_S after the element's
        exit (stopped by an element of the job, say) is killed, and the element reads as killed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.ended.wait(WAIT_STEP_S if deadline is None else max(0.0, min(WAIT_STEP_S, deadline - time.monotonic()))):
            if self.pidfd is not None and select.select([self.pidfd], [], [], 0)[0]:
                self.exited_at = self.exited_at or time.monotonic()
                if time.monotonic() - self.exited_at > ANSWER_TIMEOUT_S:
                    self.launcher.kill("it did not report an element's exit")
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None
        self._close_pidfd()
        return self.returncode

    def _close_pidfd(self) -> None:
        pidfd, self.pidfd = self.pidfd, None
        if pidfd is not None:
            os.close(pidfd)

    def __del__(self) -> None:
        self._close_pidfd()

    def close_pipes(self) -> None:
        self.stdout.close()
        self.stderr.close()


class Launcher:
    """One job's launcher, seen from the agent: requests out, answers read by one thread."""

    def __init__(self, sock: socket.socket, job_id: int, namespace: int | None):
        self.sock, self.job_id, self.namespace = sock, job_id, namespace
        self.lock = threading.Lock()
        self.elements: dict[int, Launched] = {}
        self.ids = itertools.count(1)
        self.alive = False
        self.ready = threading.Event()
        self.pidfd: int | None = None
        self.closing = False
        self.reader = threading.Thread(target=self._read, name=f"launcher-{job_id}", daemon=True)
        self.reader.start()

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> bool:
        """Whether the launcher said it is ready within ``timeout_s`` (else the job's elements use nsenter)."""
        if not self.ready.wait(timeout_s):
            log_event("launcher_unavailable", job_id=self.job_id, reason="no answer")
        return self.alive

    def spawn(self, argv: list[str], env: dict[str, str], cwd: str, system: Callable[[str], None],
              cpus: frozenset[int] | None = None) -> Launched | None:
        """Start ``argv`` in the job's sandbox (its process on ``cpus``, where given); None when the launcher
        cannot take it (nsenter then).

        Raises OSError as exec would for a command that cannot start (or when the launcher ended meanwhile).
        """
        if not self.alive:
            return None
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        element = Launched(next(self.ids), argv, out_r, err_r, self, system)
        message = json.dumps({"op": "run", "id": element.ident, "argv": argv, "env": env, "cwd": cwd,
                              **({"cpus": sorted(cpus)} if cpus else {})}).encode()
        try:
            with self.lock:
                if not self.alive or len(message) > MAX_MESSAGE:
                    element.close_pipes()
                    return None
                self.elements[element.ident] = element
                try:
                    self.sock.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [out_w, err_w]))])
                except OSError:
                    del self.elements[element.ident]
                    element.close_pipes()
                    return None
        finally:
            os.close(out_w)
            os.close(err_w)
        if not element.answered.wait(ANSWER_TIMEOUT_S):
            self.kill("it did not answer a request")
            element.answered.wait(ANSWER_TIMEOUT_S)
        if element.error is not None or not element.answered.is_set():
            element.close_pipes()
            raise element.error or OSError(5, "the job's launcher did not answer")
            element.close_pipes()
            raise element.error
        return element

    def _send(self, message: dict) -> None:
        with self.lock:
            self.sock.sendmsg([json.dumps(message).encode()])

    def _read(self) -> None:
        """Answers until the launcher ends (its pidfd) or says something this agent cannot read."""
        selector = selectors.DefaultSelector()
        selector.register(self.sock, selectors.EVENT_READ, "socket")
        why = "its socket closed"
        try:
            while True:
                events = selector.select()
                if any(key.data == "pidfd" for key, _ in events):
                    self.sock.setblocking(False)
                    while self._answer():  # what it said before it ended
                        pass
                    why = "it ended"
                    return
                if not self._answer():
                    return
                if self.pidfd is not None and not any(k.data == "pidfd" for k in selector.get_map().values()):
                    selector.register(self.pidfd, selectors.EVENT_READ, "pidfd")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            why = f"{type(exc).__name__}: {exc}"
        finally:
            selector.close()
            self._lost(why)

    def _answer(self) -> bool:
        """Read and act on one answer; False at the socket's end (or nothing more to read, non-blocking)."""
        try:
            data, ancillary, _flags, _addr = self.sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(4))
        except BlockingIOError:
            return False
        fds = [
            fd
            for level, kind, payload in ancillary
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
            for fd in array.array("i", payload[: len(payload) - len(payload) % 4])
        ]
        if not data:
            for fd in fds:
                os.close(fd)
            return False
        message = json.loads(data)
        if "ready" in message:
            self._ready(fds)
            return True
        pid = host_pid(fds[0]) if fds else None
        element = self.elements.get(int(message["id"]))
        if element is not None and "started" in message and pid is not None and element.pidfd is None:
            element.pidfd = fds.pop(0)
        for fd in fds:
            os.close(fd)
        if element is None:
            return True
        if "started" in message:
            if pid is None or pid_namespace(pid) != self.namespace:  # not an element of this job's sandbox
                raise ValueError(f"element {element.ident}: a pid outside the job's sandbox")
            element.pid = pid
            element.answered.set()
            self._send({"op": "ack", "id": element.ident})
        elif "errno" in message:
            element.error = OSError(int(message["errno"]), str(message.get("error")))
            del self.elements[element.ident]
            element.answered.set()
        elif "exit" in message:
            del self.elements[element.ident]
            element.returncode = int(message["exit"])
            element.ended.set()
        return True

    def _ready(self, fds: list[int]) -> None:
        pid = host_pid(fds[0]) if fds else None
        if pid is not None and pid_namespace(pid) == self.namespace and self.pidfd is None:
            self.pidfd, fds = fds[0], fds[1:]
            self.alive = True
            log_event("launcher_ready", job_id=self.job_id, pid=pid)
        for fd in fds:
            os.close(fd)
        self.ready.set()

    def _lost(self, why: str) -> None:
        """The launcher ended: its elements' groups are killed and end as killed; later elements use nsenter."""
        with self.lock:
            self.alive = False
            elements, self.elements = list(self.elements.values()), {}
        if not self.closing:
            log_event("launcher_ended", job_id=self.job_id, reason=why, elements=len(elements))
        for element in elements:
            if not element.answered.is_set():
                element.error = OSError(5, "the job's launcher ended before it started the command")
                element.answered.set()
                continue
            element.system(f"the job's launcher ended ({why}): killing the element's process group")
            try:
                os.killpg(element.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            element.returncode = -signal.SIGKILL
            element.ended.set()
        self.ready.set()

    def kill(self, why: str) -> None:
        """End a launcher that stopped answering (its elements are then killed, and later ones use nsenter)."""
        log_event("launcher_killed", job_id=self.job_id, reason=why)
        with self.lock:
            self.alive = False
            if self.pidfd is not None:
                try:
                    signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def close(self) -> None:
        """Stop listening (the holder is ending: the launcher and its elements go with its namespace)."""
        self.closing = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.reader.join(2.0)
        self.sock.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None
