"""Litestream as a supervised child of the control plane (`Replicator`): the lease renewed, the lag measured.

`Replicator` runs `litestream replicate` (started once the state file is open,
restarted with backoff when it dies, stopped with SIGTERM so that it syncs
what it holds). While it runs, Litestream owns the WAL's checkpoints (the
writer's autocheckpoint is off, see `Store`), so no checkpoint can truncate
WAL frames it has not copied. For a directory replica it also renews the
writer lease (lease.py) and copies the home's files (home.py).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from gpulayer.server.config import HomeLayout
from gpulayer.server.replication.home import copy_home_files, home_files, home_signature
from gpulayer.server.replication.lag import (LAG_DEGRADED_S, SYNC_QUERY_S, WAL_SLACK_S, control_socket_path,
                                             last_sync_at, local_ltx_dir, ltx_positions, remove_socket)
from gpulayer.server.replication.lease import (FENCE_MARGIN_S, FENCE_RENEW_S, FENCE_TTL_S, LeaseLost, claim,
                                               describe_lease, read_lease, swap_lease)
from gpulayer.server.replication.replica import Replica, require_binary
from gpulayer.server.security.auth import write_private

log = logging.getLogger("gpulayer.server.replication")

MONITOR_SHARE = 0.2     # of --replicate-interval: how often Litestream looks at the WAL (the rest: shipping)
STOP_TIMEOUT_S = 15.0   # Litestream syncs on SIGTERM; past this it is killed
STATUS_CACHE_S = 0.25   # how often the supervising thread measures the lag that /v1/health and /metrics read
STATUS_STALE_S = 5.0    # a measurement older than this (the replica hangs) is reported degraded, lag unknown
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)   # restarts of a child that keeps dying
STUCK_S = 30.0          # a child that takes nothing from a changing WAL this long is killed and restarted
STEADY_S = 60.0         # a child that ran this long starts the backoff over


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
        self.socket_path: Path | None = None if replica.directory is not None else control_socket_path(layout)
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
            remove_socket(self.socket_path)
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
            remove_socket(self.socket_path)   # a killed child's: Litestream would not listen on it
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
        signature = home_signature(self.layout, home_files(self.layout))
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
        age: float | None = None
        if measured is None:
            measured = {"lag_seconds": None, "local_txid": 0, "replicated_txid": None, "degraded": True,
                        "error": "the replica's lag has not been measured yet"}
        else:
            age = time.monotonic() - at
            if age > STATUS_STALE_S:
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
            local = ltx_positions(local_ltx_dir(self.layout.state))
            local_txid = max((t for t, _ in local), default=0)
            replica_txid = lag = None
            wal_ahead = self._wal_ahead(max((m for _, m in local), default=0.0))
            if self.replica.directory is None:
                # Litestream's last sync that shipped everything (its control socket; before the first,
                # the start): a replica that fails every upload (expired credentials) lags from then on.
                self._query_synced()
                lag = max(0.0, now - (self._synced_at if self._synced_at is not None else self._unsynced_since))
            else:
                replica_txid = max((t for t, _ in ltx_positions(self.replica.directory)), default=0)
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
        synced = last_sync_at(self.socket_path, self.layout.state)
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

