"""Control-plane settings and the layout of $GPULAYER_HOME."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

PROTOCOL = 1

# Defaults named once (protocol-v1.md, "Defaults").
HEARTBEAT_INTERVAL_S = 2.0
LEASE_TTL_S = 20.0
DEFAULT_PORT = 8470
MAX_JSON_BODY = 1024 * 1024
MAX_ACQUIRE_WAIT_S = 30.0
START_TIMEOUT_S = 120.0          # a gang with a rank not started by then goes back to the queue whole
RENDEZVOUS_TIMEOUT_S = 300.0     # a gang whose ranks do not all arrive by then fails the attempt
ARTIFACT_RETENTION_S = 7 * 86400
ARTIFACT_SWEEP_INTERVAL_S = 3600.0
LOG_RETENTION_S = 14 * 86400     # log lines of a job that ended this long ago are pruned
JOB_RETENTION_S = 30 * 86400     # ended jobs (tasks, events, lines), loose events, departed workers
PRUNE_INTERVAL_S = 300.0         # upkeep prunes this often, in small batches
SERVICE_MAX_ATTEMPTS = 10
MAX_OUTPUT_BYTES = 10 * 1024 ** 3  # a task output a worker uploads; clients' uploads have the store's limit


def default_home() -> Path:
    """$GPULAYER_HOME, else ~/.gpulayer."""
    return Path(os.environ.get("GPULAYER_HOME") or Path.home() / ".gpulayer").expanduser()


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
    synchronous: str = "normal"
    threads: int = 320           # requests served at once; a parked long-poll holds one
    max_parked_acquires: int = 256
    # Log long-polls parked at once; past it they answer at once (`retry_after_s`). With the
    # acquires' cap this leaves threads free for heartbeats whatever clients do.
    max_parked_log_polls: int = 32
    max_output_bytes: int = MAX_OUTPUT_BYTES  # one artifact a worker uploads (`--max-output-mb`)
    start_timeout_s: float = START_TIMEOUT_S
    rendezvous_timeout_s: float = RENDEZVOUS_TIMEOUT_S
    artifact_retention_s: float = ARTIFACT_RETENTION_S
    artifact_sweep_interval_s: float = ARTIFACT_SWEEP_INTERVAL_S
    log_retention_s: float = LOG_RETENTION_S
    job_retention_s: float = JOB_RETENTION_S
    prune_interval_s: float = PRUNE_INTERVAL_S

    @property
    def layout(self) -> HomeLayout:
        return HomeLayout(Path(self.home).expanduser())
