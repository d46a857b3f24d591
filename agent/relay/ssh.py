"""`ssh` streams: one SSH connection per stream, served inside the task (`gpulayer ssh-proxy`, plain OpenSSH).

The agent starts agent/relay/ssh_server.py in the task's place as `exec` starts a command (exec.command_in:
the task's cwd, environment, user, sandbox and network namespace), under its own interpreter, with fd 0 one
end of a socket pair. On the other end it writes the header (the stream's host key and certificate from
the OPEN) and then copies bytes both ways between the socket and the stream: the SSH protocol itself is
end to end between the user's `ssh` and that server. The stream ends (CLOSE `exit_code` 0) when the server
exits: the client closed the connection, or the stream was closed and the socket with it.

An image job's task has the image as its root, where the agent's interpreter is not: there the server starts
outside, with descriptors of the task's namespaces and root, and joins them itself before it reads a byte of
SSH (the header's `enter`; exec.image_entry says where, as exec enters the task).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from gpulayer.protocol.control import Close, StreamOpen
from gpulayer.protocol.fields import to_wire
from gpulayer.protocol.relay import CLOSE, DATA, EOF, EXT_DATA, Frame
from gpulayer.relaylink.streams import Stream

from ..events import log_event
from ..run.supervision import TaskHandle
from ..cpusets import pinned
from .exec import ExecRefused, command_in, image_entry, kill_group, task_cpus

READ_BYTES = 64 * 1024
#: Seconds the server may take to end after its stream closed, before it is killed.
END_S = 5.0
#: The server's source, run with `python -c` as the launcher's is (agent/sandbox/launcher.py): the agent's own
#: install may not be visible in the task's place (the sandbox's fresh /tmp, hidden homes), and the server
#: imports nothing of ours, only asyncssh and the standard library.
SOURCE = (Path(__file__).parent / "ssh_server.py").read_text()


def available() -> bool:
    """Whether this agent can serve `ssh` streams (asyncssh is installed: the base install's dependency)."""
    return importlib.util.find_spec("asyncssh") is not None  # not imported here: the task's server imports it


def server_argv() -> list[str]:
    return [sys.executable, "-c", SOURCE]


def _image_server(handle: TaskHandle) -> tuple[list[str], dict[str, str], str, dict]:
    """The server of an image job's task, started outside it under the agent's interpreter, and what it needs
    to join the task's place itself before it reads a byte of SSH (agent/relay/ssh_server.py `enter`): descriptors
    of the task's namespaces and root (passed to it, opened here), the user to become, the task's environment
    and working directory. The image's root has no Python of ours; once inside, the server loads no more code."""
    place = image_entry(handle)
    opened: dict[str, int] = {}
    try:
        for name in place.namespaces:
            opened[name] = os.open(f"/proc/{place.pid}/ns/{name}", os.O_RDONLY)
        root = os.open(f"/proc/{place.pid}/root", os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        for fd in opened.values():
            os.close(fd)
        raise ExecRefused(f"task {handle.task_id}'s sandbox is not there (it is ending): {exc.strerror or exc}") from None
    user = place.user
    entry = {"namespaces": opened, "root": root, "uid": user.uid if user else None, "gid": user.gid if user else None,
             "cwd": place.cwd, "env": place.env}
    # HOME: asyncssh computes ~/.ssh (it reads nothing there as a server), and the image may have no passwd.
    return [sys.executable, "-I", "-c", SOURCE], {"PATH": os.defpath, "LANG": "C.UTF-8", "HOME": "/"}, "/", entry


def serve(stream: Stream, opened: StreamOpen, find: Callable[[int], TaskHandle | None]) -> None:
    """Run an OPEN `ssh` stream to its end (on its own thread)."""
    task_id, key, cert = opened.task_id, opened.host_key, opened.host_cert
    handle = find(task_id) if isinstance(task_id, int) else None
    if not isinstance(key, str) or not isinstance(cert, str):
        return stream.close(Close(error="ssh: the OPEN carries no host key and certificate (the control plane is older than this agent)"))
    if handle is None:
        return stream.close(Close(error=f"task {task_id} is not running on this worker"))
    ours, theirs = socket.socketpair()
    entry: dict = {}
    fds: list[int] = []  # the task's namespaces and root, for the image task's server
    try:
        if handle.runner is not None and handle.runner.image is not None:
            launch, env, cwd, entry = _image_server(handle)
            fds = [*entry["namespaces"].values(), entry["root"]]
        else:
            launch, env, cwd = command_in(handle, server_argv())
        with pinned(task_cpus(handle)):
            proc = subprocess.Popen(
                launch, env=env, cwd=cwd, stdin=theirs.fileno(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                start_new_session=True, pass_fds=fds,
            )
    except (ExecRefused, OSError) as exc:
        ours.close()
        return stream.close(Close(error=str(exc) if isinstance(exc, ExecRefused) else f"ssh: cannot start the task's SSH server: {exc}"))
    finally:
        theirs.close()
        for fd in fds:
            os.close(fd)
    log_event("ssh_started", task_id=task_id, pid=proc.pid, session_id=opened.session_id)
    header = json.dumps({"host_key": key, "host_cert": cert, **({"enter": entry} if entry else {})}).encode()
    errors: list[bytes] = []
    threads = [
        threading.Thread(target=_up, args=(ours, stream), daemon=True, name=f"ssh-out-{proc.pid}"),
        threading.Thread(target=_down, args=(stream, ours, proc), daemon=True, name=f"ssh-in-{proc.pid}"),
        threading.Thread(target=_stderr, args=(proc, errors), daemon=True, name=f"ssh-err-{proc.pid}"),
    ]
    try:
        ours.sendall(struct.pack(">I", len(header)) + header)
    except OSError:
        pass
    for thread in threads:
        thread.start()
    code = proc.wait()
    threads[0].join(END_S)
    threads[2].join(1.0)
    why = b"".join(errors).decode(errors="replace").strip()[-500:]
    log_event("ssh_finished", task_id=task_id, pid=proc.pid, exit_code=code, session_id=opened.session_id, stderr=why or None)
    if code != 0 and why:
        stream.close(Close(error=f"the task's SSH server failed: {why}"))
    else:
        stream.close(Close(exit_code=0, reason="the ssh connection ended"))
    stream.inbox.put(Frame(stream.id, CLOSE, to_wire(Close(reason="the ssh server ended"))))  # ends _down
    ours.close()


def _up(sock: socket.socket, stream: Stream) -> None:
    """What the server sends into the stream, within its credit."""
    stream.pour(sock.recv, READ_BYTES)


def _down(stream: Stream, sock: socket.socket, proc: subprocess.Popen) -> None:
    """The stream's frames into the server: DATA to its socket, EOF half-closes it, CLOSE ends it."""
    while True:
        frame = stream.recv()
        if frame is None:
            continue
        if frame.type in (DATA, EXT_DATA):
            try:
                sock.sendall(frame.data)
            except OSError:
                pass
            stream.consumed(len(frame.data))
        elif frame.type == EOF:
            _shutdown(sock, socket.SHUT_WR)
        elif frame.type == CLOSE:
            _shutdown(sock, socket.SHUT_RDWR)  # the server sees its connection lost, hangs up its sessions, exits
            if proc.poll() is None:
                threading.Timer(END_S, _kill, args=(proc,)).start()
            return


def _stderr(proc: subprocess.Popen, errors: list[bytes]) -> None:
    assert proc.stderr is not None
    for line in proc.stderr:
        errors.append(line)
        del errors[:-20]


def _shutdown(sock: socket.socket, how: int) -> None:
    try:
        sock.shutdown(how)
    except OSError:
        pass


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        kill_group(proc, signal.SIGKILL)
