"""Keeping the agent's secrets from its own tasks, which run as the same user.

A task could read ``/proc/<agent pid>/environ`` (the join token, every cloud
credential the agent was started with) and the agent's memory (its session
token). ``make_undumpable`` closes both on Linux: a non-dumpable process's
``/proc`` files belong to root and ptrace-style access needs CAP_SYS_PTRACE.
Removing the token from ``os.environ`` alone would not do: ``/proc/PID/environ``
shows the environment block the process started with.
"""

import ctypes
import os
import sys

PR_SET_DUMPABLE = 4
JOIN_TOKEN_VAR = "GPULAYER_JOIN_TOKEN"


class TokenFileError(ValueError):
    """A --token-file that cannot be used, said in one line."""


def make_undumpable() -> bool:
    """``prctl(PR_SET_DUMPABLE, 0)``; True when it took effect (Linux only).

    Processes of the same user can then no longer read this process's
    ``/proc/PID/environ``, ``mem`` or ``maps``, nor attach a debugger; no core
    dump is written. Children get their own flag back when they exec.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def forget_join_token(environ=None) -> str | None:
    """Remove $GPULAYER_JOIN_TOKEN from the environment (children never inherit it); its value, if any."""
    environ = os.environ if environ is None else environ
    return environ.pop(JOIN_TOKEN_VAR, None) or None


def read_token_file(path: str) -> str:
    """The token in ``path`` (surrounding whitespace removed); TokenFileError saying what is wrong."""
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as handle:
            token = handle.read(4096).strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenFileError(f"--token-file {path}: cannot read it: {getattr(exc, 'strerror', None) or exc}") from None
    if not token:
        raise TokenFileError(f"--token-file {path}: the file is empty")
    if any(ch.isspace() for ch in token):
        raise TokenFileError(f"--token-file {path}: expected one token (glj_...) and nothing else")
    return token
