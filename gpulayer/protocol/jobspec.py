"""The JobSpec, declared once: every field a job takes, its type, default, bounds and help.

The server validates a submitted job against this declaration
(gpulayer/server/scheduler/spec.py), the OpenAPI document's JobSpec is
generated from it (gpulayer/server/http/openapi.py), and so is the JobSpec
table of docs/protocol.md (scripts/gen_docs.py; a test fails when they drift).
The client's `gl.job()` settings are its field names. A field's rules that a
type and bounds cannot say (a relative path, an array's ranges) stay in spec.py.
"""
from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Literal

from gpulayer.protocol import MAX_ARRAY, MAX_ARRAY_INDEX
from gpulayer.protocol.fields import declare, json_schema, names

# Validating patterns are used with .fullmatch() (and end in \Z, so that even a .match() is as strict):
# `$` also matches before a trailing newline, so "admin\n" would pass (docs/security.md, issue 22 item 8).
DIGEST_PATTERN = r"sha256:[0-9a-f]{64}\Z"
LABEL_KEY_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.\-/]{0,62}\Z"
ENV_NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_]{0,255}\Z"

MAX_ARGS = 4096
MAX_ARG_BYTES = 128 * 1024
MAX_STR = 64 * 1024
MAX_WIDTH = 1024          # replicas or nodes
MAX_GPUS = 1024
MAX_PATHS = 10_000
MAX_AFTER = 100           # dependencies of one job
MAX_PRIORITY = 1_000_000  # priorities go from -MAX_PRIORITY to MAX_PRIORITY
MAX_IMAGE_BLOBS = 256     # an image's config and layers

RetryReason = Literal["worker_lost", "worker_revoked", "failed", "timed_out", "start_timeout"]
AfterCondition = Literal["ok", "notok", "any"]
RestartPolicy = Literal["always", "on_failure"]
RETRY_REASONS: tuple[str, ...] = typing.get_args(RetryReason)
AFTER_CONDITIONS: tuple[str, ...] = typing.get_args(AfterCondition)
RESTART_POLICIES: tuple[str, ...] = typing.get_args(RestartPolicy)
IngressAccess = Literal["token", "key", "public"]
INGRESS_ACCESS: tuple[str, ...] = typing.get_args(IngressAccess)
IdleAction = Literal["notify", "requeue", "cancel"]
IDLE_ACTIONS: tuple[str, ...] = typing.get_args(IdleAction)
GpuLink = Literal["nvlink"]
GPU_LINKS: tuple[str, ...] = typing.get_args(GpuLink)
SHA256_HEX_PATTERN = r"[0-9a-f]{64}\Z"


@dataclass(frozen=True, kw_only=True)
class RetrySpec:
    """`retry`: how often a task is tried, and after which endings."""

    max_attempts: int = declare(1, minimum=1, maximum=1000, shows="1 (10 for services)",
                                help="runs of a task at most, the first included")
    retry_on: list[RetryReason] = declare(["worker_lost"], help="the endings that run it again")


@dataclass(frozen=True, kw_only=True)
class HealthSpec:
    """`service.health`: an HTTP check of a service's replicas."""

    http_path: str = declare(max_bytes=2048, help="the path asked for (GET), starting with /")
    interval_s: float = declare(10, minimum=0.1, maximum=3600, help="seconds between checks")
    failures: int = declare(3, minimum=1, maximum=100, help="failed checks in a row that restart the replica")


@dataclass(frozen=True, kw_only=True)
class IngressSpec:
    """`service.ingress`: a URL on the control plane (`/ingress/<job id>/`) that proxies HTTP to the ready replicas."""

    access: IngressAccess = declare("token", help="who may go through: `token` (a token that may read the job), "
                                                  "`key` (that too, or `Authorization: Bearer <key>`), `public` (anyone)")
    key_sha256: str | None = declare(None, pattern=SHA256_HEX_PATTERN,
                                     help="the SHA-256 (hex) of the service's key; with `access: key` only")


