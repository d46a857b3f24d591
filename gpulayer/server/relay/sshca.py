"""The control plane's SSH host CA: every `ssh` stream's server proves itself with a certificate it signs.

An ed25519 key made once in the control plane's home (`ssh_host_ca`, mode 0600). For each `ssh` stream the
hub makes an ephemeral ed25519 host key and a host certificate for it (principals `gpulayer-JOB` and
`gpulayer-JOB-INDEX`, valid `VALID_S` seconds), sent to the agent in the stream's OPEN (over the link's TLS)
and never recorded. `gpulayer ssh-config` writes `@cert-authority gpulayer-* <CA public key>` (from
`GET /v1/ssh-host-ca.pub`) into the known_hosts file its ssh config names, so OpenSSH checks every
task's host key without a prompt (docs/security.md, "SSH").
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

FILE = "ssh_host_ca"
#: Seconds a stream's host certificate is valid: it is checked once, at the SSH handshake, which follows at once.
VALID_S = 600
COMMENT = "gpulayer-ssh-host-ca"

_lock = threading.Lock()
_loaded: dict[str, HostCA] = {}


def principals(job_id: int, index: int | None) -> list[str]:
    """The host names a stream's certificate is good for: what `ssh-proxy` accepts for that task."""
    names = [f"gpulayer-{job_id}"]
    if index is not None:
        names.append(f"gpulayer-{job_id}-{index}")
    return names


class HostCA:
    """The CA key of one control plane's home."""

    def __init__(self, key):
        self.key = key

    def public_line(self) -> str:
        """The CA's public key as a known_hosts / authorized_keys line: `ssh-ed25519 AAAA... gpulayer-ssh-host-ca`."""
        algorithm, blob = self.key.export_public_key("openssh").decode().split()[:2]
        return f"{algorithm} {blob} {COMMENT}"

    def issue(self, names: list[str], *, now: float | None = None) -> tuple[str, str]:
        """A new host key and its certificate for `names`: (OpenSSH private key text, certificate line)."""
        import asyncssh

        now = time.time() if now is None else now
        host = asyncssh.generate_private_key("ssh-ed25519")
        cert = self.key.generate_host_certificate(host, names[0], principals=names, valid_after=int(now) - 60, valid_before=int(now) + VALID_S)
        return host.export_private_key("openssh").decode(), cert.export_certificate("openssh").decode()


def for_home(home: Path | str) -> HostCA:
    """The host CA of `home`, made on first use (atomically: two processes racing keep one key)."""
    path = Path(home) / FILE
    with _lock:
        found = _loaded.get(str(path))
        if found is None:
            found = _loaded[str(path)] = HostCA(_load_or_make(path))
        return found


def _load_or_make(path: Path):
    import asyncssh

    try:
        return asyncssh.read_private_key(str(path))
    except FileNotFoundError:
        pass
    key = asyncssh.generate_private_key("ssh-ed25519", comment=COMMENT)
    tmp = path.with_name(f".{FILE}.{os.getpid()}.{threading.get_ident()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(key.export_private_key("openssh"))
        handle.flush()
        os.fsync(handle.fileno())
    try:
        os.link(tmp, path)  # fails if another process made it first: theirs is kept
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    return asyncssh.read_private_key(str(path))
