"""The SSH server of one `ssh` relay stream, run inside the task (docs/access.md, "SSH").

agent/relay/ssh.py starts it in the task's place as it starts an `exec` command (the task's cwd, environment,
user, sandbox and network namespace) with fd 0 one end of a socket pair whose other end is bridged to the
stream. It reads a header there first (a u32 length, then JSON: `host_key`, the stream's ephemeral OpenSSH
private key, and `host_cert`, its certificate from the control plane's host CA), then speaks SSH on the rest
with asyncssh, for this one connection, and exits when it ends.

What it serves: shell and exec sessions (a PTY when asked: window changes, signals, exit status or exit
signal), the sftp subsystem (asyncssh's SFTP server: paths as the task sees them, relative to its working
directory), scp's legacy `scp -t/-f` (asyncssh's), and direct-tcpip (`ssh -L`, VS Code) to loopback ports in
the task's network view. No authentication: the relay checked the caller's token and rights before the
stream existed, and this server has no listening socket, only this stream (docs/security.md, "SSH").
Imports only the standard library and asyncssh: it runs under the agent's interpreter inside the sandbox.

An image job's task has the image as its root, without that interpreter. There the agent starts this server
outside the task, and the header says how to join it (`enter`): descriptors of the task's namespaces and
root, the user to become, the task's environment and working directory. Before it reads a byte of SSH, the
server imports all it will need, joins the namespaces, takes the task's root as its own, drops to the
task's user with no capabilities and no new privileges, and forgets its import path: from then on it is a
process of the task, which sees the image's files only (SFTP's paths and symlinks are resolved by the
kernel there) and loads no code from them.
"""

from __future__ import annotations

import asyncio
import ctypes
import fcntl
import importlib
import json
import os
import platform
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading

import asyncssh

HEADER = struct.Struct(">I")
MAX_HEADER = 1024 * 1024
#: The loopback names a forward may go to, and the address each is (resolved here: an image may have no
#: /etc/hosts, and no resolver configuration of its own).
LOOPBACK = {"localhost": "127.0.0.1", "127.0.0.1": "127.0.0.1", "::1": "::1", "ip6-localhost": "::1"}
#: setns(2)'s namespace types, and the order they are joined in (the user namespace first: it grants the rest).
CLONE = {"user": 0x10000000, "ipc": 0x08000000, "net": 0x40000000, "pid": 0x20000000, "mnt": 0x00020000}
#: capset(2), which Python does not wrap, per machine.
SYS_CAPSET = {"x86_64": 126, "aarch64": 91}
CAP_VERSION_3 = 0x20080522
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
#: What an image task's server imports before it enters: nothing is imported once its root is the image's.
PRELOAD = ("asyncio.subprocess", "asyncio.unix_events", "concurrent.futures.thread", "encodings.idna", "grp", "pwd",
           "asyncssh.sftp", "asyncssh.scp", "asyncssh.forward")
READ_BYTES = 64 * 1024
#: Seconds a finished command's output may take to drain (a grandchild holding its pipes open).
DRAIN_S = 5.0


def read_header(sock: socket.socket) -> dict:
    """The JSON header before the SSH bytes."""

    def exactly(size: int) -> bytes:
        got = bytearray()
        while len(got) < size:
            chunk = sock.recv(size - len(got))
            if not chunk:
                raise EOFError("the stream ended before the header")
            got += chunk
        return bytes(got)

    (size,) = HEADER.unpack(exactly(HEADER.size))
    if size > MAX_HEADER:
        raise ValueError(f"a header of {size} bytes")
    return json.loads(exactly(size))


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def enter(spec: dict) -> dict[str, str]:
    """Join an image task's place (module docstring) and become a process of its user there; the task's
    environment. Raises OSError (or RuntimeError) when it cannot: the caller exits, the agent says why."""
    for name in PRELOAD:
        importlib.import_module(name)
    libc = ctypes.CDLL(None, use_errno=True)
    if threading.active_count() != 1:  # setns(2) of a user or mount namespace needs a single thread
        raise RuntimeError("the server has threads before it entered the task")

    def check(result: int, what: str) -> None:
        if result != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"{what}: {os.strerror(code)}")

    spaces = {str(name): int(fd) for name, fd in spec["namespaces"].items()}
    for name in sorted(spaces, key=list(CLONE).index):
        check(libc.setns(spaces[name], CLONE[name]), f"cannot join the task's {name} namespace")
        os.close(spaces[name])
    os.fchdir(int(spec["root"]))
    os.chroot(".")  # the task's root (the image's), as nsenter --root does
    os.close(int(spec["root"]))
    for cap in range(64):  # the bounding set, so that no execve (as root) gets a capability back
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break
    if spec.get("uid") is not None:
        os.setgroups([])
        os.setresgid(spec["gid"], spec["gid"], spec["gid"])
        os.setresuid(spec["uid"], spec["uid"], spec["uid"])
    number = SYS_CAPSET.get(platform.machine())
    if number is None:
        raise RuntimeError(f"no capset for machine {platform.machine()}")
    header, data = _CapHeader(CAP_VERSION_3, 0), (_CapData * 2)()
    check(libc.syscall(number, ctypes.byref(header), ctypes.byref(data)), "cannot drop capabilities")
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "cannot set no_new_privs")
    os.chdir(str(spec["cwd"]))
    sys.path[:] = []  # the image's files are never imported
    sys.path_importer_cache.clear()
    return {str(key): str(value) for key, value in spec["env"].items()}


