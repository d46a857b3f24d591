"""`gpulayer server ...` (start, prune, backup), `up`, `explore` and `artifacts gc`: the control plane's side."""
from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from gpulayer.cli.common import FrontEnds, duration_option, fail, global_options, home_of, parse_pairs, print_json
from gpulayer.cli.idle_options import (IdleActionOpt, IdleBelowOpt, IdleCheckOpt, IdleTimeoutOpt, IdleWarningOpt,
                                       fleet_settings)
from gpulayer.cli.workers import (
    SANDBOX_DEFAULT, AllowRootTasks, Labels, Name, Python, RunAs, SandboxBind, SandboxMode, sandbox_settings,
)
from gpulayer.protocol import (
    DEFAULT_PORT, GPU_SAMPLE_RETENTION_S, HEARTBEAT_INTERVAL_S, JOB_RETENTION_S, LEASE_TTL_S, LOG_RETENTION_S, MAX_OUTPUT_BYTES,
    BACKFILL_DEPTH, BACKFILL_MAX_JOBS, DEFAULT_RUNTIME_S, MAX_BACKFILL_DEPTH, MAX_BACKFILL_MAX_JOBS,
    FAIRSHARE_HALF_LIFE_S, MAX_HEARTBEATS_PER_S, MAX_GRACE_S, MAX_QUEUED_ELEMENTS, PREEMPT_GRACE_S, PRIORITY_CLASSES, plural,
    PROJECT_UPLOAD_QUOTA_BYTES, UNNAMED_RETENTION_S, UPLOAD_QUOTA_BYTES,
)

server_app = typer.Typer(help="Initialise, run and back up a control plane.", no_args_is_help=True)
artifacts_app = typer.Typer(help="The control plane's artifact store.", no_args_is_help=True)

Home = Annotated[Optional[Path], typer.Option("--home", envvar="GPULAYER_HOME", show_envvar=True,
                                              help="The control plane's home directory (default ~/.gpulayer).")]


# Every duration option takes what gpulayer.protocol.parse_duration reads (90, 30m, 12h, 1:00:00, 2-00:00:00);
# its callback turns the text into seconds, so the command receives a float.
LogRetention = Annotated[Optional[str], typer.Option(
    "--log-retention", callback=duration_option("--log-retention", positive=True), metavar="DURATION",
    help=f"Prune the log lines of jobs that ended this long ago (30d, 12h, 90s; default {LOG_RETENTION_S // 86400:g}d).")]
JobRetention = Annotated[Optional[str], typer.Option(
    "--job-retention", callback=duration_option("--job-retention", positive=True), metavar="DURATION",
    help=f"Prune ended jobs (tasks, events, logs), loose events and departed workers this old "
         f"(default {JOB_RETENTION_S // 86400:g}d).")]

GpuSampleRetention = Annotated[Optional[str], typer.Option(
    "--gpu-sample-retention", callback=duration_option("--gpu-sample-retention", positive=True), metavar="DURATION",
    help=f"Prune GPU utilization and memory samples (the gpu_samples table) this old "
         f"(default {GPU_SAMPLE_RETENTION_S // 86400:g}d).")]


def _retention(log_retention, job_retention, gpu_sample_retention=None) -> dict:
    """ControlPlaneConfig's retention settings that were given."""
    given = {"log_retention_s": log_retention, "job_retention_s": job_retention,
             "gpu_sample_retention_s": gpu_sample_retention}
    return {k: v for k, v in given.items() if v is not None}


def _smtp_url(value: Optional[str]) -> Optional[str]:
    """--smtp-url checked (smtp:// or smtps://, a host): a usage error otherwise."""
    if value is None:
        return None
    from urllib.parse import urlsplit
    try:
        parts = urlsplit(value)
        _ = parts.port   # a bad port raises here
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--smtp-url") from None
    if parts.scheme not in ("smtp", "smtps") or not parts.hostname:
        raise typer.BadParameter(f"expected smtp://host[:port] or smtps://host[:port], got {value!r}",
                                 param_hint="--smtp-url")
    return value


# Notifications (docs/notifications.md): `server start` and `up` take them alike.
AllowPrivateWebhooks = Annotated[bool, typer.Option(
    "--allow-private-webhooks",
    help="Let webhooks target loopback, private and link-local addresses (refused by default: a webhook "
         "URL is a request the server makes; docs/notifications.md).")]
SmtpUrl = Annotated[Optional[str], typer.Option(
    "--smtp-url", metavar="URL", callback=_smtp_url,
    help="The SMTP server mail goes through: smtp://host[:25] (STARTTLS when offered) or smtps://host[:465]; "
         "user:password@ before the host to log in. Without it no mail is sent.")]