@dataclass(frozen=True, kw_only=True)
class AutoscaleSpec:
    """`service.autoscale`: replicas that follow the requests in flight through the ingress (docs/services.md,
    "Autoscaling"); `service.replicas` is the starting count."""

    min: int = declare(1, minimum=0, maximum=MAX_WIDTH,
                       help="replicas at least; 0: scale to zero when idle, the ingress holding the next request "
                            "while a replica starts")
    max: int = declare(minimum=1, maximum=MAX_WIDTH, help="replicas at most")
    target_concurrency: float = declare(1.0, minimum=0.01, maximum=1_000_000,
                                        help="requests in flight through the ingress per ready replica to aim at")
    up_after_s: float = declare(10.0, minimum=0, maximum=86400,
                                help="seconds the load stays over target before replicas are added")
    down_after_s: float = declare(60.0, minimum=0, maximum=86400,
                                  help="seconds it stays under before replicas are removed (to zero with `min` 0)")
    cold_start_timeout_s: float = declare(120.0, minimum=1, maximum=3600,
                                          help="with `min` 0: how long the ingress holds a request while a "
                                               "replica starts (then 503)")
    max_held: int = declare(100, minimum=1, maximum=10_000,
                            help="with `min` 0: requests held while a replica starts (one more: 503 at once)")
    drain_timeout_s: float = declare(30.0, minimum=0, maximum=86400,
                                     help="seconds a removed replica's requests in flight may take before it is stopped")


@dataclass(frozen=True, kw_only=True)
class ServiceSpec:
    """`service`: a long-running job, its replicas restarted by policy."""

    replicas: int = declare(1, minimum=1, maximum=MAX_WIDTH, help="copies run at once, each its own task")
    port: bool = declare(True, help="the worker picks a free port and sets $PORT")
    restart: RestartPolicy = declare("always", help="when a replica that ended is started again")
    max_restarts: int | None = declare(None, minimum=0, maximum=1_000_000,
                                       help="restarts of a replica at most (null: no limit)")
    health: HealthSpec | None = declare(None, help="an HTTP health check (null: none)")
    weights: str | None = declare(None, pattern=DIGEST_PATTERN,
                                  help="an artifact digest linked into the working dir ($GPULAYER_WEIGHTS)")
    ingress: IngressSpec | None = declare(None, help="proxy HTTP to the replicas through the control plane "
                                                     "(null: none; needs `port`)")
    autoscale: AutoscaleSpec | None = declare(None, omit=True,
                                              help="replicas that follow the ingress's load, between `min` and `max` "
                                                   "(null: `replicas` always; needs `ingress`)")


#: The OCI media types an image job may use (the client checks them at submit, the worker again).
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYERS = ("application/vnd.oci.image.layer.v1.tar", "application/vnd.oci.image.layer.v1.tar+gzip")


@dataclass(frozen=True, kw_only=True)
class ImageSpec:
    """`image`: the OCI image a task runs in (docs/workers.md, "Images")."""

    manifest: str | None = declare(None, pattern=DIGEST_PATTERN,
                                   help="the artifact digest of the image's OCI manifest (also its OCI digest)")
    blobs: list[str] = declare([], max_items=MAX_IMAGE_BLOBS,
                               help="the artifact digests of its config and layers, as its manifest names them")
    ref: str | None = declare(None, max_bytes=256,
                              help="a name for people (`gpulayer image list`); alone, without `manifest`: an image "
                                   "the worker already has in its cache by that name or digest")