def login_shell(env: dict[str, str]) -> str:
    """$SHELL when it is a real shell, else bash, else sh (the task user's passwd shell may be nologin)."""
    for shell in (env.get("SHELL"), "/bin/bash", "/bin/sh"):
        if shell and os.path.isabs(shell) and os.access(shell, os.X_OK) and not shell.endswith(("nologin", "false")):
            return shell
    return "/bin/sh"


def _set_size(fd: int, cols: int, rows: int) -> None:
    if cols > 0 and rows > 0:
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _own_tty() -> None:  # in the child, after setsid: the PTY on fd 0 becomes its controlling terminal
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Sessions:
    """The process groups this connection started, signalled (HUP) when it ends."""

    def __init__(self) -> None:
        self.groups: set[int] = set()

    def hangup(self) -> None:
        for pgid in list(self.groups):
            try:
                os.killpg(pgid, signal.SIGHUP)
            except (ProcessLookupError, PermissionError):
                pass


async def _pump(reader: asyncio.StreamReader, write, drain) -> None:
    """A command's output into the channel, as fast as the channel takes it."""
    while True:
        try:
            data = await reader.read(READ_BYTES)
        except OSError:  # EIO: the PTY's last holder closed it
            return
        if not data:
            return
        write(data)
        await drain()


async def _drained(reader: asyncio.StreamReader, limit: float) -> None:
    """Wait until nothing more comes from the PTY for a moment (at most `limit` seconds)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    quiet = 0
    while loop.time() < deadline and quiet < 3:
        before = getattr(reader, "_buffer", b"")
        size = len(before)
        await asyncio.sleep(0.02)
        quiet = quiet + 1 if size == 0 and len(getattr(reader, "_buffer", b"")) == 0 else 0


def _signal_of(name: str) -> int | None:
    sig = getattr(signal, f"SIG{name}", None)
    return int(sig) if sig is not None else None


async def _feed(process: asyncssh.SSHServerProcess, proc, write, close, drain, master: int | None) -> None:
    """The channel's input into the command: data, EOF, window changes, signals."""
    while True:
        try:
            data = await process.stdin.read(READ_BYTES)
        except asyncssh.TerminalSizeChanged as exc:
            if master is not None:
                _set_size(master, exc.width, exc.height)
            continue
        except asyncssh.SignalReceived as exc:
            sig = _signal_of(exc.signal)
            if sig is not None and proc.returncode is None:
                try:
                    os.killpg(proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            continue
        except asyncssh.BreakReceived:
            continue
        except (asyncssh.Error, OSError):
            return
        if not data:
            if master is None:
                close()
            return
        try:
            write(data)
            await drain()
        except (OSError, ConnectionError):
            return


async def run_session(process: asyncssh.SSHServerProcess, sessions: Sessions, base: dict[str, str]) -> None:
    """One session channel: its command (or the shell) with pipes, or on a PTY when the client asked for one."""
    loop = asyncio.get_running_loop()
    if process.subsystem:
        process.stderr.write(f"gpulayer: no subsystem {process.subsystem!r} here (sftp is)\n".encode())
        process.exit(1)
        return
    shell = login_shell(base)
    command = process.command
    argv = [shell, "-c", command] if command is not None else [shell]
    env = dict(base)
    for key, value in (process.env or {}).items():
        key = key.decode() if isinstance(key, bytes) else key
        value = value.decode(errors="replace") if isinstance(value, bytes) else value
        if key.startswith("LC_") or key in ("LANG", "TZ", "COLORTERM"):
            env[key] = value
    env.setdefault("SHELL", shell)
    term = process.term_type
    master = None
    tasks = []
    try:
        if term:
            master, slave = os.openpty()
            cols, rows = process.term_size[:2]
            _set_size(master, cols, rows)
            env["TERM"] = term
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True, preexec_fn=_own_tty
            )
            # The slave stays open here until the output is drained: Linux may answer a master's read with EIO
            # once the last slave fd closes, before the command's last words were read (they would be lost).
            out = asyncio.StreamReader(limit=READ_BYTES)
            await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(out), os.fdopen(master, "rb", buffering=0, closefd=False))
            wtransport, wprotocol = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(os.dup(master), "wb", buffering=0))
            writer = asyncio.StreamWriter(wtransport, wprotocol, None, loop)
            sessions.groups.add(proc.pid)
            tasks.append(loop.create_task(_pump(out, process.stdout.write, process.stdout.drain)))
            feeder = loop.create_task(_feed(process, proc, writer.write, lambda: None, writer.drain, master))
        else:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True
            )
            sessions.groups.add(proc.pid)
            assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
            tasks.append(loop.create_task(_pump(proc.stdout, process.stdout.write, process.stdout.drain)))
            tasks.append(loop.create_task(_pump(proc.stderr, process.stderr.write, process.stderr.drain)))
            stdin = proc.stdin
            feeder = loop.create_task(_feed(process, proc, stdin.write, stdin.close, stdin.drain, None))
    except OSError as exc:
        process.stderr.write(f"gpulayer: cannot run {shell}: {exc.strerror or exc}\n".encode())
        process.exit(127 if isinstance(exc, FileNotFoundError) else 126)
        return
    try:
        code = await proc.wait()
        if master is not None:
            await _drained(out, DRAIN_S)
            os.close(slave)  # the PTY ends (EIO to the pump) once what the command wrote was read
        await asyncio.wait(tasks, timeout=DRAIN_S)
    finally:
        sessions.groups.discard(proc.pid)
        feeder.cancel()
        for task in tasks:
            task.cancel()
        if master is not None:
            os.close(master)
    if code < 0:
        name = signal.Signals(-code).name.removeprefix("SIG")
        process.exit_with_signal(name, False, f"killed by signal {name}")
    else:
        process.exit(code)


