"""The control plane process: serving /v1, upkeep on its own schedule, clean shutdown.

`ControlPlane(config).start()` serves in background threads (used by `up`,
`--target local` and tests); `run_server(config)` blocks until SIGTERM or
SIGINT (`gpulayer server start`).
"""
from __future__ import annotations

import importlib.util
import ipaddress
import logging
import os
import resource
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import apsw

from gpulayer.server.provisioning import config as provisioners_json
from gpulayer.server.provisioning import loop as provisioner
from gpulayer.server.replication.home import note_started, restored_marker
from gpulayer.server.replication.replica import Replica, check_directory, require_binary
from gpulayer.server.replication.supervisor import Replicator
from gpulayer.server.scheduler import ledger, reconcile, retention
from gpulayer.server.http.app import Deps, create_app, new_deps, with_explorer
from gpulayer.server.security.auth import init_home, rotate_join_token  # noqa: F401 - the CLI imports them from here
from gpulayer.server.config import ControlPlaneConfig
from gpulayer.server.errors import ConfigError
from gpulayer.server.homelock import HomeLock
from gpulayer.server.frontends.cheroot_server import HTTPServer
from gpulayer.server.notify.outbox import Notifier
from gpulayer.server.relay.hub import Hub, Settings as RelaySettings
from gpulayer.server.store.queries import QUERIES
from gpulayer.server.upkeep import Job, Upkeep

if TYPE_CHECKING:
    from gpulayer.server.frontends.granian_server import GranianServer

log = logging.getLogger("gpulayer.server.process")
FD_LIMIT_WHEN_UNLIMITED = 1 << 20   # a soft limit to ask for when the hard one is unlimited


def is_loopback(host: str) -> bool:
    """True for localhost and 127.0.0.0/8 / ::1 (plain HTTP is allowed there)."""
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_config(config: ControlPlaneConfig) -> None:
    """Refuse settings that cannot work or are unsafe, with the flag that changes it."""
    if bool(config.tls_cert) != bool(config.tls_key):
        raise ConfigError("--tls-cert and --tls-key go together: give both or neither")
    for path in (config.tls_cert, config.tls_key):
        if path and not Path(path).is_file():
            raise ConfigError(f"no such file: {path}")
    if not config.tls_cert and not is_loopback(config.host) and not config.allow_insecure_remote:
        raise ConfigError(f"refusing to serve plain HTTP on {config.host}, which is not a loopback address: "
                          "give --tls-cert and --tls-key, or --allow-insecure-remote behind a TLS proxy you control")
    if config.heartbeat_interval_s <= 0 or config.lease_ttl_s <= config.heartbeat_interval_s:
        raise ConfigError("--lease-ttl must be longer than --heartbeat-interval, and both positive")
    if config.max_heartbeats_per_s < 0 or not 0 <= config.heartbeat_jitter <= 1:
        raise ConfigError("--max-heartbeats-per-s must be 0 or more, and the heartbeat jitter from 0 to 1")
    if min(config.log_retention_s, config.job_retention_s, config.gpu_sample_retention_s,
           config.prune_interval_s) <= 0:
        raise ConfigError("--log-retention, --job-retention and --gpu-sample-retention must be longer than zero")
    if config.read_timeout_s <= 0:
        raise ConfigError("--read-timeout must be longer than zero")
    if config.estimate_interval_s <= 0 or config.estimate_horizon_s <= 0 or config.estimate_max_jobs < 0:
        raise ConfigError("--estimate-interval and --estimate-horizon must be longer than zero, "
                          "--estimate-max-jobs 0 or more")
    if config.synchronous not in ("normal", "full"):
        raise ConfigError("--synchronous must be normal or full")
    if config.http not in ("cheroot", "granian"):
        raise ConfigError("--http must be granian or cheroot")
    if config.front_ends < 1 or config.front_ends > 1 and config.http != "granian":
        raise ConfigError("--front-ends must be 1 or more, and more than 1 only with the granian front end")
    if config.http == "granian" and importlib.util.find_spec("granian") is None:
        raise ConfigError("the granian front end (the default) needs the granian package: "
                          "pip install 'granian>=2.8,<2.9', or serve with --http cheroot")
    if config.replicate is not None:
        check_directory(Replica.parse(config.replicate))
        require_binary()
        if not 0 < config.replicate_interval_s <= 3600:
            raise ConfigError("--replicate-interval must be between 0 and 3600 seconds")
    if not config.layout.credentials.exists():
        raise ConfigError(f"{config.layout.home} is not initialised: run `gpulayer server init --home "
                          f"{config.layout.home}` (or `gpulayer up`)")


