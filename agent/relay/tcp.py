"""`tcp` streams: a TCP connection to a port in a running task's network view, its bytes through the relay
(`gpulayer port-forward`, and the control plane's ingress).

The OPEN names `port` (and `host`, a loopback address, 127.0.0.1 by default: gpulayer/protocol/forward.py).
The agent connects there as the task would: in the worker's network namespace, which the task shares, or,
for a job with `network: none` (bubblewrap's --unshare-net), in its sandbox's own namespace, entered with
setns(2) on a thread of its own (Python 3.11 has no os.setns); where the agent may not enter it (a non-root
agent lacks CAP_SYS_ADMIN in its own user namespace), a short helper under nsenter connects there and hands
the socket back (SCM_RIGHTS). Bytes the task's server sends are DATA; DATA towards it is written to the
socket; EOF either way is a half-close (shutdown(SHUT_WR) here). The stream ends with CLOSE once both ways
ended, with CLOSE `error` when the connect failed ("nothing listens on port 8888 in job 7 (task 12)") or the
connection broke, and the socket is dropped when the other end CLOSEs. Not a command kind: a worker started
with --no-exec serves it.

Each stream costs two threads (the stream's and its socket's pump) for as long as its connection lasts, and
the control plane's ingress opens one per HTTP request: at most `MAX_STREAMS` are open at once on a worker,
and one past it is CLOSEd at once with an `error` that says so (the ingress answers that request 502 and
tries another replica where it may), so a flood of requests can never cost the agent more than about
2 x MAX_STREAMS threads, nor slow its other streams (exec, shell) by them.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable

from gpulayer.protocol.control import Close, StreamOpen
from gpulayer.protocol.fields import to_wire
from gpulayer.relaylink.pipe import SocketPipe
from gpulayer.relaylink.streams import Stream
from gpulayer.protocol.forward import DEFAULT_HOST, tcp_target

from ..events import log_event
from ..run.supervision import TaskHandle
from ..sandbox.process import READ_BYTES
from .exec import _namespace, sandbox_init_pid

CONNECT_TIMEOUT_S = 10.0
#: `tcp` streams open at once on this worker (port-forward and ingress alike).
MAX_STREAMS = 256
_OPEN = threading.BoundedSemaphore(MAX_STREAMS)
CLONE_NEWNET = 0x40000000

#: Run under nsenter in the task's network namespace: connect, hand the socket (or the errno) back on fd argv[4].
_HELPER = """
import socket, sys
back = socket.socket(fileno=int(sys.argv[4]))
try:
    conn = socket.create_connection((sys.argv[1], int(sys.argv[2])), float(sys.argv[3]))
except OSError as exc:
    back.sendall(str(exc.errno or 0).encode())
else:
    socket.send_fds(back, [b"0"], [conn.fileno()])
