"""The launcher inside a job's shared sandbox: it forks and execs each element the agent asks for (agent/sandbox/launcher.py).

It is the holder's command (agent/sandbox/shared.py): a Python process started once per job, inside the job's bwrap, as
the task user, after ``setpriv`` dropped root, so what it forks has exactly its uid, gid, groups, capabilities
and no-new-privileges, and sees the job's mounts and namespaces. It talks to the agent over a SOCK_SEQPACKET
unix socket on its stdin, one JSON message a packet:

- the agent: ``{"op": "run", "id": N, "argv": [...], "env": {...}, "cwd": "..."}`` with the element's stdout and
  stderr write ends (SCM_RIGHTS); ``{"op": "ack", "id": N}`` once it has read the element's pid;
- the launcher: ``{"ready": PID}`` with its own pidfd first (the agent watches it for the launcher's end), then
  per element ``{"id": N, "started": PID}`` with the element's pidfd (the agent reads the host pid from it),
  or ``{"id": N, "errno": E, "error": "..."}`` for a command that cannot start, and ``{"id": N, "exit": RC}``
  (Popen's returncode: negative for a death by signal) once it ended and the agent acknowledged its start.

Each element is its own session and process group (the agent signals the group by its host pid), with stdin
/dev/null and every other descriptor closed. The launcher reaps an element only after the ack, so its pid is
never reused before the agent has read it. It keeps the standard library only and is started with ``python -I
-S -c`` from its source: the agent's package may be where the task user cannot read.
"""

import array
import json
import os
import selectors
import socket
import subprocess
import sys

#: Largest message the agent sends (the element's argv and environment).
MAX_MESSAGE = 1 << 20


def send(sock: socket.socket, message: dict, fd: int | None = None) -> None:
    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))] if fd is not None else []
    sock.sendmsg([json.dumps(message).encode()], rights)


def receive(sock: socket.socket) -> tuple[dict | None, list[int]]:
    """One message and the descriptors it carried; (None, []) when the agent's end closed."""
    data, ancillary, _flags, _addr = sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(2 * 4))
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.extend(array.array("i", payload[: len(payload) - len(payload) % 4]))
    if not data:
        return None, fds
    try:
        message = json.loads(data)
    except ValueError:
        message = {}
    return message if isinstance(message, dict) else {}, fds


class Launcher:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.selector = selectors.DefaultSelector()
        self.selector.register(sock, selectors.EVENT_READ, None)
        self.children: dict[int, tuple[subprocess.Popen, int]] = {}  # id -> (process, pidfd)
        self.acked: set[int] = set()
        self.ended: set[int] = set()  # ended before their ack

    def run(self) -> None:
        me = os.pidfd_open(os.getpid())
        send(self.sock, {"ready": os.getpid()}, me)
        os.close(me)
        while True:
            for key, _events in self.selector.select():
                if key.data is None:
                    message, fds = receive(self.sock)
                    if message is None:
                        return
                    self.handle(message, fds)
                else:
                    self.selector.unregister(key.fd)
                    self.ended.add(key.data)
                    self.reap(key.data)

    def handle(self, message: dict, fds: list[int]) -> None:
        ident = message.get("id")
        if message.get("op") == "ack" and isinstance(ident, int):
            self.acked.add(ident)
            self.reap(ident)
        elif message.get("op") == "run" and isinstance(ident, int) and len(fds) == 2:
            self.start(ident, message, fds)
        for fd in fds:
            os.close(fd)

    def start(self, ident: int, message: dict, fds: list[int]) -> None:
        before = os.sched_getaffinity(0) if message.get("cpus") else None
        try:
            if before is not None:  # --pin-cpus: the element is born on its CPUs (one thread here)
                os.sched_setaffinity(0, message["cpus"])
            proc = subprocess.Popen(
                message["argv"],
                env=message["env"],
                cwd=message["cwd"],
                stdin=subprocess.DEVNULL,
                stdout=fds[0],
                stderr=fds[1],
                start_new_session=True,
            )
        except OSError as exc:
            send(self.sock, {"id": ident, "errno": exc.errno or 0, "error": exc.strerror or str(exc)})
            return
        except (KeyError, TypeError, ValueError) as exc:
            send(self.sock, {"id": ident, "errno": 22, "error": f"bad request: {exc}"})
            return
        finally:
            if before is not None:
                os.sched_setaffinity(0, before)
        pidfd = os.pidfd_open(proc.pid)
        self.children[ident] = (proc, pidfd)
        self.selector.register(pidfd, selectors.EVENT_READ, ident)
        send(self.sock, {"id": ident, "started": proc.pid}, pidfd)

    def reap(self, ident: int) -> None:
        """Wait for an element that ended and whose start the agent acknowledged; tell the agent its returncode."""
        if ident not in self.acked or ident not in self.ended or ident not in self.children:
            return
        proc, pidfd = self.children.pop(ident)
        self.acked.discard(ident)
        self.ended.discard(ident)
        os.close(pidfd)
        send(self.sock, {"id": ident, "exit": proc.wait()})


if __name__ == "__main__":
    Launcher(socket.socket(fileno=sys.stdin.fileno())).run()  # argv[1]: gpulayer-launcher, a name for ps
