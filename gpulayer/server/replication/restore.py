"""Rebuild a home from a replica: the state file (`litestream restore`), the home's files, the writer lease."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import apsw

from gpulayer.server.config import HomeLayout
from gpulayer.server.errors import ConfigError
from gpulayer.server.replication.home import (HOME_DIR, HOME_TREES, OPTIONAL_HOME_FILES, REQUIRED_HOME_FILES,
                                              RESTORED_FILE, WRITER_ID_FILE)
from gpulayer.server.replication.lease import (FENCE_TTL_S, LeaseLost, describe_lease, lease_is_live, read_lease,
                                               swap_lease)
from gpulayer.server.replication.replica import Replica, require_binary
from gpulayer.server.security.auth import write_private
from gpulayer.server.store.queries import QUERIES, one, row

RESTORE_TIMEOUT_S = 3600.0   # the most `litestream restore` may take
TAKE_OVER_TRIES = 5     # a restore's attempts at the lease while another writer races it
# Event seqs skipped at a restored home's first start: the lost window is about one --replicate-interval
# (1 s) of changes, and no writer commits this many events in minutes.
LOST_EVENT_SEQS = 10_000_000


def restore(source: str, home: Path, *, timestamp: str | None = None, force: bool = False,
            home_files_from: Path | None = None, clock=time.time) -> dict:
    """Rebuild a home from a replica: the state file (Litestream), the home's files, the writer lease.

    Everything is made in a staging directory inside the home and moved in
    last, the state file after the rest: a failure (Litestream's, a timeout, a
    file that cannot be copied) leaves no half-made home (a home directory this
    call made is removed again). Raises ConfigError: the home is in use, the
    replica's lease is live (unless `force`), the home's files are missing, or
    Litestream fails.

    With a `timestamp` (an older state) the replica's lease is left as it is:
    the restored home must replicate to a new directory (`claim` refuses this
    replica), since its history ends before the replica's does.
    """
    replica = Replica.parse(source)
    binary = require_binary()
    layout = HomeLayout(Path(home).expanduser().resolve())
    if layout.state.exists() or layout.credentials.exists():
        raise ConfigError(f"{layout.home} holds a control plane's files already: restore into a new, empty home")
    now = clock()
    if replica.directory is not None:
        if not (replica.directory / "ltx").is_dir():
            raise ConfigError(f"{replica.directory} holds no Litestream replica (no ltx/ directory)")
        lease = read_lease(replica.directory)
        if lease_is_live(lease, now) and not force:
            raise ConfigError(f"the replica is {describe_lease(lease, now)}, so its control plane may still be "
                              f"running. Stop it (or make sure its machine is down) and wait {FENCE_TTL_S:g} s "
                              "for the lease to go stale, or pass --force")
    files_root = home_files_from or (replica.directory / HOME_DIR if replica.directory is not None else None)
    if files_root is None:
        raise ConfigError(f"{replica.url} is not a directory replica, so it holds no copy of the home's files: "
                          "give --home-files DIR (a copy of the old home's server-secret, "
                          "server-credentials.json, secrets.key and tls/)")
    wanted = _wanted_home_files(Path(files_root))
    made_home = not layout.home.exists()
    try:
        layout.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(layout.home, 0o700)
        with tempfile.TemporaryDirectory(dir=layout.home, prefix=".restore-") as staging:
            staged = Path(staging) / "state.db"
            summary = _litestream_restore(binary, replica, staged, timestamp)
            files = Path(staging) / "home"
            for rel in wanted:
                dest = files / rel
                dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                write_private(dest, (Path(files_root) / rel).read_bytes())
            new_writer = secrets.token_hex(8)
            write_private(files / WRITER_ID_FILE, new_writer + "\n")
            marker = {"from": replica.url, "timestamp": timestamp, "restored_at": clock(), **summary}
            write_private(files / RESTORED_FILE, json.dumps(marker, indent=2) + "\n")
            for rel in [*wanted, Path(WRITER_ID_FILE), Path(RESTORED_FILE)]:
                dest = layout.home / rel
                dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                os.replace(files / rel, dest)
            for suffix in ("-wal", "-shm", ""):  # the state file last: a home with one is complete
                part = Path(str(staged) + suffix)
                if part.exists():
                    os.chmod(part, 0o600)
                    os.replace(part, Path(str(layout.state) + suffix))
    except BaseException as exc:
        _undo_restore(layout, made_home, wanted)
        if isinstance(exc, OSError):
            raise ConfigError(f"cannot restore into {layout.home}: {exc}") from None
        raise
    if replica.directory is not None and not timestamp:
        # The replica is this home's now: a returning old plane finds its lease taken and stops.
        _take_over(replica.directory, new_writer, layout.home, clock)
    return {"home": str(layout.home), "files": [str(p) for p in wanted], **marker}


def _take_over(directory: Path, writer: str, home: Path, clock) -> None:
    """Take the replica's lease for a restored home, whatever generation it is at (a few tries: a renewal
    of the old plane racing this one loses, and stops, at its own check)."""
    lost: LeaseLost | None = None
    for attempt in range(TAKE_OVER_TRIES):
        try:
            swap_lease(directory, writer, home, clock(), expect=None)
            return
        except LeaseLost as exc:
            lost = exc
            time.sleep(0.05 * (attempt + 1))
    raise ConfigError(f"{home} is restored, but the replica's lease kept changing while this restore took it "
                      f"({lost}): is its control plane still running? Stop it, then start the restored home "
                      "after the lease goes stale")


def _litestream_restore(binary: str, replica: Replica, staged: Path, timestamp: str | None) -> dict:
    """`litestream restore` into `staged`, checked (_check_restored); ConfigError when it fails or hangs."""
    command = [binary, "restore", "-o", str(staged)]
    if timestamp:
        command += ["-timestamp", timestamp]
    try:
        done = subprocess.run([*command, replica.litestream_url], capture_output=True, text=True,
                              timeout=RESTORE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"litestream restore did not finish within {RESTORE_TIMEOUT_S:g} s: is the replica "
                          "reachable? Nothing was restored") from None
    except OSError as exc:
        raise ConfigError(f"cannot run {binary}: {exc.strerror or exc}") from None
    if done.returncode != 0 or not staged.exists():
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise ConfigError(f"litestream restore failed: {detail[-1] if detail else f'status {done.returncode}'}")
    return _check_restored(staged)


def _undo_restore(layout: HomeLayout, made_home: bool, wanted: list[Path]) -> None:
    """After a failed restore: the home as it was (removed when this restore made it)."""
    if layout.state.exists():
        return  # everything was moved in: not a half-made home
    if made_home:
        shutil.rmtree(layout.home, ignore_errors=True)
        return
    for rel in [*wanted, Path(WRITER_ID_FILE), Path(RESTORED_FILE)]:
        (layout.home / rel).unlink(missing_ok=True)


def _wanted_home_files(root: Path) -> list[Path]:
    """The home files to restore from `root`; ConfigError naming what is missing."""
    try:
        manifest = json.loads((root / "manifest.json").read_text())["files"]
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        manifest = None
    names = [Path(n) for n in manifest] if manifest is not None else [
        Path(n) for n in (*REQUIRED_HOME_FILES, *OPTIONAL_HOME_FILES) if (root / n).is_file()] + sorted(
        p.relative_to(root) for t in HOME_TREES if (root / t).is_dir() for p in (root / t).rglob("*") if p.is_file())
    missing = [str(n) for n in {*map(Path, REQUIRED_HOME_FILES), *names} if not (root / n).is_file()]
    if missing:
        raise ConfigError(f"{root} lacks {', '.join(sorted(missing))}: without them the restored control plane "
                          "cannot check tokens or serve TLS. Copy them from the old home (or a backup) into a "
                          "directory and give it as --home-files")
    return sorted({*map(Path, REQUIRED_HOME_FILES), *names})


def _check_restored(path: Path) -> dict:
    """The restored file passes integrity_check; what it holds (and the newest task id, for reconciliation)."""
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        check = conn.execute("PRAGMA integrity_check").fetchall()[0][0]
        if check != "ok":
            raise ConfigError(f"the restored state file fails integrity_check: {check}")
        jobs, tasks, last_event = conn.execute(QUERIES["restored_summary"]).fetchall()[0]
    except apsw.SQLError as exc:
        raise ConfigError(f"the restored file is not a GPUlayer state file: {exc}") from None
    finally:
        conn.close()
    return {"jobs": jobs, "max_task_id": tasks, "last_event_at": last_event}


def skip_lost_event_seqs(conn: apsw.Connection) -> int:
    """At a restored home's first start: the next event seq jumps past any the lost window used; returns
    the highest seq now taken. An event the old plane wrote there (and a webhook may have delivered,
    as msg_gl<webhook>e<seq>) shares no seq with one written from now on."""
    row(conn, "seed_event_sequence")
    return one(conn, "skip_lost_event_seqs", skip=LOST_EVENT_SEQS)["seq"]
