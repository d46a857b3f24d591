"""The relay's control messages declared once: the JSON objects of OPEN (per stream kind), CLOSE, SIGNAL, RESIZE
and SETTINGS frames (the frames themselves: relay.py; docs/protocol.md, "The relay").

A client opens a stream with its kind's OPEN (`ExecOpen`, `ShellOpen`, `TcpOpen`, `SshOpen`); the control plane
checks it (gpulayer/server/relay/opens.py) and hands the stream to the agent with a `StreamOpen` (the job, the
task, the session, and what the kind needs). Builders construct these and send `to_wire()` of them; readers
take a frame's object through `from_wire()`. A reader never refuses a message for a missing field: a field a
writer always sends is declared with a default (null) and `always`, and each reader checks the values it uses
as it did when the messages were hand-built dicts. A field left out at its default (`omit`) is not on the wire,
so the bytes are those the hand-built dicts made (tests/unit/test_relay_messages.py). The docs' tables come
from here (scripts/gen_docs.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeGuard

from gpulayer.protocol.fields import declare
from gpulayer.protocol.relay import SIGNALS

SIGNAL_NAMES = ", ".join(SIGNALS)
TERM_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}"


# -- a client's OPEN, per kind ------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class ExecOpen:
    """A client's OPEN of an `exec` stream: one command in the task, its stdin, stdout and stderr."""

    kind: str = declare("exec", help="the stream's kind (as the URL's `kind`)")
    argv: list[str] | None = declare(None, always=True, shows="required", min_items=1,
                                     help="the command and its arguments (at most 64 KiB)")


@dataclass(frozen=True, kw_only=True)
class ShellOpen:
    """A client's OPEN of a `shell` stream: the task's shell (or `argv`) on a terminal."""

    kind: str = declare("shell", help="the stream's kind (as the URL's `kind`)")
    rows: int | None = declare(None, always=True, shows="required", minimum=1, maximum=65535,
                               help="the terminal's rows at the start")
    cols: int | None = declare(None, always=True, shows="required", minimum=1, maximum=65535,
                               help="the terminal's columns at the start")
    argv: list[str] | None = declare(None, omit=True, min_items=1,
                                     help="a command instead of the task's shell (checked as exec's)")
    term: str | None = declare(None, omit=True, pattern=TERM_PATTERN,
                               help="the client's TERM (the agent's default: xterm-256color)")


@dataclass(frozen=True, kw_only=True)
class TcpOpen:
    """A client's OPEN of a `tcp` stream: a connection to a port in the task's network view (forward.py)."""

    kind: str = declare("tcp", help="the stream's kind (as the URL's `kind`)")
    port: int | None = declare(None, always=True, shows="required", minimum=1, maximum=65535,
                               help="the port in the task")
    host: str | None = declare(None, omit=True, shows='"127.0.0.1"',
                               help="a loopback address of the task's view (`localhost`: 127.0.0.1; or ::1)")


@dataclass(frozen=True, kw_only=True)
class SshOpen:
    """A client's OPEN of an `ssh` stream: the SSH protocol end to end to a server in the task."""

    kind: str = declare("ssh", help="the stream's kind (as the URL's `kind`)")


#: A client's OPEN by its kind (protocol.relay.KINDS).
CLIENT_OPENS: dict[str, type] = {"exec": ExecOpen, "shell": ShellOpen, "tcp": TcpOpen, "ssh": SshOpen}


# -- the control plane's OPEN to the agent ---------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class StreamOpen:
    """The control plane's OPEN to the agent: the stream's kind, where it goes, and the kind's fields as checked."""

    kind: str | None = declare(None, always=True, shows="required", help='"exec", "shell", "tcp" or "ssh"')
    job_id: int | None = declare(None, always=True, shows="required", help="the job")
    task_id: int | None = declare(None, always=True, shows="required", help="the task it goes into")
    index: int | None = declare(None, always=True, shows="required", help="the task's index in its job")
    session_id: int | None = declare(None, omit=True,
                                     help="the relay session's row (absent: a stream of the ingress, unrecorded)")
    rows: int | None = declare(None, omit=True, help="shell: as the client's")
    cols: int | None = declare(None, omit=True, help="shell: as the client's")
    term: str | None = declare(None, omit=True, help="shell: as the client's, when it sent one")
    argv: list[str] | None = declare(None, omit=True, help="exec (always), shell (when the client sent one)")
    port: int | None = declare(None, omit=True, help="tcp: the port in the task")
    host: str | None = declare(None, omit=True, shows='"127.0.0.1"', help="tcp: when it is another loopback address")
    host_key: str | None = declare(None, omit=True, help="ssh: an ephemeral OpenSSH private key (never recorded)")
    host_cert: str | None = declare(None, omit=True,
                                    help="ssh: its host certificate from the control plane's SSH host CA")
    max_data: int | None = declare(None, omit=True, shows="65536",
                                   help="the most data per DATA frame the agent may send on this stream (added "
                                        "2026-12-04; absent: 64 KiB)")


# -- the other control frames ------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Close:
    """A CLOSE's object, either way: the stream is over, and why."""

    exit_code: int | None = declare(None, omit=True, help="the remote command's (128+N for a death by signal N)")
    reason: str | None = declare(None, omit=True, help="why, for people")
    error: str | None = declare(None, omit=True, help="what failed or was refused (a sentence)")
    code: str | None = declare(None, omit=True,
                               help="with `error` from the control plane: the error's code (`relay_closed`, ...)")
    status: int | None = declare(None, omit=True,
                                 help="with `code`: the HTTP status a plain request refused alike would get")

    def why(self) -> Any:
        """What a log says of the ending: its `error`, else its `reason` (each as sent)."""
        return self.error or self.reason


@dataclass(frozen=True, kw_only=True)
class Signal:
    """A SIGNAL's object: a signal for the remote command (exec: its process group; shell: the foreground job)."""

    signal: str | None = declare(None, always=True, shows="required", help=f"one of {SIGNAL_NAMES}")


@dataclass(frozen=True, kw_only=True)
class Resize:
    """A RESIZE's object: a shell's new window size (the client's SIGWINCH)."""

    rows: int | None = declare(None, always=True, shows="required", minimum=1, maximum=65535, help="rows")
    cols: int | None = declare(None, always=True, shows="required", minimum=1, maximum=65535, help="columns")


@dataclass(frozen=True, kw_only=True)
class Settings:
    """A SETTINGS' object: from the control plane to a client that announced `X-GpuLayer-Relay-Max-Data`."""

    max_data: int | None = declare(None, always=True, shows="required", minimum=65536, maximum=262144,
                                   help="the most data one DATA or EXT_DATA frame of this stream may carry from now on")


#: Every declared control message, by the name docs/protocol.md's tables carry.
MESSAGES: dict[str, type] = {"ExecOpen": ExecOpen, "ShellOpen": ShellOpen, "TcpOpen": TcpOpen, "SshOpen": SshOpen,
                             "StreamOpen": StreamOpen, "Close": Close, "Signal": Signal, "Resize": Resize,
                             "Settings": Settings}


def is_int(value: Any) -> TypeGuard[int]:
    """A JSON integer (not a boolean), as readers check a field's value."""
    return isinstance(value, int) and not isinstance(value, bool)


__all__ = ["ExecOpen", "ShellOpen", "TcpOpen", "SshOpen", "StreamOpen", "Close", "Signal", "Resize", "Settings",
           "CLIENT_OPENS", "MESSAGES", "is_int"]