SmtpFrom = Annotated[str, typer.Option("--smtp-from", metavar="ADDR", help="The From address of the mail it sends.")]
WebhookRetryBase = Annotated[str, typer.Option(
    "--webhook-retry-base", callback=duration_option("--webhook-retry-base", positive=True), metavar="DURATION",
    help="The wait before a failed delivery's first retry; it doubles each try, up to 1 h.")]
WebhookRetryFor = Annotated[str, typer.Option(
    "--webhook-retry-for", callback=duration_option("--webhook-retry-for", positive=True), metavar="DURATION",
    help="How long a delivery is retried before it is marked failed and skipped.")]
WebhookConcurrency = Annotated[int, typer.Option(
    "--webhook-concurrency", min=1, max=256, metavar="N",
    help="Deliveries (webhooks and mail) tried at once, by the delivery process.")]

# The relay and the ingress (docs/access.md): caps and deadlines.
RelayMaxStreamsPerUser = Annotated[int, typer.Option(
    "--relay-max-streams-per-user", min=1, metavar="N",
    help="Relay streams (gpulayer exec) one user may have open at once (docs/access.md).")]
RelayMaxStreamsPerJob = Annotated[int, typer.Option(
    "--relay-max-streams-per-job", min=1, metavar="N", help="Relay streams open at once into one job's tasks.")]
RelayIdleTimeout = Annotated[str, typer.Option(
    "--relay-idle-timeout", callback=duration_option("--relay-idle-timeout", positive=True), metavar="DURATION",
    help="A relay stream that carries nothing either way this long is closed (seconds, 30m, 1h, ...).")]
IngressMaxRequestsPerJob = Annotated[int, typer.Option(
    "--ingress-max-requests-per-job", min=1, metavar="N",
    help="Requests (and WebSockets) through one service's ingress at once; past it 503 ingress_full.")]
IngressMaxRequestsPerClient = Annotated[int, typer.Option(
    "--ingress-max-requests-per-client", min=1, metavar="N",
    help="Requests through the ingress at once from one client address (behind a reverse proxy: all of "
         "them); past it 429 too_many_requests.")]
EstimateInterval = Annotated[str, typer.Option(
    "--estimate-interval", callback=duration_option("--estimate-interval", positive=True), metavar="DURATION",
    help="Start-time estimates: a forecast of the waiting jobs at least this often, sooner as the queue changes "
         "(docs/scheduling-time.md).")]
EstimateMaxJobs = Annotated[int, typer.Option(
    "--estimate-max-jobs", min=0, metavar="N",
    help="Start-time estimates: the waiting jobs a forecast estimates, best first; the rest answer null with a reason.")]
EstimateHorizon = Annotated[str, typer.Option(
    "--estimate-horizon", callback=duration_option("--estimate-horizon", positive=True), metavar="DURATION",
    help="Start-time estimates: a start later than this after now is not estimated (null, beyond the horizon).")]
ReadTimeout = Annotated[str, typer.Option(
    "--read-timeout", callback=duration_option("--read-timeout", positive=True), metavar="DURATION",
    help="One read of the state file past this is stopped and answered 503 read_timeout (seconds, 1m, ...).")]
IngressSendTimeout = Annotated[str, typer.Option(
    "--ingress-send-timeout", callback=duration_option("--ingress-send-timeout", positive=True), metavar="DURATION",
    help="An ingress client that reads nothing of its answer this long is dropped (seconds, 2m, ...).")]


class Synchronous(str, Enum):
    normal = "normal"
    full = "full"


class FrontEnd(str, Enum):
    granian = "granian"
    cheroot = "cheroot"


FairshareHalfLife = Annotated[Optional[str], typer.Option(
    "--fairshare-half-life", callback=duration_option("--fairshare-half-life", positive=True), metavar="DURATION",
    help="Fair share forgets half of a project's past usage in this long (default 7d; docs/teams.md).")]
PreemptGrace = Annotated[str, typer.Option(
    "--preempt-grace", callback=duration_option("--preempt-grace"), metavar="DURATION",
    help="Time a preempted task has between SIGTERM and SIGKILL (seconds, or 30s, 2m, ...).")]
MaxGrace = Annotated[str, typer.Option(
    "--max-grace", callback=duration_option("--max-grace"), metavar="DURATION",
    help="The most a job's --grace may ask for between its stop signal and SIGKILL.")]
class OnOff(str, Enum):
    on = "on"
    off = "off"


BackfillOpt = Annotated[OnOff, typer.Option(
    "--backfill", help="Reservations with EASY backfill: the highest-ranked waiting job of each group of workers holds "
                       "the room it can start in earliest, and other work uses it only if expected to end before "
                       "(docs/scheduling-time.md). off: any queued task that fits takes free room.")]
BackfillDepth = Annotated[int, typer.Option(
    "--backfill-depth", min=1, max=MAX_BACKFILL_DEPTH, metavar="N",
    help="Reservations each group of workers (those a job could ever run on) holds: its N highest-ranked waiting jobs'.")]