def raise_fd_limit() -> tuple[int, int]:
    """Raise the soft limit on open files to the hard one (each connection, reader and upload holds one).

    Returns (soft, hard) as they are now; a limit the system refuses to raise is left as it was.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, FD_LIMIT_WHEN_UNLIMITED)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft, hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        log.warning("fd_limit_not_raised soft=%d hard=%d error=%s", soft, hard, exc)
        return soft, hard
    log.info("fd_limit_raised soft=%d to=%d", soft, target)
    return target, hard


class ControlPlane:
    """One control plane: state file, scheduler, HTTP server and upkeep thread."""

    def __init__(self, config: ControlPlaneConfig, *, clock=time.time, lock: HomeLock | None = None):
        """`lock`: the home's lock, taken already by a caller that writes to the home before start
        (`up`, a local run); else start() takes it and stop() drops it."""
        check_config(config)
        self.config = config
        self.clock = clock
        self._deps: Deps | None = None   # both set by start()
        self._http: HTTPServer | GranianServer | None = None
        self.relay: Hub | None = None  # the relay's WebSocket handler, under granian (gpulayer/server/relay/)
        self._stop = threading.Event()
        self._upkeep: threading.Thread | None = None
        self.notifier: Notifier | None = None   # webhooks, mail and alerts (gpulayer/server/notify/)
        self.provisioners = provisioners_json.load(config.layout.provisioners)
        self.provisioning: provisioner.Provisioning | None = None
        self.replicator: Replicator | None = None
        self.fenced = threading.Event()   # another control plane took the replica's lease: stop serving
        self.lock = lock or HomeLock(config.layout.home, "gpulayer server start")
        self._own_lock = lock is None

    @property
    def deps(self) -> Deps:
        """The store, scheduler and the rest a started plane serves with; raises RuntimeError before start()."""
        if self._deps is None:
            raise RuntimeError("the control plane is not started")
        return self._deps

    @property
    def http(self) -> HTTPServer | GranianServer:
        """The HTTP front end a started plane listens with; raises RuntimeError before start()."""
        if self._http is None:
            raise RuntimeError("the control plane is not started")
        return self._http

    @property
    def url(self) -> str:
        host = self.config.host
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return f"{self.http.scheme}://{host}:{self.http.port}"

    def start(self) -> None:
        """Take the home's lock, open the state file and serve; returns once listening.

        Raises HomeInUse (a ConfigError) when another control plane holds the home, before touching it.
        """
        self.lock.acquire()
        try:
            self._start()
        except BaseException:
            self._release_lock()
            raise
        self.lock.note(url=self.url)

    def _release_lock(self) -> None:
        if self._own_lock:
            self.lock.release()

    def _start(self) -> None:
        self._open()
        self._serve()
        self._start_background()
        log.info("server_started url=%s state=%s", self.url, self.config.layout.state)
        log.info("server_settings %s", settings_line(self.config))

    def _open(self) -> None:
        """The state file and what a start does to it (replication, the tmp sweep, the restart's grace)."""
        raise_fd_limit()
        ca = self.config.layout.tls / "ca.pem"
        self._deps = new_deps(self.config, clock=self.clock, ca_file=ca if self.config.tls_cert and ca.exists() else None)
        self.deps.provisioners = self.provisioners
        self._start_replication()
        swept = self.deps.artifacts.sweep_tmp()  # partial uploads of a server killed mid-upload
        if swept:
            log.info("artifact_tmp_swept count=%d", swept)
        self.deps.scheduler.restarted()

    def _serve(self) -> None:
        """The HTTP front end, listening (multiproc/writer.py's writer process serves its RPC instead)."""
        app = with_explorer(create_app(self.deps), self.deps, secure_cookies=bool(self.config.tls_cert))
        certfile = str(self.config.tls_cert) if self.config.tls_cert else None
        keyfile = str(self.config.tls_key) if self.config.tls_key else None
        if self.config.http == "granian":
            from gpulayer.server.frontends.granian_server import GranianServer  # absent: --http cheroot serves
            from gpulayer.server.relay.ingress import PREFIX as INGRESS_PREFIX, IngressProxy
            from gpulayer.server.relay.ingress_limits import Limits
            self.relay = relay_hub(self.deps)
            limits = Limits(self.config.ingress_max_requests_per_job, self.config.ingress_max_requests_per_client,
                            self.config.ingress_send_timeout_s)
            ingress = IngressProxy(self.relay, secure_cookies=bool(self.config.tls_cert), limits=limits)
            self._http = GranianServer(app, self.config.host, self.config.port, certfile=certfile, keyfile=keyfile,
                                       threads=self.config.threads, websocket=self.relay,
                                       prefixed={INGRESS_PREFIX: ingress})
        else:  # cheroot serves no WebSocket: the relay's routes answer 501 (http/relay_routes.py)
            self._http = HTTPServer(app, self.config.host, self.config.port, certfile=certfile, keyfile=keyfile,
                                    threads=self.config.threads)
        self.http.start()

    def _start_background(self) -> None:
        """Upkeep, notifications' delivery and provisioning, each on its own thread."""
        self._upkeep = threading.Thread(target=self._run_upkeep, name="gpulayer-upkeep", daemon=True)
        self._upkeep.start()
        self.notifier = Notifier(self.deps.scheduler, self.config, self.clock)
        self.notifier.start()
        if self.provisioners:
            wiring = provisioner.ProvisioningDeps(config=self.config, store=self.deps.store,
                                                  scheduler=self.deps.scheduler, auth=self.deps.auth, clock=self.clock)
            self.provisioning = provisioner.Provisioning(self.provisioners, wiring)
            self.provisioning.start()

    def _start_replication(self) -> None:
        """Start Litestream (`--replicate`) and, in a restored home, the reconciliation with the workers.

        Raises ConfigError (the state file closed again) when the replica's lease is another's.
        """
        layout, now = self.config.layout, self.clock()
        if self.config.replicate is not None:
            self.replicator = Replicator(layout, Replica.parse(self.config.replicate),
                                         self.config.replicate_interval_s, on_fenced=self.fenced.set,
                                         clock=self.clock)
            try:
                self.replicator.start()
            except Exception:
                self.replicator = None
                self.deps.store.close()
                raise
            self.deps.replication = self.replicator.status
        marker = restored_marker(layout)
        if marker is not None:
            online = self.deps.store.read(reconcile.online_workers)
            restored = reconcile.Restored.after_restore(marker, self.clock, self.config.heartbeat_interval_s,
                                                        self.config.lease_ttl_s, online)
            self.deps.scheduler.restored = restored
            if "first_started_at" not in marker:
                taken = self.deps.scheduler.skip_lost_event_seqs()
                log.info("restored_event_seqs_skipped next_seq=%d", taken + 1)
                note_started(layout, marker, now)
            if restored is not None:
                log.info("restored_home from=%s watermark=%s awaiting_workers=%d pause_max_s=%g rules_s=%g",
                         marker.get("from"), marker.get("max_task_id"), len(restored.awaiting),
                         max(0.0, restored.pause_until - restored.started_at),
                         max(0.0, restored.ends_at - restored.started_at))

    def stop(self) -> None:
        """Stop accepting, finish in-flight requests, flush every acknowledged write, close."""
        self._stop.set()
        if self._deps is not None:
            self._deps.scheduler.stop_waiting()  # else parked acquires hold shutdown up to their wait_s
        if self.relay is not None:
            self.relay.stop()  # its WebSockets would hold granian's stop
        if self._http is not None:
            self._http.stop()
        if self.relay is not None:
            self.relay.close()
        if self._upkeep is not None:
            self._upkeep.join(timeout=10)
        if self.notifier is not None:
            self.notifier.stop()
        if self.provisioning is not None:
            self.provisioning.stop()
        if self._deps is not None:
            self._deps.scheduler.wake()
            self._deps.store.close()
        if self.replicator is not None:  # after the last commit: Litestream syncs it before it exits
            self.replicator.stop()
        self._release_lock()
        log.info("server_stopped")

    def _run_upkeep(self) -> None:
        upkeep = Upkeep(upkeep_jobs(self.deps), self.deps.upkeep, stopping=self._stop.is_set)
        upkeep.run(self._stop, min(self.config.heartbeat_interval_s, 1.0))


def upkeep_jobs(deps: Deps) -> list[Job]:
    """The plane's upkeep, in the order each tick runs it: (name, interval, function), each failing alone."""
    scheduler, config = deps.scheduler, deps.config

    def cascades() -> None:  # at the first tick: what a stop left undone
        found = scheduler.resume_cascades()
        if found:
            log.info("cascades_resumed steps=%d", found)

    def expire() -> None:
        result = scheduler.expire()
        if any(result.values()):
            log.info("leases_expired %s", " ".join(f"{k}={v}" for k, v in result.items()))

    def fairshare() -> None:
        scheduler.refresh_fairshare()
        scheduler.age_queue()

    def begin_due() -> None:
        begun = scheduler.begin_due()
        if begun:
            log.info("jobs_begin_time n=%d", begun)

    def preempt() -> None:
        asked = scheduler.preempt()
        if asked:
            log.info("task_preempt_requested tasks=%s", ",".join(map(str, asked)))

    def reclaim_idle() -> None:
        done = scheduler.reclaim_idle()
        if done:
            log.info("idle_tasks %s", " ".join(f"{task}={action}" for task, action in done))

    def reserve() -> None:
        scheduler.plan_reservations()

    def drains() -> None:
        drained = scheduler.advance_drains()
        if drained:
            log.info("workers_drained n=%d", drained)

    def rollouts() -> None:
        moved = scheduler.advance_rollouts()
        if moved:
            log.info("rollout_moves n=%d", moved)

    def service_drains() -> None:
        stopped = scheduler.advance_service_drains()
        if stopped:
            log.info("replicas_drained tasks=%s", ",".join(map(str, stopped)))

    def autoscale() -> None:
        for made in scheduler.autoscale():
            log.info("service_scaled job_id=%d from=%d to=%d why=%s", made["job_id"], made["from"], made["to"], made["why"])

    def prune() -> bool:  # a backlog (a first start after an upgrade) goes on at the next tick
        return bool(retention.prune(deps.store, now=deps.clock(), log_retention_s=config.log_retention_s,
                                    job_retention_s=config.job_retention_s,
                                    gpu_sample_retention_s=config.gpu_sample_retention_s)["done"])

    def sweep() -> None:
        retention.sweep(deps.store, deps.artifacts, now=deps.clock(), retention_s=config.artifact_retention_s,
                        unnamed_retention_s=config.unnamed_retention_s)
        deps.artifacts.sweep_tmp()

    def estimates() -> None:  # on a thread of its own (runtime/estimates.py): no other job waits for it
        scheduler.estimates.tick(scheduler.generation)

    return [Job("cascades", 0, cascades), Job("expire", 0, expire),
            Job("fairshare", ledger.RUNNING_REFRESH_S, fairshare), Job("begin_due", 0, begin_due),
            Job("preempt", 0, preempt), Job("idle", config.idle_check_interval_s, reclaim_idle),
            Job("reservations", 0, reserve), Job("drains", 0, drains),
            Job("rollouts", 0, rollouts, due_in=scheduler.rollout_due_in), Job("autoscale", 0, autoscale),
            Job("service_drains", 0, service_drains),
            Job("prune", config.prune_interval_s, prune, first_s=min(config.prune_interval_s, 60.0)),
            Job("sweep", config.artifact_sweep_interval_s, sweep, first_s=config.artifact_sweep_interval_s),
            Job("estimates", 0, estimates)]


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def relay_hub(deps: Deps) -> Hub:
    """The relay over this plane's scheduler (the streams a stopped plane left open closed in its rows first)."""
    closed = deps.scheduler.sessions_left_closed()
    if closed:
        log.info("relay_sessions_closed_at_start count=%d", closed)
    config = deps.config
    return Hub(deps.scheduler, deps.auth, deps.clock,
               RelaySettings(config.relay_max_streams_per_user, config.relay_max_streams_per_job,
                             config.relay_idle_timeout_s, config.relay_connect_timeout_s))


def configure_logging(level: int = logging.INFO) -> None:
    """One line per event at `level` or above on stderr, each with its time (`server start`; `gpulayer up`
    asks for warnings only, unless --verbose), unless set up already."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=level, format=LOG_FORMAT)


def stamped(message: str) -> str:
    """`message` after the time, as the log lines show it, for what is printed beside them."""
    return f"{logging.Formatter().formatTime(logging.makeLogRecord({}))} {message}"


def settings_line(config: ControlPlaneConfig) -> str:
    """The settings an operator checks in the log (`key=value ...`): retention, notifications, policy, quotas. The SMTP
    server is named by host and port, never with its password."""
    from urllib.parse import urlsplit
    smtp = "none"
    if config.smtp_url:
        parts = urlsplit(config.smtp_url)
        smtp = f"{parts.scheme}://{parts.hostname}:{parts.port or (465 if parts.scheme == 'smtps' else 25)}"
    given = {
        "log_retention_s": config.log_retention_s, "job_retention_s": config.job_retention_s,
        "gpu_sample_retention_s": config.gpu_sample_retention_s, "allow_private_webhooks": config.allow_private_webhooks,
        "smtp": smtp, "smtp_from": config.smtp_from, "webhook_concurrency": config.webhook_concurrency,
        "webhook_retry_base_s": config.webhook_retry_base_s, "webhook_retry_for_s": config.webhook_retry_for_s,
        "preempt_grace_s": config.preempt_grace_s, "max_grace_s": config.max_grace_s,
        "max_queued_elements": config.max_queued_elements, "fairshare_half_life_s": config.fairshare_half_life_s,
        "checkpoint_keep": config.checkpoint_keep, "read_timeout_s": config.read_timeout_s,
        "backfill": config.backfill, "backfill_depth": config.backfill_depth,
        "backfill_max_jobs": config.backfill_max_jobs, "default_runtime_s": config.default_runtime_s,
        "upload_quota_mb": config.upload_quota_bytes // 1024 ** 2,
        "project_upload_quota_mb": config.project_upload_quota_bytes // 1024 ** 2,
        "unnamed_retention_s": config.unnamed_retention_s,
        "estimate_interval_s": config.estimate_interval_s, "estimate_max_jobs": config.estimate_max_jobs,
        "estimate_horizon_s": config.estimate_horizon_s,
    }
    return " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                    for k, v in given.items())


def new_plane(config: ControlPlaneConfig, *, lock: HomeLock | None = None) -> ControlPlane:
    """The control plane `config` asks for: this process (--front-ends 1), or a supervisor of a writer process
    and N front-end processes (server/multiproc/, the same start, stop, url and fenced). Raises ConfigError."""
    if config.front_ends > 1:
        from gpulayer.server.multiproc.supervisor import Supervisor
        check_config(config)
        return Supervisor(config, lock=lock)  # type: ignore[return-value]  # the same start/stop/url/fenced
    return ControlPlane(config, lock=lock)


def run_server(config: ControlPlaneConfig) -> int:
    """Serve until SIGTERM or SIGINT; returns the exit code. Raises ConfigError for bad settings."""
    configure_logging()
    plane = new_plane(config)
    stopping = threading.Event()

    def _on_signal(signum, frame):
        stopping.set()

    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        plane.start()
        print(stamped(f"GPUlayer control plane listening on {plane.url}"), flush=True)
        while not stopping.wait(0.5):
            if plane.fenced.is_set():
                print(stamped("gpulayer server: another control plane took the replica's lease (a restore): "
                              "this one stops serving"), file=sys.stderr, flush=True)
                return 3
    finally:
        plane.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def backup(home: Path, dest: Path) -> dict:
    """A consistent online copy of the state file (SQLite backup API) while the server runs."""
    config = ControlPlaneConfig(home=Path(home))
    source = config.layout.state
    if not source.exists():
        raise ConfigError(f"no state file at {source}")
    dest = Path(dest)
    try:  # the copy holds every secret's ciphertext and token hash: the owner's alone
        os.close(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        raise ConfigError(f"{dest} exists already: choose a new file") from None
    except OSError as exc:
        raise ConfigError(f"cannot create {dest}: {exc.strerror}") from None
    src = apsw.Connection(str(source), flags=apsw.SQLITE_OPEN_READONLY)
    src.set_busy_timeout(10_000)
    out = apsw.Connection(str(dest))
    try:
        with out.backup("main", src, "main") as b:
            while not b.done:
                b.step(1024)
        check = out.execute("PRAGMA integrity_check").fetchall()[0][0]
        jobs = out.execute(QUERIES["count_jobs"]).fetchall()[0][0]
    finally:
        out.close()
        src.close()
    return {"dest": str(dest), "integrity_check": check, "jobs": jobs}
