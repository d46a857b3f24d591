"""Plain OpenSSH into a task: `gpulayer ssh-config` and `gpulayer ssh-proxy` (docs/access.md, "SSH").

`ssh-config` prints a `Host gpulayer-*` block whose ProxyCommand is `gpulayer ssh-proxy %n` and whose
known_hosts file (written beside the client's other files) trusts the control plane's SSH host CA for
`gpulayer-*` names only. `ssh-proxy HOST` opens one relay stream of kind `ssh` on the task HOST names and
copies its own stdin and stdout to it: OpenSSH speaks SSH through it to the server the agent starts inside
the task (agent/relay/ssh_server.py), whose host certificate the control plane signed for that name.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import threading
from pathlib import Path

from gpulayer.client.api import Client
from gpulayer.client.errors import ConnectionFailed
from gpulayer.client.relay import RelayClient, closed_error, open_stream
from gpulayer.protocol.control import Close, SshOpen
from gpulayer.protocol.fields import from_wire, to_wire
from gpulayer.protocol.relay import CLOSE, DATA, EXT_DATA

PREFIX = "gpulayer-"
HOST = re.compile(r"gpulayer-([0-9]{1,18})(?:-([0-9]{1,9}))?")
READ_BYTES = 64 * 1024


def parse_host(host: str) -> tuple[int, int | None]:
    """(job, index or None) of `gpulayer-JOB` or `gpulayer-JOB-INDEX`; ValueError for any other name."""
    found = HOST.fullmatch(host.strip().lower())
    if found is None:
        raise ValueError(f"{host!r} is not a task's SSH name: expected gpulayer-JOB or gpulayer-JOB-INDEX (e.g. gpulayer-12, gpulayer-12-3)")
    return int(found[1]), (int(found[2]) if found[2] is not None else None)


def known_hosts_line(ca_public: str) -> str:
    """The known_hosts line that trusts the host CA for task names only."""
    return f"@cert-authority {PREFIX}* {ca_public.strip()}\n"


def write_known_hosts(path: Path, ca_public: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(known_hosts_line(ca_public))
    os.replace(tmp, path)


def host_ca(client: Client) -> str:
    """The control plane's SSH host CA public key (`GET /v1/ssh-host-ca.pub`); ApiError or ConnectionFailed."""
    return client.request("GET", "/ssh-host-ca.pub").text.strip()


def proxy_command(url: str, ca_file: str | None = None, home: str | None = None) -> str:
    """The ProxyCommand: this Python's `-m gpulayer.cli ssh-proxy`, with the control plane's URL (and CA file and
    home: where its token is, unless GPULAYER_TOKEN gives one); never the token itself."""
    argv = [sys.executable, "-m", "gpulayer.cli", "--url", url]
    if ca_file:
        argv += ["--ca-file", os.path.abspath(ca_file)]
    if home:
        argv += ["--home", os.path.abspath(os.path.expanduser(home))]
    return " ".join(shlex.quote(a) for a in [*argv, "ssh-proxy"]) + " %n"


def config_block(known_hosts: Path, url: str, ca_file: str | None = None, home: str | None = None) -> str:
    """The `Host gpulayer-*` block `ssh-config` prints."""
    quoted = '"' + str(known_hosts).replace('"', '\\"') + '"'
    return (
        f"Host {PREFIX}*\n"
        f"    ProxyCommand {proxy_command(url, ca_file, home)}\n"
        f"    UserKnownHostsFile {quoted}\n"
        "    GlobalKnownHostsFile /dev/null\n"
        "    StrictHostKeyChecking yes\n"
        "    CheckHostIP no\n"
        "    User task\n"
        "    ServerAliveInterval 30\n"
        "    PubkeyAuthentication no\n"
        "    PasswordAuthentication no\n"
        "    KbdInteractiveAuthentication no\n"
    )


def run_proxy(client: RelayClient, host: str, stdin_fd: int = 0, stdout_fd: int = 1) -> int:
    """Copy `stdin_fd`/`stdout_fd` to an `ssh` stream on the task `host` names until it ends; 0 when it ended
    cleanly. Raises ValueError for a bad name, ApiError (a refusal) or ConnectionFailed."""
    job_id, index = parse_host(host)
    link, stream = open_stream(client, job_id, to_wire(SshOpen()), index)
    threading.Thread(target=_feed, args=(stream, stdin_fd), daemon=True, name="ssh-proxy-in").start()
    try:
        while True:
            frame = stream.recv()
            if frame is None:
                continue
            if frame.type in (DATA, EXT_DATA):
                _write_all(stdout_fd, frame.data)
                stream.consumed(len(frame.data))
            elif frame.type == CLOSE:
                if from_wire(Close, frame.fields).error:
                    raise closed_error(frame.fields)
                return 0
    except BrokenPipeError:  # ssh closed our stdout: the connection is over
        stream.close(Close(reason="ssh closed the connection"))
        return 0
    finally:
        link.close()


def _feed(stream, fd: int) -> None:
    while True:
        try:
            chunk = os.read(fd, READ_BYTES)
        except OSError:
            chunk = b""
        if not chunk:
            if stream.ended is None:
                stream.eof()
            return
        if not stream.write(chunk):
            return


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


__all__ = ["parse_host", "config_block", "known_hosts_line", "write_known_hosts", "run_proxy", "ConnectionFailed"]