BackfillMaxJobs = Annotated[int, typer.Option(
    "--backfill-max-jobs", min=1, max=MAX_BACKFILL_MAX_JOBS, metavar="N",
    help="Waiting jobs each plan of reservations looks at, best first (Slurm's bf_max_job_test).")]
DefaultRuntime = Annotated[str, typer.Option(
    "--default-runtime", callback=duration_option("--default-runtime", positive=True), metavar="DURATION",
    help="How long a task with no time limit and fewer than 3 earlier runs of its name (or command) is expected to "
         "run, for reservations and backfill (seconds, 1h, ...).")]
FrontEndOpt = Annotated[FrontEnd, typer.Option("--http", help="The HTTP front end: granian (compiled, the default), or cheroot (pure Python; docs/benchmarks/early.md, \"Front ends\").")]

HeartbeatInterval = Annotated[str, typer.Option("--heartbeat-interval", callback=duration_option("--heartbeat-interval", positive=True), metavar="DURATION", help="Time between worker heartbeats (seconds, or 2s, 1m, ...).")]
LeaseTTL = Annotated[str, typer.Option("--lease-ttl", callback=duration_option("--lease-ttl", positive=True), metavar="DURATION", help="Time without a heartbeat before a worker's tasks are lost (seconds, or 20s, 1m, ...).")]
SynchronousOpt = Annotated[Synchronous, typer.Option("--synchronous", help="SQLite synchronous: normal (fast) or full (survives power loss).")]
MaxOutputMB = Annotated[int, typer.Option("--max-output-mb", help="Largest task output a worker may upload, in MiB.", min=1)]
UploadQuotaMB = Annotated[int, typer.Option(
    "--upload-quota-mb", min=0, metavar="MIB",
    help="The most a user's uploads that no job names yet may hold, in MiB (413 upload_quota_exceeded past it; "
         "admins are not bound); 0: no quota.")]
ProjectUploadQuotaMB = Annotated[int, typer.Option(
    "--project-upload-quota-mb", min=0, metavar="MIB",
    help="The same for a project: the uploads of its members that are in it alone; 0: no quota.")]
UnnamedRetention = Annotated[str, typer.Option(
    "--unnamed-retention", callback=duration_option("--unnamed-retention", positive=True), metavar="DURATION",
    help="An upload that no job has named is swept after this long (the artifact retention, 7d, for the rest).")]
Replicate = Annotated[Optional[str], typer.Option(
    "--replicate", metavar="URL",
    help="Stream the state file to this replica with Litestream: a directory (a mounted disk, NFS) or a "
         "Litestream URL (s3://, sftp://). docs/operations.md, \"Losing the control plane's machine\".")]
ReplicateInterval = Annotated[str, typer.Option(
    "--replicate-interval", callback=duration_option("--replicate-interval", positive=True), metavar="DURATION",
    help="Time between Litestream's syncs to the replica (what a loss can cost): 0.05 to 3600 seconds, or 1m, ...")]

MaxQueuedElements = Annotated[int, typer.Option(
    "--max-queued-elements", min=0, metavar="N",
    help="A user's tasks (array elements) not yet ended, at most: a submit past it is refused (429 "
         "too_many_queued); 0: no cap.")]
PriorityClass = Annotated[Optional[list[str]], typer.Option(
    "--priority-class", metavar="NAME=N",
    help="A named priority `--priority` accepts, besides low=-10, normal=0, high=10 (repeatable).")]
CheckpointKeep = Annotated[int, typer.Option(
    "--checkpoint-keep", min=1, metavar="N",
    help="Checkpoints kept per job element or rank, newest first; older ones go, and the artifact sweep "
         "their files (docs/training.md).")]

@server_app.command("init")
def server_init(ctx: typer.Context, home: Home = None,
                as_json: Annotated[bool, typer.Option("--json", help="Print the tokens as JSON.")] = False,
                force: Annotated[bool, typer.Option("--force", help="Rotate both tokens of an initialised home.")] = False) -> None:
    """Create the server secret and the client and join tokens (shown once; only hashes are kept).

    \b
    Example:
      gpulayer server init --home /srv/gpulayer
    """
    from gpulayer.server.process import init_home
    where = home_of(ctx, home)
    tokens = init_home(where, force=True) if force else init_home(where)
    if as_json:
        print_json({"home": str(where), **tokens})
        return
    typer.echo(f"initialised {where}")
    typer.echo(f"client token: {tokens['client_token']}   (GPULAYER_TOKEN for the CLI and Python client)")
    typer.echo(f"join token:   {tokens['join_token']}   (GPULAYER_JOIN_TOKEN for workers)")
    typer.echo("Both are shown once: store them now.", err=True)


