"""Control-plane settings and the layout of $GPULAYER_HOME."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpulayer.protocol import (  # noqa: F401  (re-exported: the settings below default to them)
    PROTOCOL, HEARTBEAT_INTERVAL_S, LEASE_TTL_S, MAX_HEARTBEATS_PER_S, HEARTBEAT_JITTER, DEFAULT_PORT, MAX_JSON_BODY, MAX_ACQUIRE_WAIT_S,
    START_TIMEOUT_S, RENDEZVOUS_TIMEOUT_S, ARTIFACT_RETENTION_S, ARTIFACT_SWEEP_INTERVAL_S,
    UNNAMED_RETENTION_S, UPLOAD_QUOTA_BYTES, PROJECT_UPLOAD_QUOTA_BYTES,
    LOG_RETENTION_S, JOB_RETENTION_S, GPU_SAMPLE_RETENTION_S, PRUNE_INTERVAL_S, SERVICE_MAX_ATTEMPTS, MAX_OUTPUT_BYTES,
    FAIRSHARE_HALF_LIFE_S, MAX_GRACE_S, PREEMPT_GRACE_S, PRIORITY_CLASSES, MAX_QUEUED_ELEMENTS,
    BACKFILL_DEPTH, BACKFILL_MAX_JOBS, DEFAULT_RUNTIME_S,
    default_home,
)
from gpulayer.server.store.db import READ_TIMEOUT_S


@dataclass(frozen=True)
class HomeLayout:
    """Where the control plane keeps its files under one home directory."""

    home: Path

    @property
    def state(self) -> Path:
        return self.home / "state.db"

    @property
    def secret(self) -> Path:
        return self.home / "server-secret"

    @property
    def credentials(self) -> Path:
        return self.home / "server-credentials.json"

    @property
    def secrets_key(self) -> Path:
        return self.home / "secrets.key"

    @property
    def artifacts(self) -> Path:
        return self.home / "artifacts"

    @property
    def tls(self) -> Path:
        return self.home / "tls"

    @property
    def client(self) -> Path:
        """What `gpulayer up` leaves for clients on this machine (url, token, ca_file)."""
        return self.home / "client.json"

    @property
    def provisioners(self) -> Path:
        return self.home / "provisioners.json"


@dataclass
class ControlPlaneConfig:
    """Everything `gpulayer server start` can set; defaults per protocol-v1.md."""

    home: Path = field(default_factory=default_home)
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    tls_cert: Path | None = None
    tls_key: Path | None = None
    allow_insecure_remote: bool = False
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S
    lease_ttl_s: float = LEASE_TTL_S
    # `--max-heartbeats-per-s`: past it the interval (and the TTL) grow with the fleet; 0: never (cadence.py).
    max_heartbeats_per_s: float = MAX_HEARTBEATS_PER_S
    heartbeat_jitter: float = HEARTBEAT_JITTER  # each answer's interval is 1 to 1 + this times the fleet's
    synchronous: str = "normal"
    threads: int = 320           # requests served at once; a parked long-poll holds one
    http: str = "granian"        # the front end serving /v1: "granian", or "cheroot" (docs/benchmarks/early.md, "Front ends")
    front_ends: int = 1          # `--front-ends`: past 1, a writer process and N front-end processes (server/multiproc/)
    max_parked_acquires: int = 256
    # Log long-polls parked at once; past it they answer at once (`retry_after_s`). With the
    # acquires' cap this leaves threads free for heartbeats whatever clients do.
    max_parked_log_polls: int = 32
    max_output_bytes: int = MAX_OUTPUT_BYTES  # one artifact a worker uploads (`--max-output-mb`)
    checkpoint_keep: int = 3  # checkpoints kept per job element or rank (`--checkpoint-keep`, docs/training.md)
    start_timeout_s: float = START_TIMEOUT_S
    rendezvous_timeout_s: float = RENDEZVOUS_TIMEOUT_S
    artifact_retention_s: float = ARTIFACT_RETENTION_S
    # Issue 36: uploads no job names yet live this long, and hold at most this much per user and per
    # project (`--unnamed-retention`, `--upload-quota-mb`, `--project-upload-quota-mb`; 0: no quota).
    unnamed_retention_s: float = UNNAMED_RETENTION_S
    upload_quota_bytes: int = UPLOAD_QUOTA_BYTES
    project_upload_quota_bytes: int = PROJECT_UPLOAD_QUOTA_BYTES
    artifact_sweep_interval_s: float = ARTIFACT_SWEEP_INTERVAL_S
    log_retention_s: float = LOG_RETENTION_S
    job_retention_s: float = JOB_RETENTION_S
    gpu_sample_retention_s: float = GPU_SAMPLE_RETENTION_S  # `--gpu-sample-retention`: gpu_samples rows kept
    prune_interval_s: float = PRUNE_INTERVAL_S
    read_timeout_s: float = READ_TIMEOUT_S  # `--read-timeout`: one read of the state file, at most (else a 503)
    fairshare_half_life_s: float = FAIRSHARE_HALF_LIFE_S  # `--fairshare-half-life` (docs/teams.md)
    preempt_grace_s: float = PREEMPT_GRACE_S                # `--preempt-grace`: SIGTERM, then SIGKILL after this
    max_grace_s: float = MAX_GRACE_S                        # `--max-grace`: the most a job's `grace_seconds` asks
    # Idle GPUs (issue 40, docs/workers.md "Idle GPUs"): the fleet's default idle policy (`--idle-timeout`, None:
    # none; `--idle-below` %, `--idle-action`), a warned interactive task's period (`--idle-warning`) and how
    # often upkeep checks (`--idle-check-interval`).
    idle_timeout_s: float | None = None
    idle_below_pct: float = 5.0
    idle_action: str = "notify"
    idle_warning_s: float = 600.0
    idle_check_interval_s: float = 10.0
    # Reservations with EASY backfill (issue 38, docs/scheduling-time.md): `--backfill on|off`, the reservations
    # each group of workers holds (`--backfill-depth`), the waiting jobs a plan looks at (`--backfill-max-jobs`,
    # Slurm's bf_max_job_test), and the run time a job with no time limit and no history is expected to take.
    backfill: bool = True
    backfill_depth: int = BACKFILL_DEPTH
    backfill_max_jobs: int = BACKFILL_MAX_JOBS
    default_runtime_s: float = DEFAULT_RUNTIME_S
    # `--max-queued-elements`: a user's tasks not yet ended (queued, held, running), at most; 0: no cap.
    max_queued_elements: int = MAX_QUEUED_ELEMENTS
    # Named priorities `--priority` accepts (`--priority-class NAME=N` adds or changes one).
    priority_classes: dict = field(default_factory=lambda: dict(PRIORITY_CLASSES))
    # Continuous replication (`--replicate`, server/replication/): a directory or a Litestream URL, or None.
    replicate: str | None = None
    replicate_interval_s: float = 1.0
    # The relay (issue 26, gpulayer/server/relay/): streams open at once per user and per job, the seconds
    # a stream may carry nothing before it is closed, and how long a stream waits for its agent's link.
    relay_max_streams_per_user: int = 16
    relay_max_streams_per_job: int = 32
    relay_idle_timeout_s: float = 3600.0
    relay_connect_timeout_s: float = 10.0
    # The ingress (issue 36, server/relay/ingress_limits.py): requests in flight at once per job and per client
    # address, and the seconds a client may leave its answer unread before it is dropped.
    ingress_max_requests_per_job: int = 128
    ingress_max_requests_per_client: int = 32
    ingress_send_timeout_s: float = 60.0
    # Notifications (issue 28, gpulayer/server/notify/, docs/notifications.md): webhooks to private addresses
    # (`--allow-private-webhooks`), tries at once, each try's timeout, the first retry's wait (doubling) and
    # how long an event is retried; the SMTP server mail goes through and its From; an alert query's limit.
    allow_private_webhooks: bool = False
    webhook_concurrency: int = 16
    webhook_timeout_s: float = 10.0
    webhook_retry_base_s: float = 5.0
    webhook_retry_for_s: float = 86400.0
    smtp_url: str | None = None
    smtp_from: str = "gpulayer@localhost"
    alert_time_limit_s: float = 2.0
    # Start-time estimates (issue 38, scheduler/forecast.py, docs/scheduling-time.md): a forecast at least
    # this often (`--estimate-interval`), of at most this many waiting jobs (`--estimate-max-jobs`), up to
    # this far ahead (`--estimate-horizon`).
    estimate_interval_s: float = 30.0
    estimate_max_jobs: int = 500
    estimate_horizon_s: float = 7 * 86400.0

    @property
    def layout(self) -> HomeLayout:
        return HomeLayout(Path(self.home).expanduser())
