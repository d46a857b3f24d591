"""The SSH server of one `ssh` relay stream, run inside the task (docs/access.md, "SSH").

agent/relay_ssh.py starts it in the task's place as it starts an `exec` command (the task's cwd, environment,
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
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import termios

import asyncssh

HEADER = struct.Struct(">I")
MAX_HEADER = 64 * 1024
LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1", "ip6-localhost"})
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


def login_shell() -> str:
    """$SHELL when it is a real shell, else bash, else sh (the task user's passwd shell may be nologin)."""
    for shell in (os.environ.get("SHELL"), "/bin/bash", "/bin/sh"):
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


async def run_session(process: asyncssh.SSHServerProcess, sessions: Sessions) -> None:
    """One session channel: its command (or the shell) with pipes, or on a PTY when the client asked for one."""
    loop = asyncio.get_running_loop()
    if process.subsystem:
        process.stderr.write(f"gpulayer: no subsystem {process.subsystem!r} here (sftp is)\n".encode())
        process.exit(1)
        return
    shell = login_shell()
    command = process.command
    argv = [shell, "-c", command] if command is not None else [shell]
    env = dict(os.environ)
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

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended.set()

    def begin_auth(self, username: str) -> bool:
        return False  # no authentication: the relay did it (module docstring)

    def connection_requested(self, dest_host: str, dest_port: int, orig_host: str, orig_port: int) -> bool:
        if dest_host.lower() not in LOOPBACK:
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED, f"gpulayer forwards to loopback ports of the task only, not to {dest_host}"
            )
        return True

    def server_requested(self, listen_host: str, listen_port: int) -> bool:
        return False  # no remote forwarding (ssh -R)


async def serve(sock: socket.socket, host_key: str, host_cert: str) -> None:
    ended = asyncio.Event()
    sessions = Sessions()
    key = asyncssh.import_private_key(host_key)
    cert = asyncssh.import_certificate(host_cert)

    async def session(process: asyncssh.SSHServerProcess) -> None:
        await run_session(process, sessions)

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


def main() -> None:
    sock = socket.socket(fileno=os.dup(0))
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)  # what the sessions start never inherits the stream
    os.close(null)
    try:
        header = read_header(sock)
        asyncio.run(serve(sock, str(header["host_key"]), str(header["host_cert"])))
    except (EOFError, ConnectionError, asyncssh.ConnectionLost, asyncssh.DisconnectError):
        pass  # the client went away (or refused the host key) before or during the handshake
    except Exception as exc:
        sys.stderr.write(f"gpulayer ssh server: {type(exc).__name__}: {exc}\n")
        sys.exit(1)


if __name__ == "__main__":
    main()