MaxHeartbeatsPerS = Annotated[float, typer.Option(
    "--max-heartbeats-per-s", min=0, metavar="N",
    help="Heartbeats a second the whole fleet aims under: past it the interval asked of workers (and their "
         "lease TTL) grows with the fleet, never below --heartbeat-interval; 0: never.")]


@server_app.command("start")
def server_start(
    ctx: typer.Context,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on (0: any free one).", min=0, max=65535)] = DEFAULT_PORT,
    tls_cert: Annotated[Optional[Path], typer.Option("--tls-cert", help="PEM certificate (chain) for HTTPS.")] = None,
    tls_key: Annotated[Optional[Path], typer.Option("--tls-key", help="PEM private key for HTTPS.")] = None,
    allow_insecure_remote: Annotated[bool, typer.Option("--allow-insecure-remote", help="Allow plain HTTP on a non-loopback address (behind a TLS proxy you control).")] = False,
    home: Home = None,
    heartbeat_interval: HeartbeatInterval = f"{HEARTBEAT_INTERVAL_S:g}",
    lease_ttl: LeaseTTL = f"{LEASE_TTL_S:g}",
    synchronous: SynchronousOpt = Synchronous.normal,
    max_output_mb: MaxOutputMB = MAX_OUTPUT_BYTES // 1024 ** 2,
    log_retention: LogRetention = None,
    job_retention: JobRetention = None,
    gpu_sample_retention: GpuSampleRetention = None, http: FrontEndOpt = FrontEnd.granian, front_ends: FrontEnds = 1,
    replicate: Replicate = None,
    replicate_interval: ReplicateInterval = "1",
    fairshare_half_life: FairshareHalfLife = None,
    preempt_grace: PreemptGrace = f"{PREEMPT_GRACE_S:g}",
    max_grace: MaxGrace = f"{MAX_GRACE_S:g}",
    max_queued_elements: MaxQueuedElements = MAX_QUEUED_ELEMENTS,
    priority_class: PriorityClass = None,
    max_heartbeats_per_s: MaxHeartbeatsPerS = MAX_HEARTBEATS_PER_S,
    checkpoint_keep: CheckpointKeep = 3,
    upload_quota_mb: UploadQuotaMB = UPLOAD_QUOTA_BYTES // 1024 ** 2,
    project_upload_quota_mb: ProjectUploadQuotaMB = PROJECT_UPLOAD_QUOTA_BYTES // 1024 ** 2,
    unnamed_retention: UnnamedRetention = f"{UNNAMED_RETENTION_S:g}",
    relay_max_streams_per_user: RelayMaxStreamsPerUser = 16,
    relay_max_streams_per_job: RelayMaxStreamsPerJob = 32,
    relay_idle_timeout: RelayIdleTimeout = "3600",
    ingress_max_requests_per_job: IngressMaxRequestsPerJob = 128,
    ingress_max_requests_per_client: IngressMaxRequestsPerClient = 32,
    ingress_send_timeout: IngressSendTimeout = "60",
    allow_private_webhooks: AllowPrivateWebhooks = False,
    smtp_url: SmtpUrl = None,
    smtp_from: SmtpFrom = "gpulayer@localhost",
    webhook_retry_base: WebhookRetryBase = "5",
    webhook_retry_for: WebhookRetryFor = "24h",
    webhook_concurrency: WebhookConcurrency = 16,
    read_timeout: ReadTimeout = "10",
    backfill: BackfillOpt = OnOff.on,
    backfill_depth: BackfillDepth = BACKFILL_DEPTH,
    backfill_max_jobs: BackfillMaxJobs = BACKFILL_MAX_JOBS,
    default_runtime: DefaultRuntime = f"{DEFAULT_RUNTIME_S:g}",
    estimate_interval: EstimateInterval = "30",
    estimate_max_jobs: EstimateMaxJobs = 500,
    estimate_horizon: EstimateHorizon = "7d", idle_timeout: IdleTimeoutOpt = None, idle_below: IdleBelowOpt = None,
    idle_action: IdleActionOpt = None, idle_warning: IdleWarningOpt = "10m", idle_check_interval: IdleCheckOpt = "10s",
) -> None:
    """Run the control plane in the foreground until SIGTERM or Ctrl-C.

    \b
    Example:
      gpulayer server start --host 0.0.0.0 --tls-cert server.pem --tls-key server-key.pem
    """
    if bool(tls_cert) != bool(tls_key):
        raise typer.BadParameter("give both --tls-cert and --tls-key, or neither", param_hint="--tls-key")
    from gpulayer.server.config import ControlPlaneConfig
    from gpulayer.server.process import run_server
    config = ControlPlaneConfig(home=home_of(ctx, home), host=host, port=port, tls_cert=tls_cert,
                                tls_key=tls_key, allow_insecure_remote=allow_insecure_remote, http=http.value,
                                front_ends=front_ends,
                                replicate=replicate, replicate_interval_s=float(replicate_interval),
                                max_heartbeats_per_s=max_heartbeats_per_s,
                                **_policy_settings(preempt_grace, max_grace, max_queued_elements, priority_class,
                                                   fairshare_half_life, checkpoint_keep, read_timeout),
                                **_time_settings(backfill, backfill_depth, backfill_max_jobs, default_runtime,
                                                 estimate_interval, estimate_max_jobs, estimate_horizon),
                                **_upload_settings(upload_quota_mb, project_upload_quota_mb, unnamed_retention),
                                **_relay_settings(relay_max_streams_per_user, relay_max_streams_per_job, relay_idle_timeout,
                                                  ingress_max_requests_per_job, ingress_max_requests_per_client,
                                                  ingress_send_timeout),
                                **_notify_settings(allow_private_webhooks, smtp_url, smtp_from, webhook_retry_base,
                                                   webhook_retry_for, webhook_concurrency),
                                **_plane_settings(heartbeat_interval, lease_ttl, synchronous, max_output_mb,
                                                  log_retention, job_retention, gpu_sample_retention),
                                **fleet_settings(idle_timeout, idle_below, idle_action, idle_warning, idle_check_interval, float(heartbeat_interval)))
    raise typer.Exit(run_server(config) or 0)