class SFTPServer(asyncssh.SFTPServer):
    """asyncssh's SFTP server, paths as the task sees them; its session ends with exit status 0 (as OpenSSH's
    does: scp and sftp report a session closed without one as a failure)."""

    def exit(self) -> None:
        try:
            self.channel.exit(0)
        except Exception:  # the channel is gone already
            pass


class Server(asyncssh.SSHServer):
    def __init__(self, ended: asyncio.Event):
        self.ended = ended
        self.conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self.conn = conn

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended.set()

    def begin_auth(self, username: str) -> bool:
        return False  # no authentication: the relay did it (module docstring)

    def connection_requested(self, dest_host: str, dest_port: int, orig_host: str, orig_port: int):
        address = LOOPBACK.get(dest_host.lower())
        if address is None:
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED, f"gpulayer forwards to loopback ports of the task only, not to {dest_host}"
            )
        assert self.conn is not None
        return self.conn.forward_connection(address, dest_port)

    def server_requested(self, listen_host: str, listen_port: int) -> bool:
        return False  # no remote forwarding (ssh -R)


async def serve(sock: socket.socket, host_key: str, host_cert: str, base: dict[str, str]) -> None:
    ended = asyncio.Event()
    sessions = Sessions()
    key = asyncssh.import_private_key(host_key)
    cert = asyncssh.import_certificate(host_cert)

    async def session(process: asyncssh.SSHServerProcess) -> None:
        await run_session(process, sessions, base)

    conn = await asyncssh.run_server(
        sock,
        server_factory=lambda: Server(ended),
        server_host_keys=[(key, cert)],
        process_factory=session,
        sftp_factory=SFTPServer,
        allow_scp=True,
        line_editor=False,
        encoding=None,
        agent_forwarding=False,
        x11_forwarding=False,
        keepalive_interval=0,
    )
    try:
        await ended.wait()
    finally:
        sessions.hangup()
        conn.close()


def _in_the_pid_namespace(sock: socket.socket) -> None:
    """Go on in a child, which is in the task's PID namespace (setns(2) moves only the children there, and a
    process outside cannot start threads, which asyncio needs); this process waits for it and exits as it does."""
    child = os.fork()
    if child == 0:
        return
    sock.close()
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)


def main() -> None:
    sock = socket.socket(fileno=os.dup(0))
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)  # what the sessions start never inherits the stream
    os.close(null)
    try:
        header = read_header(sock)
        if "enter" in header:
            base = enter(header["enter"])
            _in_the_pid_namespace(sock)
        else:
            base = dict(os.environ)
        asyncio.run(serve(sock, str(header["host_key"]), str(header["host_cert"]), base))
    except (EOFError, ConnectionError, asyncssh.ConnectionLost, asyncssh.DisconnectError):
        pass  # the client went away (or refused the host key) before or during the handshake
    except Exception as exc:
        sys.stderr.write(f"gpulayer ssh server: {type(exc).__name__}: {exc}\n")
        sys.exit(1)


if __name__ == "__main__":
    main()
