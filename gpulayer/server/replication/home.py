"""The home's files a restore needs: copied into a directory replica, this home's writer id, the restored marker."""
from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path

from gpulayer.server.config import HomeLayout
from gpulayer.server.security.auth import write_private

HOME_DIR = "home"                     # the home's secret files, copied into a directory replica
WRITER_ID_FILE = "replica-writer-id"  # in the home: which writer this home is, for the lease
RESTORED_FILE = "restored.json"       # in a restored home: where from, and the reconciliation it needs
#: Files of the home a restore needs (required) or uses when the original had them.
REQUIRED_HOME_FILES = ("server-secret", "server-credentials.json")
# local-tokens.json: `gpulayer up` keeps its tokens there; without it a restored `up` home would rotate them.
OPTIONAL_HOME_FILES = ("secrets.key", "provisioners.json", "local-tokens.json")
HOME_TREES = ("tls",)


def writer_id(layout: HomeLayout) -> str:
    """This home's writer id (made once, 0600): the lease names it, so a restart of the same home keeps it."""
    path = layout.home / WRITER_ID_FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        value = secrets.token_hex(8)
        write_private(path, value + "\n")
        return value


def home_files(layout: HomeLayout) -> list[Path]:
    """The home's files a restore needs, relative to the home (those that exist)."""
    found = [Path(n) for n in (*REQUIRED_HOME_FILES, *OPTIONAL_HOME_FILES) if (layout.home / n).is_file()]
    for tree in HOME_TREES:
        root = layout.home / tree
        if root.is_dir():
            found += sorted(p.relative_to(layout.home) for p in root.rglob("*") if p.is_file())
    return found


def home_signature(layout: HomeLayout, files: list[Path]) -> tuple:
    """(name, mtime, size) of each of `files` that exists: a change means a new copy."""
    out = []
    for rel in files:
        try:
            st = (layout.home / rel).stat()
        except FileNotFoundError:
            continue
        out.append((str(rel), st.st_mtime_ns, st.st_size))
    return tuple(out)


def copy_home_files(layout: HomeLayout, directory: Path) -> list[str]:
    """Copy the home's secret files into `directory/home` (0700, files 0600) with a manifest; their names."""
    target = directory / HOME_DIR
    target.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(target, 0o700)
    names = []
    for rel in home_files(layout):
        dest = target / rel
        dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_private(dest, (layout.home / rel).read_bytes())
        names.append(str(rel))
    write_private(target / "manifest.json", json.dumps({"files": names, "copied_at": time.time()}) + "\n")
    return names


def restored_marker(layout: HomeLayout) -> dict | None:
    """What `restore()` left in this home (None for a home that was not restored)."""
    try:
        return json.loads((layout.home / RESTORED_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return None


def note_started(layout: HomeLayout, marker: dict, now: float) -> None:
    """Record the first start of a restored home (its reconciliation pause happens once)."""
    write_private(layout.home / RESTORED_FILE, json.dumps({**marker, "first_started_at": now}, indent=2) + "\n")