@dataclass(frozen=True, kw_only=True)
class After:
    """One dependency of `after`, written as an object."""

    job: int = declare(minimum=1, maximum=1 << 62, help="a job id")
    condition: AfterCondition = declare("ok", help="how that job must end: ok (succeeded), notok, any")


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """A job as POST /v1/jobs takes it (docs/protocol.md, `JobSpec`); unknown fields are refused."""

    command: list[str] = declare(min_items=1, max_items=MAX_ARGS, help="argv list of strings, non-empty")
    name: str | None = declare(None, max_bytes=256, help="a label for people")
    env: dict[str, str] = declare({}, help="{str: str}: the task's environment variables")
    accelerator: Literal["cuda"] | None = declare(
        None, help='"cuda" or null; "cuda" with no `gpus` means `gpus: 1`')
    gpus: int | None = declare(None, minimum=0, maximum=MAX_GPUS, shows="0", help="GPUs per task")
    gpu_fraction: float | None = declare(
        None, minimum=0.001, maximum=0.999, help="a share of one GPU's compute, 0 < f < 1 (`submit --gpu-fraction 0.25`), "
                                         "with `gpus` 0 or 1: the task runs on a GPU it shares with other fractional "
                                         "tasks, on a worker that shares its GPUs (`worker start --gpu-sharing`; "
                                         "docs/workers.md, \"Sharing a GPU\"); stored with `gpus` 0")
    gpu_memory_mb: int | None = declare(
        None, minimum=1, maximum=1 << 30, help="a share of one GPU's memory, in MB (`submit --gpu-memory 10G`), with "
                                               "`gpus` 0 or 1: as `gpu_fraction` (alone, or beside it: the task's "
                                               "share is the larger of the two); it waits for a worker whose GPUs "
                                               "have that much memory")
    gpu_link: GpuLink | None = declare(
        None, help='"nvlink": the task\'s GPUs must be joined by NVLink (`submit --gpu-link nvlink`, with `gpus` 2 or '
                   'more): it waits for a worker with that many free GPUs of one NVLink set, and is never placed on '
                   'a PCIe-only worker (docs/workers.md, "Topology"). Null: NVLink is preferred, not required')
    cpus: float = declare(0, minimum=0, maximum=1_000_000, help="CPUs per task")
    memory_mb: int = declare(0, minimum=0, maximum=1 << 40, help="memory per task, in MB")
    labels: dict[str, str] = declare({}, help="must all be on the worker")
    retry: RetrySpec | None = declare(
        None, shows='{`max_attempts`: 1 (10 for services), `retry_on`: ["worker_lost"]}',
        help="reasons: `worker_lost`, `worker_revoked`, `failed`, `timed_out`, `start_timeout`, judged from the "
             "finish's `outcome` (`failed`, `timed_out`), never from its `reason` text, which the job keeps for "
             "people (\"exit code 1\"); `start_timeout` is a gang rank that arrived at its rendezvous and failed "
             "while a rank was still missing (its agent's rendezvous timeout); a task whose "
             "worker stopped it (a `cancelled` finish nobody asked for) ends `lost` with reason "
             "`worker_stopped`, judged as `worker_lost`")
    timeout_seconds: float | None = declare(None, minimum=0.001, maximum=10**9,
                                            help="seconds a run may take before it is stopped (`timed_out`)")
    silence_timeout_seconds: float | None = declare(
        None, minimum=0.001, maximum=10**9, help="seconds a run may go without output before it is stopped "
                                                 "(`timed_out`)")
    signal: str | None = declare(
        None, max_bytes=32,
        help="Slurm's `--signal`: `[B:]SIG[@SECONDS]` (`USR1@120`, `B:USR1@120`, `SIGUSR2`): SIG is sent SECONDS "
             "(default 60) before `timeout_seconds` ends the run, once per attempt, to the task's process group (to "
             "its top process only with `B:`); it is also the signal of every planned stop (preemption, cancel, "
             "requeue, a drain), which SIGKILL follows after `grace_seconds`. Stored as written, upper case")
    grace_seconds: float | None = declare(
        None, minimum=0, maximum=86400,
        help="seconds between a planned stop's signal (SIGTERM, or `signal`'s) and SIGKILL: for preemption, cancel, "
             "requeue, a drain and the time limit; at most the server's `--max-grace` (400 `grace_above_limit`). "
             "Null: 30 s for a job with a `signal`, else the server's `--preempt-grace` for a preemption and the "
             "worker's own grace (5 s) for other stops")
    source: str | None = declare(None, pattern=DIGEST_PATTERN, help="`sha256:<hex>` of a tar.gz")
    inputs: dict[str, str] = declare({}, help="{relative path: digest}")
    outputs: list[str] = declare([], max_items=MAX_PATHS, help="relative paths")
    checkpoint_every_seconds: float | None = declare(
        None, minimum=1, maximum=10**9, help="upload the task's `GPULAYER_CHECKPOINT_DIR` this often while it runs "
                                            "(`--checkpoint-every`); it is also uploaded whenever an attempt ends "
                                            "without success (docs/training.md)")
    nodes: int = declare(1, minimum=1, maximum=MAX_WIDTH, help="multi-node ranks, each on its own worker")
    same: list[str] = declare(
        [], max_items=8, help="label keys (`submit --same rack`) whose value every rank of a multi-node job (`nodes` > 1) "
                              "shares: all ranks on workers that carry the label with one value, whichever it is "
                              "(docs/workers.md, \"Topology\"); a value is pinned by `labels` (`--same rack=r1` "
                              "writes both)")
    service: ServiceSpec | None = declare(None, help="a long-running service")
    priority: int | str = declare(
        0, minimum=-MAX_PRIORITY, maximum=MAX_PRIORITY,
        help="higher first, then fair share (docs/teams.md), then first come first served; a number, or the name "
             "of one of the server's priority classes (`low` -10, `normal` 0, `high` 10 by default), stored as its "
             "number; at most the project's `max_priority` unless an admin submits (403 priority_above_ceiling)")
    preemptible: bool = declare(
        False, help="may be stopped (SIGTERM, the server's preempt grace, SIGKILL) for waiting work of a higher "
                    "priority, and requeued with the same attempt; its next run sees `GPULAYER_PREEMPTED=1`")
    idle_timeout_seconds: float | None = declare(
        None, minimum=0.001, maximum=10**9,
        help="its idle policy (docs/workers.md \"Idle GPUs\", `submit --idle-timeout`): a task whose every GPU stays "
             "under `idle_below_pct` for this long is acted on (`idle_action`); at least the server's heartbeat "
             "interval, one GPU sample (400 `idle_timeout_too_short`). Null: its project's, else the fleet's")
    idle_below_pct: float | None = declare(
        None, minimum=0, maximum=100, help="the idle policy's threshold: GPU utilisation under this percentage is "
                                           "idle (`--idle-below 5%`). Null: its project's, else the fleet's (5)")
    idle_action: IdleAction | None = declare(
        None, help='what an idle task gets: `"notify"` (an event `task_idle`, the job\'s notification channels), '
                   '`"requeue"` (stopped with its signal and grace as for a preemption, back to the queue, same '
                   'attempt) or `"cancel"`. Null: its project\'s, else the fleet\'s (notify)')
    backfill: bool = declare(
        True, help="may start in room held for a higher-ranked waiting job's reservation when it is expected to end "
                   "before that job starts (EASY backfill, docs/scheduling-time.md); false (`submit --no-backfill`): "
                   "only in room no reservation needs")
    secrets: list[str] = declare([], help="names of secrets to pass as environment variables")
    array: str | list[int] | None = declare(
        None, schema={"items": {"type": "integer", "minimum": 0, "maximum": MAX_ARRAY_INDEX}},
        help='a job array: one task per index, as `sbatch --array` writes them: `"0-999"`, `"1,5,9-12"`, '
             '`"0-15:4"` (a step), or a list of indices; `"0-999%16"` also sets `max_running`. Indices 0 to '
             f'{MAX_ARRAY_INDEX:,}, at most {MAX_ARRAY:,} elements, each once; not with `service` or `nodes` > 1. '
             'Stored as ranges (`"0-999"`)')
    max_running: int | None = declare(None, minimum=1, maximum=MAX_ARRAY,
                                      help="an array's cap on elements running at once (its `%N`)")
    network: Literal["shared", "none"] = declare(
        "shared", help='`"shared"`: the task uses the worker\'s network; `"none"`: only a loopback of its own '
                       '(on a worker whose tasks run in a sandbox, `--sandbox`; elsewhere it is refused at the task)')
    run_as_root: bool = declare(
        False, help="run as root where the agent runs as root and allows it (`worker start --allow-root-tasks`); "
                    "otherwise the task runs as the worker's `--run-as` user")
    image: ImageSpec | None = declare(
        None, help="an OCI image to run the command in (`gpulayer submit --image`): its blobs are artifacts; needs a "
                   "worker whose tasks run in a sandbox (`--sandbox`), elsewhere the task fails saying so")
    hold: bool = declare(False, help="submitted held (`submit --hold`): it waits, reason `held`, until "
                                     "`POST /v1/jobs/{id}/release` (`gpulayer job release`)")
    begin_at: float | None = declare(
        None, minimum=0, maximum=1e11, help="a Unix time before which it does not start (`submit --begin`): it "
                                            "waits, reason `begin_time`, until then")
    after: list[int | str | After] = declare(
        [], max_items=MAX_AFTER,
        schema={"items": {"oneOf": [{"type": "integer", "minimum": 1},
                                    {"type": "string", "pattern": "^[0-9]+(:(ok|notok|any))?$"},
                                    json_schema(After)]}},
        help='dependencies: each a job id (it must succeed), `"ID:ok"`, `"ID:notok"`, `"ID:any"`, or '
             f'`{{"job": ID, "condition": "ok"}}`; at most {MAX_AFTER}, each job once, every one an existing job '
             '(`400 unknown_job` otherwise). Stored as `[{"job", "condition"}]`')


JOB_FIELDS = frozenset(names(JobSpec))