"""


class ConnectRefused(Exception):
    """The connection could not be made (the message says why, for the client)."""


def serve(stream: Stream, opened: StreamOpen, find: Callable[[int], TaskHandle | None]) -> None:
    """Run an OPEN `tcp` stream to its end (on its own thread); refused at once past MAX_STREAMS."""
    if not _OPEN.acquire(blocking=False):
        log_event("tcp_refused", task_id=opened.task_id, error="too many tcp streams", session_id=opened.session_id)
        return stream.close(Close(error=f"this worker has {MAX_STREAMS} tcp streams open already (its cap); try again"))
    try:
        _serve(stream, opened, find)
    finally:
        _OPEN.release()


def _serve(stream: Stream, opened: StreamOpen, find: Callable[[int], TaskHandle | None]) -> None:
    task_id = opened.task_id
    try:
        host, port = tcp_target(to_wire(opened))
    except ValueError as exc:
        return stream.close(Close(error=f"tcp: {exc}"))
    handle = find(task_id) if isinstance(task_id, int) else None
    if handle is None:
        return stream.close(Close(error=f"task {task_id} is not running on this worker"))
    try:
        sock = connect(handle, host, port)
    except ConnectRefused as exc:
        log_event("tcp_refused", task_id=task_id, port=port, error=str(exc), session_id=opened.session_id)
        return stream.close(Close(error=str(exc)))
    sock.settimeout(None)
    log_event("tcp_connected", task_id=task_id, port=port, session_id=opened.session_id)
    try:
        SocketPipe(stream, sock, f"port {port} in task {task_id}", ends_stream=True, read_bytes=READ_BYTES).run()
    finally:
        sock.close()


def connect(handle: TaskHandle, host: str, port: int, timeout: float = CONNECT_TIMEOUT_S) -> socket.socket:
    """A socket connected to host:port as task `handle` sees the network; ConnectRefused with the reason."""
    runner, process = handle.runner, handle.process
    if runner is None or process is None or process.poll() is not None:
        raise ConnectRefused(f"task {handle.task_id} is not running on this worker now")
    pid = None
    if runner.assignment.network == "none":  # its own namespace: the sandbox's
        pid = sandbox_init_pid(handle)
        if pid is None:
            raise ConnectRefused(f"task {handle.task_id}'s sandbox is not there (it is ending)")
    where = (f"port {port}" + ("" if host == DEFAULT_HOST else f" of {host}")  # the job first: what its user knows
             + f" in job {runner.assignment.job_id} (task {handle.task_id})")
    try:
        return socket.create_connection((host, port), timeout) if pid is None else _connect_in(pid, host, port, timeout)
    except ConnectionRefusedError:
        raise ConnectRefused(f"nothing listens on {where}") from None
    except TimeoutError:
        raise ConnectRefused(f"connecting to {where} timed out after {timeout:g} s") from None
    except OSError as exc:
        raise ConnectRefused(f"cannot connect to {where}: {exc.strerror or exc}") from None


def _connect_in(pid: int, host: str, port: int, timeout: float) -> socket.socket:
    """Connect from inside `pid`'s network namespace: setns on a thread of its own, else a helper process."""
    found: dict = {}

    def enter() -> None:  # this thread alone moves, and it ends after the connect
        try:
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
            try:
                if _libc().setns(fd, CLONE_NEWNET) != 0:
                    code = ctypes.get_errno()
                    raise OSError(code, os.strerror(code))
            finally:
                os.close(fd)
        except OSError as exc:
            found["setns"] = exc
            return
        try:
            found["sock"] = socket.create_connection((host, port), timeout)
        except OSError as exc:
            found["error"] = exc

    thread = threading.Thread(target=enter, name=f"relay-tcp-netns-{pid}", daemon=True)
    thread.start()
    thread.join()
    if "sock" in found:
        return found["sock"]
    if "error" in found:
        raise found["error"]
    if found["setns"].errno != errno.EPERM:
        raise found["setns"]
    return _connect_by_helper(pid, host, port, timeout)


def _connect_by_helper(pid: int, host: str, port: int, timeout: float) -> socket.socket:
    """nsenter into `pid`'s network namespace (and its user namespace), connect there, get the socket back."""
    ours, theirs = socket.socketpair()
    with ours:
        spaces = ["-U", "--preserve-credentials"] if _namespace(pid, "user") != _namespace(os.getpid(), "user") else []
        argv = ["nsenter", "-t", str(pid), *spaces, "-n", "--", sys.executable, "-c", _HELPER, host, str(port), str(timeout), str(theirs.fileno())]
        with theirs:
            proc = subprocess.Popen(argv, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        ours.settimeout(timeout + 10)
        try:
            message, fds, _, _ = socket.recv_fds(ours, 64, 1)
        finally:
            _, err = proc.communicate(timeout=10)
    if fds:
        return socket.socket(fileno=fds[0])
    code = int(message) if message.isdigit() and int(message) > 0 else errno.EIO
    if code == errno.EIO:
        raise OSError(code, f"the agent could not enter the task's network: {err.decode(errors='replace').strip()[-200:]}")
    raise OSError(code, os.strerror(code))


_LIBC: list[ctypes.CDLL] = []


def _libc() -> ctypes.CDLL:
    if not _LIBC:
        _LIBC.append(ctypes.CDLL(None, use_errno=True))
    return _LIBC[0]