def _notify_settings(allow_private_webhooks, smtp_url, smtp_from, webhook_retry_base, webhook_retry_for,
                     webhook_concurrency) -> dict:
    """The ControlPlaneConfig fields of notifications (docs/notifications.md) that `server start` and `up` take."""
    return dict(allow_private_webhooks=allow_private_webhooks, smtp_url=smtp_url, smtp_from=smtp_from,
                webhook_retry_base_s=float(webhook_retry_base), webhook_retry_for_s=float(webhook_retry_for),
                webhook_concurrency=webhook_concurrency)


def _policy_settings(preempt_grace, max_grace, max_queued_elements, priority_class, fairshare_half_life,
                     checkpoint_keep, read_timeout) -> dict:
    """The ControlPlaneConfig fields of scheduling policy and reads that `server start` and `up` take."""
    return dict(preempt_grace_s=float(preempt_grace), max_grace_s=float(max_grace),
                max_queued_elements=max_queued_elements,
                priority_classes={**PRIORITY_CLASSES, **_priority_classes(priority_class)},
                fairshare_half_life_s=float(fairshare_half_life) if fairshare_half_life else FAIRSHARE_HALF_LIFE_S,
                checkpoint_keep=checkpoint_keep, read_timeout_s=float(read_timeout))


def _time_settings(backfill, depth, max_jobs, default_runtime, estimate_interval, estimate_max_jobs,
                   estimate_horizon) -> dict:
    """The ControlPlaneConfig fields of reservations, backfill and start-time estimates (docs/scheduling-time.md)
    that `server start` and `up` take."""
    return dict(backfill=backfill == OnOff.on, backfill_depth=depth, backfill_max_jobs=max_jobs,
                default_runtime_s=float(default_runtime), estimate_interval_s=float(estimate_interval),
                estimate_max_jobs=estimate_max_jobs, estimate_horizon_s=float(estimate_horizon))


def _upload_settings(upload_quota_mb, project_upload_quota_mb, unnamed_retention) -> dict:
    """The ControlPlaneConfig fields of the upload quotas and the unnamed uploads' life (docs/operations.md)."""
    return dict(upload_quota_bytes=upload_quota_mb * 1024 ** 2,
                project_upload_quota_bytes=project_upload_quota_mb * 1024 ** 2,
                unnamed_retention_s=float(unnamed_retention))


def _relay_settings(per_user, per_job, idle_timeout, ingress_per_job, ingress_per_client, send_timeout) -> dict:
    """The ControlPlaneConfig fields of the relay's and the ingress's caps and deadlines."""
    return dict(relay_max_streams_per_user=per_user, relay_max_streams_per_job=per_job,
                relay_idle_timeout_s=float(idle_timeout), ingress_max_requests_per_job=ingress_per_job,
                ingress_max_requests_per_client=ingress_per_client, ingress_send_timeout_s=float(send_timeout))


def _priority_classes(values: Optional[list[str]]) -> dict[str, int]:
    """--priority-class NAME=N, as {name: number}; a usage error otherwise."""
    found = {}
    for name, number in parse_pairs(values, "--priority-class").items():
        if not re.fullmatch(r"[a-z][a-z0-9_-]{0,31}", name) or not re.fullmatch(r"-?\d{1,7}", number.strip()):
            raise typer.BadParameter(f"expected NAME=N (a lowercase name, an integer), got {name}={number}",
                                     param_hint="--priority-class")
        found[name] = int(number)
    return found


