"""What the replica's lag is read from: Litestream's LTX files on both sides, and its control socket.

A directory replica's lag is the age of the oldest local LTX file the replica
does not hold yet; any other replica's is the time since Litestream's last
sync that shipped everything (`last_sync_at`, asked of its control socket).
`Replicator._measure` (supervisor.py) puts the two together.
"""
from __future__ import annotations

import json
import logging
import os
import re
import socket
import tempfile
from datetime import datetime
from pathlib import Path

from gpulayer.server.config import HomeLayout

log = logging.getLogger("gpulayer.server.replication")

LAG_DEGRADED_S = 10.0   # /v1/health says `degraded` when replication lags more than this (and the interval)
WAL_SLACK_S = 0.05      # file times' granularity, between the WAL's last write and the LTX file made from it
SYNC_QUERY_S = 0.5      # how often the supervisor asks Litestream's control socket for the replica's last sync
SOCKET_TIMEOUT_S = 0.5  # the most one such question may take


def ltx_positions(root: Path) -> list[tuple[int, float]]:
    """(max TXID, mtime) of every LTX file under root/ltx/<level>/ (Litestream 0.5's layout).

    No ltx/ yet is no file; any other OSError (EIO, ESTALE from a replica on NFS) is raised.
    """
    found: list[tuple[int, float]] = []
    try:
        levels = list((root / "ltx").iterdir())
    except FileNotFoundError:
        return found
    for level in levels:
        try:
            entries = list(os.scandir(level))
        except (NotADirectoryError, FileNotFoundError):
            continue
        for entry in entries:
            name = entry.name
            if name.endswith(".ltx") and "-" in name:
                try:
                    found.append((int(name[:-4].split("-")[1], 16), entry.stat().st_mtime))
                except (ValueError, FileNotFoundError):
                    continue   # not one of Litestream's, or compacted away meanwhile
    return found


def local_ltx_dir(state: Path) -> Path:
    """Where Litestream 0.5 keeps its local copy of the WAL as LTX files (beside the state file)."""
    return state.with_name(f".{state.name}-litestream")


def control_socket_path(layout: HomeLayout) -> Path:
    """Where Litestream listens for `list`: in the home, or a private temporary directory when that path is
    too long for a unix socket."""
    path = layout.home / "litestream.sock"
    if len(os.fsencode(str(path))) < 100:
        return path
    return Path(tempfile.mkdtemp(prefix="gpulayer-ls-")) / "ls.sock"


def remove_socket(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        log.warning("replication_socket_not_removed path=%s error=%s", path, exc)


def last_sync_at(path: Path, state: Path) -> float | None:
    """`last_sync_at` of `state` from Litestream's control socket (seconds since the epoch), or None."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(SOCKET_TIMEOUT_S)
            conn.connect(str(path))
            conn.sendall(b"GET /list HTTP/1.0\r\nHost: litestream\r\n\r\n")
            data = b""
            while len(data) < 1 << 20:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.") or b" 200 " not in head.split(b"\r\n", 1)[0] + b" ":
            return None
        for db in json.loads(body).get("databases") or []:
            if db.get("path") == str(state) and db.get("last_sync_at"):
                return rfc3339(db["last_sync_at"])
    except (OSError, ValueError, AttributeError, TypeError):
        return None
    return None


def rfc3339(text: str) -> float:
    """Go's RFC 3339 time (nanoseconds, Z or an offset) as seconds since the epoch; ValueError if not one."""
    match = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", text)
    if match is None:
        raise ValueError(text)
    whole, fraction, zone = match.groups()
    stamp = datetime.fromisoformat(whole + ("+00:00" if zone == "Z" else zone)).timestamp()
    return stamp + (float("0." + fraction) if fraction else 0.0)

