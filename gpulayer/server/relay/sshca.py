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

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

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
    """The CA key of one control plane's home (cryptography's, no asyncssh on the control plane)."""

    def __init__(self, key: ed25519.Ed25519PrivateKey):
        self.key = key

    def public_line(self) -> str:
        """The CA's public key as a known_hosts / authorized_keys line: `ssh-ed25519 AAAA... gpulayer-ssh-host-ca`."""
        public = self.key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        return f"{public.decode()} {COMMENT}"

    def issue(self, names: list[str], *, now: float | None = None) -> tuple[str, str]:
        """A new host key and its certificate for `names`: (OpenSSH private key text, certificate line)."""
        now = time.time() if now is None else now
        host = ed25519.Ed25519PrivateKey.generate()
        cert = (
            serialization.SSHCertificateBuilder()
            .public_key(host.public_key())
            .serial(int.from_bytes(os.urandom(8), "big"))
            .type(serialization.SSHCertificateType.HOST)
            .key_id(names[0].encode())
            .valid_principals([name.encode() for name in names])
            .valid_after(int(now) - 60)
            .valid_before(int(now) + VALID_S)
            .sign(self.key)
        )
        private = host.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
        return private.decode(), cert.public_bytes().decode()


def for_home(home: Path | str) -> HostCA:
    """The host CA of `home`, made on first use (atomically: two processes racing keep one key)."""
    path = Path(home) / FILE
    with _lock:
        found = _loaded.get(str(path))
        if found is None:
            found = _loaded[str(path)] = HostCA(_load_or_make(path))
        return found


def _load_or_make(path: Path) -> ed25519.Ed25519PrivateKey:
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    key = ed25519.Ed25519PrivateKey.generate()
    tmp = path.with_name(f".{FILE}.{os.getpid()}.{threading.get_ident()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()))
        handle.flush()
        os.fsync(handle.fileno())
    try:
        os.link(tmp, path)  # fails if another process made it first: theirs is kept
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    return _read(path)


def _read(path: Path) -> ed25519.Ed25519PrivateKey:
    key = serialization.load_ssh_private_key(path.read_bytes(), password=None)
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise ValueError(f"{path}: not an ed25519 key (delete it to make a new SSH host CA)")
    return key