def _plane_settings(heartbeat_interval, lease_ttl, synchronous, max_output_mb, log_retention,
                    job_retention, gpu_sample_retention=None) -> dict:
    """The ControlPlaneConfig fields that `server start` and `up` both take."""
    return dict(heartbeat_interval_s=float(heartbeat_interval), lease_ttl_s=float(lease_ttl), synchronous=synchronous.value,
                max_output_bytes=max_output_mb * 1024 ** 2,
                **_retention(log_retention, job_retention, gpu_sample_retention))


@server_app.command("prune")
def server_prune(ctx: typer.Context, home: Home = None,
                 dry_run: Annotated[bool, typer.Option("--dry-run", help="Count what would be removed; remove nothing.")] = False,
                 log_retention: LogRetention = None, job_retention: JobRetention = None,
                 gpu_sample_retention: GpuSampleRetention = None,
                 as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Apply retention now (as upkeep does on its own) and print what was removed; safe while the server runs.

    \b
    Example:
      gpulayer server prune --dry-run --job-retention 7d
    """
    from gpulayer.server.scheduler.retention import run_prune
    # The options' callback (duration_option) has turned their text into seconds.
    result = run_prune(home_of(ctx, home), dry_run=dry_run, log_retention_s=log_retention,  # type: ignore[arg-type]
                       job_retention_s=job_retention,  # type: ignore[arg-type]
                       gpu_sample_retention_s=gpu_sample_retention)  # type: ignore[arg-type]
    if as_json:
        print_json(result)
        return
    verb = "would remove" if dry_run else "removed"
    typer.echo(f"{verb} {plural(result['jobs'], 'job')}, {plural(result['log_lines'], 'log line')}, "
               f"{plural(result['events'], 'event')}, {plural(result['workers'], 'departed worker')}, "
               f"{plural(result['gpu_samples'], 'GPU sample')}")


@server_app.command("certs")
def server_certs(ctx: typer.Context, home: Home = None,
                 host: Annotated[Optional[list[str]], typer.Option("--host", metavar="NAME", help="A DNS name the certificate names (repeatable).")] = None,
                 ip: Annotated[Optional[list[str]], typer.Option("--ip", metavar="ADDR", help="An IP address the certificate names (repeatable).")] = None,
                 as_json: Annotated[bool, typer.Option("--json", help="Print the paths and fingerprint as JSON.")] = False) -> None:
    """Make (or reuse) the CA and a server certificate for `server start --tls-cert/--tls-key`, as `up` does.

    The certificate names localhost, this host's names and addresses, and each
    --host and --ip; the CA is made once and kept, so workers that pinned it
    notice nothing when the certificate is reissued.

    \b
    Example:
      gpulayer server certs --host cp.internal --ip 10.0.0.5
    """
    import ipaddress
    for address in ip or []:
        try:
            ipaddress.ip_address(address.strip("[]"))
        except ValueError:
            raise typer.BadParameter(f"{address!r} is not an IP address", param_hint="--ip") from None
    from gpulayer.server.config import HomeLayout
    from gpulayer.server.security.certs import ensure_tls
    where = home_of(ctx, home)
    where.mkdir(parents=True, exist_ok=True, mode=0o700)
    tls = ensure_tls(where, [*(host or []), *(ip or [])])
    if as_json:
        print_json({k: str(v) for k, v in tls.items()})
        return
    typer.echo(f"CA:          {tls['ca']}  ({tls['fingerprint']}, for --ca-file or join --ca-fingerprint)")
    typer.echo(f"certificate: {tls['cert']}")
    typer.echo(f"key:         {tls['key']}")
    # What to run next, on stderr: `server init` first on a home that has no tokens yet (start refuses it).
    at = f" --home {where}" if home or global_options(ctx).home else ""
    if not HomeLayout(where).credentials.exists():
        typer.echo(f"gpulayer server init{at}", err=True)
    typer.echo(f"gpulayer server start{at} --host 0.0.0.0 --tls-cert {tls['cert']} --tls-key {tls['key']}", err=True)


@server_app.command("rotate-join-token")
def server_rotate_join_token(ctx: typer.Context, home: Home = None) -> None:
    """Replace the join token of `server init`; the old one stops working (joined workers stay).

    \b
    Example:
      gpulayer server rotate-join-token --home /srv/gpulayer
    """
    from gpulayer.server.process import rotate_join_token
    typer.echo(rotate_join_token(home_of(ctx, home)))


@server_app.command("restore")
def server_restore(
    ctx: typer.Context,
    source: Annotated[str, typer.Option("--from", metavar="URL", help="The replica `server start --replicate` wrote: a directory or a Litestream URL.")],
    home: Home = None,
    timestamp: Annotated[Optional[str], typer.Option("--timestamp", help="Restore the state as it was at this time (RFC 3339, e.g. 2026-12-01T06:00:00Z) instead of the latest; the restored home then replicates to a new directory.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Restore although the replica's writer lease is fresh (only when its control plane is surely down).")] = False,
    home_files: Annotated[Optional[Path], typer.Option("--home-files", help="A copy of the old home's server-secret, server-credentials.json, secrets.key and tls/ (needed for a replica that is not a directory).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Rebuild a new home from a replica (state file and the home's files); then start it with `server start`.

    \b
    Example:
      gpulayer server restore --from /mnt/replica/gpulayer --home /srv/gpulayer
    """
    from gpulayer.server.replication.restore import restore
    result = restore(source, home_of(ctx, home), timestamp=timestamp, force=force, home_files_from=home_files)
    if as_json:
        print_json(result)
        return
    typer.echo(f"restored {result['home']} from {result['from']}: {plural(result['jobs'], 'job')}, "
               f"last event at {result['last_event_at']}, {plural(len(result['files']), 'home file')}")
    if result["timestamp"]:  # an older state: its history must not go into the replica that has the newer one
        typer.echo(f"start it with: gpulayer server start --home {result['home']} --replicate NEW_DIR "
                   f"(replicate to a new directory: {result['from']} holds a later history, and keeps its lease)",
                   err=True)
        return
    typer.echo("start it at the old address with: gpulayer server start --home " + result["home"]
               + f" --replicate {result['from']}", err=True)


@server_app.command("backup")
def server_backup(ctx: typer.Context,
                  dest: Annotated[Path, typer.Argument(help="File to write the copy of the state file to.")],
                  home: Home = None) -> None:
    """Take a consistent copy of the state file while the server runs (SQLite backup API).

    \b
    Example:
      gpulayer server backup /backups/state-$(date +%F).db
    """
    from gpulayer.server.process import backup
    result = backup(home_of(ctx, home), dest) or {}
    details = " ".join(f"{k}={v}" for k, v in result.items() if k != "dest")
    typer.echo(f"backed up to {dest} {details}".rstrip(), err=True)


def up(ctx: typer.Context, home: Home = None,
       host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "0.0.0.0",
       port: Annotated[int, typer.Option("--port", help="Port to listen on.", min=0, max=65535)] = DEFAULT_PORT,
       parallel: Annotated[Optional[int], typer.Option("--parallel", help="Tasks the local worker runs at once (default: CPU count).", min=1)] = None,
       heartbeat_interval: HeartbeatInterval = f"{HEARTBEAT_INTERVAL_S:g}", lease_ttl: LeaseTTL = f"{LEASE_TTL_S:g}",
       synchronous: SynchronousOpt = Synchronous.normal, max_output_mb: MaxOutputMB = MAX_OUTPUT_BYTES // 1024 ** 2,
       log_retention: LogRetention = None, job_retention: JobRetention = None,
       no_worker: Annotated[bool, typer.Option("--no-worker", help="Run no worker here: a control-plane-only host.")] = False,
       replicate: Replicate = None, replicate_interval: ReplicateInterval = "1",
       sandbox: SandboxMode = SANDBOX_DEFAULT, run_as: RunAs = None, allow_root_tasks: AllowRootTasks = False,
       sandbox_bind: SandboxBind = None, http: FrontEndOpt = FrontEnd.granian, front_ends: FrontEnds = 1,
       gpu_sample_retention: GpuSampleRetention = None,
       allow_private_webhooks: AllowPrivateWebhooks = False, smtp_url: SmtpUrl = None,
       smtp_from: SmtpFrom = "gpulayer@localhost", webhook_retry_base: WebhookRetryBase = "5",
       webhook_retry_for: WebhookRetryFor = "24h", webhook_concurrency: WebhookConcurrency = 16,
       preempt_grace: PreemptGrace = f"{PREEMPT_GRACE_S:g}", max_grace: MaxGrace = f"{MAX_GRACE_S:g}",
       max_queued_elements: MaxQueuedElements = MAX_QUEUED_ELEMENTS, priority_class: PriorityClass = None,
       fairshare_half_life: FairshareHalfLife = None, checkpoint_keep: CheckpointKeep = 3,
       backfill: BackfillOpt = OnOff.on, backfill_depth: BackfillDepth = BACKFILL_DEPTH,
       backfill_max_jobs: BackfillMaxJobs = BACKFILL_MAX_JOBS, default_runtime: DefaultRuntime = f"{DEFAULT_RUNTIME_S:g}",
       estimate_interval: EstimateInterval = "30", estimate_max_jobs: EstimateMaxJobs = 500,
       estimate_horizon: EstimateHorizon = "7d", idle_timeout: IdleTimeoutOpt = None, idle_below: IdleBelowOpt = None,
       idle_action: IdleActionOpt = None, idle_warning: IdleWarningOpt = "10m", idle_check_interval: IdleCheckOpt = "10s",
       read_timeout: ReadTimeout = "10", upload_quota_mb: UploadQuotaMB = UPLOAD_QUOTA_BYTES // 1024 ** 2,
       project_upload_quota_mb: ProjectUploadQuotaMB = PROJECT_UPLOAD_QUOTA_BYTES // 1024 ** 2,
       unnamed_retention: UnnamedRetention = f"{UNNAMED_RETENTION_S:g}",
       name: Name = None, label: Labels = None, python: Python = None,
       verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log every INFO line of the control plane and the worker on stderr (default: warnings and errors only).")] = False) -> None:
    """Start a control plane over TLS and a local worker; print the line that joins other machines.

    The local worker takes join's --name, --label and --python.

    \b
    Examples:
      gpulayer up
      gpulayer up --label pool=a100 --python ~/venv/bin/python
      gpulayer up --no-worker --port 8470
    """
    from gpulayer.cli.up import run_up
    if no_worker and (name or label or python):
        raise typer.BadParameter("--name, --label and --python are the local worker's: leave out --no-worker",
                                 param_hint="--no-worker")
    isolation = sandbox_settings(sandbox, run_as, allow_root_tasks, sandbox_bind)
    chosen = {"name": name, "labels": parse_pairs(label, "--label") or None, "python": python}
    isolation.update({k: v for k, v in chosen.items() if v})
    raise typer.Exit(run_up(home_of(ctx, home), host, port, parallel, not no_worker, worker_settings=isolation,
                            verbose=verbose,
                            replicate=replicate, http=http.value, front_ends=front_ends,
                            replicate_interval_s=float(replicate_interval),
                            **_plane_settings(heartbeat_interval, lease_ttl, synchronous, max_output_mb,
                                              log_retention, job_retention, gpu_sample_retention),
                            **_policy_settings(preempt_grace, max_grace, max_queued_elements, priority_class,
                                               fairshare_half_life, checkpoint_keep, read_timeout),
                            **_time_settings(backfill, backfill_depth, backfill_max_jobs, default_runtime,
                                             estimate_interval, estimate_max_jobs, estimate_horizon),
                            **_upload_settings(upload_quota_mb, project_upload_quota_mb, unnamed_retention),
                            **_notify_settings(allow_private_webhooks, smtp_url, smtp_from, webhook_retry_base,
                                               webhook_retry_for, webhook_concurrency),
                            **fleet_settings(idle_timeout, idle_below, idle_action, idle_warning, idle_check_interval,
                                             float(heartbeat_interval))))


def explore(ctx: typer.Context, home: Home = None,
            state: Annotated[Optional[Path], typer.Option("--state", help="State file to open (default: HOME/state.db).")] = None,
            host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
            port: Annotated[int, typer.Option("--port", help="Port to listen on.", min=0, max=65535)] = 8471,
            token_required: Annotated[bool, typer.Option("--token-required", help="Ask for the home's client token (`server init`); needed off loopback.")] = False) -> None:
    """Browse the state file read-only in a web page.

    \b
    Example:
      gpulayer explore   # then open http://127.0.0.1:8471
    """
    from gpulayer.server.config import HomeLayout
    from gpulayer.server.errors import ConfigError
    from gpulayer.server.security.auth import client_token_check
    import explorer
    where = home_of(ctx, home)
    path = state or HomeLayout(where).state
    if not Path(path).exists():
        raise fail(f"no state file at {path} (run `gpulayer server init` or `gpulayer up` first, or pass --state)", 2)
    try:
        auth = client_token_check(where) if token_required else None
        explorer.serve(str(path), host=host, port=port, auth=auth)
    except (ConfigError, explorer.Exposed) as e:
        raise fail(str(e), 2) from None
    except (OSError, ValueError) as e:   # waitress: the address is taken or does not resolve
        raise fail(f"cannot listen on {host} port {port}: {getattr(e, 'strerror', None) or e}", 2) from None


@artifacts_app.command("gc")
def artifacts_gc(ctx: typer.Context, home: Home = None,
                 dry_run: Annotated[bool, typer.Option("--dry-run", help="Print what would be removed; remove nothing.")] = False,
                 as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Remove artifacts no job references that are older than the retention period.

    \b
    Example:
      gpulayer artifacts gc --dry-run
    """
    from gpulayer.server.scheduler.retention import run_gc
    removed = run_gc(home_of(ctx, home), dry_run=dry_run)
    if as_json:
        print_json(removed)
        return
    for item in removed:
        typer.echo(item)
    verb = "would remove" if dry_run else "removed"
    typer.echo(f"{verb} {plural(len(removed), 'artifact')}", err=True)
