"""`gpulayer submit`: a JobSpec from options, a job file and a command, sent to a control plane or run here
(`--target local`), then waited on or followed."""
from __future__ import annotations

import re
import secrets
import sys
import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from gpulayer.cli.common import (
    client_of, exit_code_of, fail, global_options, home_of, parse_duration, parse_pairs,
    print_json, start_parts, style,
)
from gpulayer.cli.following import follow_logs, tell_ended, tell_waiting
from gpulayer.cli.idle_options import IdleActionOpt, IdleBelowOpt, IdleTimeoutOpt, idle_policy
from gpulayer.client.errors import ClientError, InvalidRequest, ServiceNotStarting, WaitTimeout
from gpulayer.protocol import UNLIMITED_TIMES, parse_begin, parse_signal, parse_time_limit
from gpulayer.client.jobs import Job
from gpulayer.client.settings import server_configured
from gpulayer.client.jobfile import ServiceOnly, read_job_file, spec_from_fields
from gpulayer.client.specs import MIN_INGRESS_KEY
from gpulayer.client.specs import memory_mb as memory_size_mb
from gpulayer.protocol.jobspec import INGRESS_ACCESS
from gpulayer.client.transfers import check_local_paths

ENDPOINT_WAIT_S = 365 * 86400.0  # `submit --service` waits until the service is up or ends (or --wait-timeout)
MAX_FAILED_STARTS = 5  # `submit --service` gives up once a replica was restarted this often (--max-failed-starts)
SERVICE_LOG_LINES = 20  # the service's last log lines printed when submit gives up on it
#: Options that may be given alone, and the value they then take (app.py tells click).
VALUE_OPTIONAL = {"--ingress": "token"}


#: The options that set a service's settings (jobfile.SERVICE_SETTINGS), by setting.
SERVICE_FLAGS = {"replicas": "--replicas", "port": "--no-port", "restart": "--restart",
                 "max_restarts": "--max-restarts", "health_path": "--health-path", "weights": "--weights",
                 "autoscale": "--max-replicas"}
#: The autoscaling options (docs/services.md, "Autoscaling"), by `service.autoscale` field.
AUTOSCALE_FLAGS = {"min": "--min-replicas", "max": "--max-replicas", "target_concurrency": "--target-concurrency",
                   "up_after_s": "--scale-up-after", "down_after_s": "--scale-down-after",
                   "cold_start_timeout_s": "--cold-start-timeout"}


class Target(str, Enum):
    local = "local"
    remote = "remote"


class Restart(str, Enum):
    always = "always"
    on_failure = "on_failure"


class GpuLink(str, Enum):
    nvlink = "nvlink"


class Network(str, Enum):
    shared = "shared"
    none = "none"


def _opt(*names: str, help: str, **kw):
    return typer.Option(*names, help=help, **kw)


def _labels_option(label: Optional[list[str]], gpu_model: Optional[str]) -> Optional[dict]:
    """--label pairs, plus gpu_model=MODEL for --gpu-model (which a worker's GPU models meet too)."""
    labels = parse_pairs(label, "--label")
    if gpu_model:
        labels["gpu_model"] = gpu_model
    return labels or None


# The options of `submit`, one alias each, so its signature stays short.
CommandOpt = Annotated[Optional[list[str]], typer.Argument(help="The command, after `--`.", metavar="CMD", show_default=False)]
TargetOpt = Annotated[Optional[Target], _opt("--target", help="local: run here with no server; remote: send to the control plane. Default: remote when a server is configured.")]
NameOpt = Annotated[Optional[str], _opt("--name", help="A label for people.")]
AcceleratorOpt = Annotated[Optional[str], _opt("--accelerator", help="'cuda' (alone: one GPU).")]
GpusOpt = Annotated[Optional[int], _opt("--gpus", help="GPUs per task.", min=0)]
CpusOpt = Annotated[Optional[float], _opt("--cpus", help="CPUs per task.", min=0)]
MemoryMbOpt = Annotated[Optional[int], _opt("--memory-mb", help="Memory per task, MB.", min=0)]
MemoryOpt = Annotated[Optional[str], _opt("--memory", "--mem", metavar="SIZE", help="Memory per task as Slurm's --mem: MB (512), or with a unit K, M, G, T (512M, 10G).")]
LabelOpt = Annotated[Optional[list[str]], _opt("--label", help="k=v a worker must carry (repeatable).")]
GpuFractionOpt = Annotated[Optional[float], _opt("--gpu-fraction", metavar="F", help="A share of one GPU's compute, 0 < F < 1 (0.25): the task shares a GPU with other fractional tasks, on a worker started with --gpu-sharing (docs/workers.md, \"Sharing a GPU\").")]
GpuMemoryOpt = Annotated[Optional[str], _opt("--gpu-memory", metavar="SIZE", help="A share of one GPU's memory (10G, 512M; as --mem): as --gpu-fraction, alone or beside it (the larger share counts).")]
GpuModelOpt = Annotated[Optional[str], _opt("--gpu-model", help="Only GPUs of this model, or MIG profile (1g.10gb): the label gpu_model=MODEL.")]
EnvOpt = Annotated[Optional[list[str]], _opt("--env", help="K=V for the task's environment (repeatable).")]
SourceOpt = Annotated[Optional[Path], _opt("--source", help="Directory packed (in a git checkout: its tracked and untracked files, not what git ignores) and unpacked as the working directory.")]
InputOpt = Annotated[Optional[list[str]], _opt("--input", help="Local file or folder uploaded and placed at the same relative path (repeatable).")]
OutputOpt = Annotated[Optional[list[str]], _opt("--output", help="Relative path collected after the run (repeatable).")]
CheckpointEveryOpt = Annotated[Optional[str], _opt("--checkpoint-every", metavar="DURATION", help="Upload $GPULAYER_CHECKPOINT_DIR this often while the task runs (as --timeout); it is also uploaded whenever an attempt ends without success, and restored into the next (docs/training.md).")]
RetryOpt = Annotated[Optional[int], _opt("--retry", help="Max attempts.", min=1)]
RetryOnOpt = Annotated[Optional[list[str]], _opt("--retry-on", help="Reason to retry on: worker_lost, worker_revoked, failed, timed_out, start_timeout (repeatable).")]
TimeoutOpt = Annotated[Optional[str], _opt("--timeout", metavar="DURATION", help="End the task after this long: seconds, 30m, 12h, 2d, or Slurm's 1:00:00, 2-00:00:00.")]
TimeLimitOpt = Annotated[Optional[str], _opt("--time", "-t", metavar="TIME", help="Slurm's --time, the same limit as --timeout: MM (minutes, as sbatch reads a bare number, 1.5 too), MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, 90m, 2h, or UNLIMITED (infinite): no limit.")]
SignalOpt = Annotated[Optional[str], _opt("--signal", metavar="[B:]SIG[@SECONDS]", help="Slurm's --signal: send SIG (USR1, SIGUSR2, 10) SECONDS (default 60) before the time limit, once; B: to the command's top process only. Also the signal of every planned stop (preemption, cancel, requeue, a drain).")]
GraceOpt = Annotated[Optional[str], _opt("--grace", metavar="DURATION", help="Time between a planned stop's signal and SIGKILL (default 30s with --signal; at most the server's --max-grace).")]
HoldOpt = Annotated[bool, _opt("--hold", help="Submit held: it waits (reason held) until `gpulayer job release`.")]
BeginOpt = Annotated[Optional[str], _opt("--begin", metavar="TIME", help="Start no earlier than TIME: an ISO time (2026-12-24T18:00, UTC unless it says), or now+1h, now+90m.")]
SilenceTimeoutOpt = Annotated[Optional[str], _opt("--silence-timeout", metavar="DURATION", help="End the task after this long without output (as --timeout).")]
PriorityOpt = Annotated[Optional[str], _opt("--priority", help="Higher runs first: a number, or a class of the server (low=-10, normal=0, high=10 by default).")]
NoBackfillOpt = Annotated[bool, _opt("--no-backfill", help="Never start in room held for another job's reservation, even when expected to end before it (spec `backfill: false`; docs/scheduling-time.md).")]
PreemptibleOpt = Annotated[bool, _opt("--preemptible", help="May be stopped (SIGTERM, a grace, SIGKILL) and requeued, same attempt, for higher-priority work; $GPULAYER_PREEMPTED=1 in the next run.")]
NodesOpt = Annotated[Optional[int], _opt("--nodes", help="Multi-node: ranks, each on its own worker.", min=1)]
SameOpt = Annotated[Optional[list[str]], _opt("--same", metavar="LABEL[=VALUE]", help="With --nodes: every rank on workers that share this label's value, whichever (rack), or this one (rack=r1) (repeatable).")]
GpuLinkOpt = Annotated[Optional[GpuLink], _opt("--gpu-link", help="nvlink: the task's GPUs (--gpus 2 or more) must be joined by NVLink; it waits for a worker that has them (default: preferred).")]
SecretOpt = Annotated[Optional[list[str]], _opt("--secret", help="Secret passed as an environment variable (repeatable).")]
ServiceOpt = Annotated[bool, _opt("--service", help="A long-running service.")]
ReplicasOpt = Annotated[Optional[int], _opt("--replicas", help="Service replicas, each on its own worker (default 1).", min=1)]
NoPortOpt = Annotated[bool, _opt("--no-port", help="Do not pick a $PORT for the service.")]
RestartOpt = Annotated[Optional[Restart], _opt("--restart", help="When to restart a service replica (default always).")]
MaxRestartsOpt = Annotated[Optional[int], _opt("--max-restarts", help="Restarts per replica (default: no limit).", min=0)]
HealthPathOpt = Annotated[Optional[str], _opt("--health-path", help="HTTP path that must answer 2xx.")]
WeightsOpt = Annotated[Optional[str], _opt("--weights", help="Artifact digest or local file passed to the service.")]
IngressOpt = Annotated[Optional[str], _opt("--ingress", metavar="[token|key|public]", help="A stable URL on the control plane that proxies HTTP to the service's ready replicas (printed, and in job status): token (alone: --ingress) lets in a token that may read the job, key also the service's key (--ingress-key, else one made and printed once), public anyone.")]
IngressKeyOpt = Annotated[Optional[str], _opt("--ingress-key", metavar="KEY", help=f"The service's key for --ingress (sent as Authorization: Bearer KEY, as an OpenAI client sends its api key): at least {MIN_INGRESS_KEY} characters; only its SHA-256 is sent.")]
MinReplicasOpt = Annotated[Optional[int], _opt("--min-replicas", help="Autoscaling: replicas at least (default 1); 0 releases every GPU when idle (--scale-down-after), the ingress holding the next request while a replica starts. Needs --max-replicas.", min=0)]
MaxReplicasOpt = Annotated[Optional[int], _opt("--max-replicas", help="Autoscaling: replicas at most; the service follows the requests in flight through its ingress (needs --ingress; --replicas is then the starting count).", min=1)]
TargetConcurrencyOpt = Annotated[Optional[float], _opt("--target-concurrency", help="Autoscaling: requests in flight per ready replica to aim at (default 1).")]
ScaleUpAfterOpt = Annotated[Optional[str], _opt("--scale-up-after", metavar="DURATION", help="Autoscaling: how long the load stays over target before replicas are added (default 10s).")]
ScaleDownAfterOpt = Annotated[Optional[str], _opt("--scale-down-after", metavar="DURATION", help="Autoscaling: how long it stays under before replicas are removed, drained first (default 60s).")]
ColdStartTimeoutOpt = Annotated[Optional[str], _opt("--cold-start-timeout", metavar="DURATION", help="With --min-replicas 0: how long the ingress holds a request while a replica starts (default 120s; then 503).")]
ArrayOpt = Annotated[Optional[str], _opt("--array", metavar="INDICES", help="A job array, one task per index, like sbatch --array: 0-999, 1,5,9-12, 0-15:4; %N caps how many run at once (0-999%16). Each task sees $GPULAYER_ARRAY_INDEX and $GPULAYER_ARRAY_SIZE.")]
AfterOpt = Annotated[Optional[list[str]], _opt("--after", metavar="JOB[:ok|notok|any]", help="Run after that job ends: ok (the default) once it succeeded, notok once it did not, any however (repeatable). Cancelled (dependency_failed) when it cannot be met.")]
AfterArrayOpt = Annotated[Optional[list[int]], _opt("--after-array", metavar="JOB", help="Run after every element of array JOB succeeded (repeatable).")]
ImageOpt = Annotated[Optional[str], _opt("--image", metavar="IMAGE", help="Run in this OCI image: an oci-archive tar or OCI layout dir here (its layers uploaded once, by digest), or a name a worker has cached (gpulayer image list). Needs sandboxed workers.")]
NetworkOpt = Annotated[Optional[Network], _opt("--network", help="shared (the default): the worker's network; none: a loopback of the task's own (needs a sandboxed worker).")]
RunAsRootOpt = Annotated[bool, _opt("--run-as-root", help="Run as root where the worker runs as root and allows it (worker start --allow-root-tasks).")]
ProjectOpt = Annotated[Optional[str], _opt("--project", help="The project it counts against (default: your only project, else default).")]
MailTypeOpt = Annotated[Optional[str], _opt("--mail-type", metavar="TYPES", help="Mail --mail-user when the job does this, as Slurm's: BEGIN, END, FAIL, REQUEUE, ALL (comma-separated). Needs a server started with --smtp-url.")]
MailUserOpt = Annotated[Optional[str], _opt("--mail-user", metavar="ADDR", help="Where --mail-type's mail goes.")]
WaitOpt = Annotated[bool, _opt("--wait", help="Wait and exit with the job's exit code.")]
WaitTimeoutOpt = Annotated[Optional[str], _opt("--wait-timeout", metavar="DURATION", help="With --service: give up waiting for the endpoints after this long (exit 124; the service goes on).")]
MaxFailedStartsOpt = Annotated[Optional[int], _opt("--max-failed-starts", help=f"With --service: give up waiting once a replica failed to start this often (default {MAX_FAILED_STARTS}; exit 1, its last log lines shown; the service goes on by its --restart policy).", min=1)]
FollowOpt = Annotated[bool, _opt("--follow", help="Stream the logs, then exit with the job's exit code.")]
AsJsonOpt = Annotated[bool, _opt("--json", help="Print the Job as JSON instead of its id.")]
FileOpt = Annotated[Optional[Path], _opt("--file", "-f", help="A TOML file of JobSpec fields, as gl.job() takes them (options and a command after `--` override it).", exists=True, dir_okay=False)]
TestOnlyOpt = Annotated[bool, _opt("--test-only", help="Say when it would start if submitted now, and on which workers, or why it could never run (exit 1); submit nothing (sbatch --test-only).")]
DryRunOpt = Annotated[bool, _opt("--dry-run", help="Print the JobSpec that would be sent, and send nothing.")]
CancelOnInterruptOpt = Annotated[Optional[bool], _opt("--cancel-on-interrupt/--no-cancel-on-interrupt", help="Ctrl-C during --wait/--follow cancels the job (default: yes with --target local, no against a server).", show_default=False)]


def submit(
    ctx: typer.Context, command: CommandOpt = None, target: TargetOpt = None, name: NameOpt = None,
    accelerator: AcceleratorOpt = None, gpus: GpusOpt = None, cpus: CpusOpt = None, memory_mb: MemoryMbOpt = None,
    memory: MemoryOpt = None, label: LabelOpt = None, gpu_model: GpuModelOpt = None,
    gpu_fraction: GpuFractionOpt = None, gpu_memory: GpuMemoryOpt = None, gpu_link: GpuLinkOpt = None,
    same: SameOpt = None, env: EnvOpt = None,
    source: SourceOpt = None, input_: InputOpt = None, output: OutputOpt = None,
    checkpoint_every: CheckpointEveryOpt = None, retry: RetryOpt = None, retry_on: RetryOnOpt = None,
    timeout: TimeoutOpt = None, time_limit: TimeLimitOpt = None, signal_: SignalOpt = None, grace: GraceOpt = None,
    hold: HoldOpt = False, begin: BeginOpt = None, silence_timeout: SilenceTimeoutOpt = None,
    priority: PriorityOpt = None, preemptible: PreemptibleOpt = False, no_backfill: NoBackfillOpt = False,
    nodes: NodesOpt = None, idle_timeout: IdleTimeoutOpt = None, idle_below: IdleBelowOpt = None,
    idle_action: IdleActionOpt = None,
    secret: SecretOpt = None, service: ServiceOpt = False, replicas: ReplicasOpt = None, no_port: NoPortOpt = False,
    restart: RestartOpt = None, max_restarts: MaxRestartsOpt = None, health_path: HealthPathOpt = None,
    weights: WeightsOpt = None, ingress: IngressOpt = None, ingress_key: IngressKeyOpt = None,
    min_replicas: MinReplicasOpt = None, max_replicas: MaxReplicasOpt = None, target_concurrency: TargetConcurrencyOpt = None,
    scale_up_after: ScaleUpAfterOpt = None, scale_down_after: ScaleDownAfterOpt = None, cold_start_timeout: ColdStartTimeoutOpt = None,
    array: ArrayOpt = None, after: AfterOpt = None, after_array: AfterArrayOpt = None, image: ImageOpt = None,
    network: NetworkOpt = None, run_as_root: RunAsRootOpt = False, project: ProjectOpt = None,
    mail_type: MailTypeOpt = None, mail_user: MailUserOpt = None, wait: WaitOpt = False,
    wait_timeout: WaitTimeoutOpt = None, max_failed_starts: MaxFailedStartsOpt = None, follow: FollowOpt = False,
    as_json: AsJsonOpt = False, file: FileOpt = None, dry_run: DryRunOpt = False,
    cancel_on_interrupt: CancelOnInterruptOpt = None, test_only: TestOnlyOpt = False,
) -> None:
    """Submit a job (or a service): prints the job id on the first line of stdout.

    \b
    Examples:
      gpulayer submit --gpus 1 --wait -- python train.py
      gpulayer submit -f job.toml --dry-run
      gpulayer submit --array 0-999%16 -- python sweep.py
      gpulayer submit --after 41 -- python evaluate.py
      gpulayer submit --gpus 4 --test-only -- python train.py
      gpulayer submit --gpu-memory 10G --gpu-fraction 0.25 -- python serve.py
      gpulayer submit --nodes 4 --gpus 8 --gpu-link nvlink --same rack -- torchrun train.py
    """
    settings = dict(
        name=name, env=parse_pairs(env, "--env") or None, accelerator=accelerator, gpus=gpus,
        cpus=cpus, memory_mb=_memory_option(memory_mb, memory), labels=_labels_option(label, gpu_model), retry=retry,
        retry_on=retry_on or None, timeout_seconds=_time_limit(timeout, time_limit),
        signal=_signal_option(signal_), grace_seconds=parse_duration(grace, "--grace"),
        hold=True if hold else None, begin_at=_begin_option(begin),
        silence_timeout_seconds=parse_duration(silence_timeout, "--silence-timeout", positive=True),
        source=str(source) if source else None, inputs=list(input_) if input_ else None,
        outputs=output or None, nodes=nodes, priority=_priority_option(priority), secrets=secret or None,
        array=array, after=_after_option(after, after_array), preemptible=True if preemptible else None,
        backfill=False if no_backfill else None,
        network=network.value if network else None, run_as_root=True if run_as_root else None,
        image=image, gpu_fraction=gpu_fraction, gpu_memory_mb=_gpu_memory_option(gpu_memory),
        gpu_link=gpu_link.value if gpu_link else None, same=same or None,
        **idle_policy(idle_timeout, idle_below, idle_action),
    )
    settings["checkpoint_every_seconds"] = parse_duration(checkpoint_every, "--checkpoint-every", positive=True)
    service_settings = dict(replicas=replicas, port=False if no_port else None,
                            restart=restart.value if restart else None, max_restarts=max_restarts,
                            health_path=health_path, weights=weights, autoscale=_autoscale_options(
        service, ingress, min_replicas, max_replicas, target_concurrency, scale_up_after, scale_down_after, cold_start_timeout))
    made_key = _ingress_options(service, ingress, ingress_key, service_settings)
    spec = _build_spec(command, file, service, settings, service_settings)
    if time_limit is not None and time_limit.strip().lower() in UNLIMITED_TIMES:
        spec.pop("timeout_seconds", None)  # --time UNLIMITED wins over a job file's limit, as over #SBATCH's
    check_local_paths(spec)  # a missing --source or --input is bad input, dry run or not
    _warn_signal_without_limit(spec)
    if dry_run:
        print_json(spec)
        return
    _send(ctx, spec, target=target, mail=_mail_option(mail_type, mail_user), test_only=test_only, project=project,
          as_json=as_json, cancel_on_interrupt=cancel_on_interrupt, after_array=after_array, wait=wait,
          follow=follow, made_key=made_key, service_wait=(wait_timeout, max_failed_starts))

def _send(ctx: typer.Context, spec: dict, *, target, mail, test_only: bool, project, as_json: bool,
          cancel_on_interrupt, after_array, wait: bool, follow: bool, made_key, service_wait) -> None:
    """Where a checked spec goes: a what-if (--test-only), this machine (--target local), or the control plane;
    exits with the command's status. `service_wait`: --wait-timeout and --max-failed-starts, as given."""
    opts = global_options(ctx)
    remote = target == Target.remote or (target is None and server_configured(opts.url, opts.home))
    if mail and not remote:
        raise fail("--mail-type needs a control plane (one started with --smtp-url)", 2)
    if test_only:
        if not remote:
            raise fail("--test-only needs a control plane: run `gpulayer up`, or pass --url / GPULAYER_URL", 2)
        raise typer.Exit(_test_only(client_of(ctx).estimate(spec, project), as_json))
    if not remote:
        if spec.get("service"):
            raise fail("--service needs a control plane: run `gpulayer up`, or pass --url / GPULAYER_URL", 2)
        if cancel_on_interrupt is False:
            raise fail("--no-cancel-on-interrupt needs a control plane: a --target local job ends with the command", 2)
        raise typer.Exit(_submit_local(spec, home_of(ctx), as_json))
    for array_id in after_array or []:  # --after-array names an array: say so before anything is sent
        if client_of(ctx).get_job(array_id).data.get("array") is None:
            raise fail(f"--after-array: job {array_id} is no array (use --after {array_id})", 2)
    raise typer.Exit(_submit_remote(ctx, spec, wait, follow, as_json, bool(cancel_on_interrupt), project, mail, made_key,
                                    _service_wait(spec, *service_wait)))


MAIL_TYPES = ("BEGIN", "END", "FAIL", "REQUEUE", "ALL")
MAIL_ADDRESS = re.compile(r"[^@\s<>(),;:\"\[\]]{1,64}@[A-Za-z0-9.-]{1,253}\.[A-Za-z]{2,63}")


def _mail_option(mail_type: Optional[str], mail_user: Optional[str]) -> Optional[dict]:
    """--mail-type and --mail-user as a mailbox request (docs/notifications.md); a usage error otherwise."""
    if mail_type is None and mail_user is None:
        return None
    if mail_type is None:
        raise typer.BadParameter("--mail-user needs --mail-type (BEGIN, END, FAIL, REQUEUE or ALL)",
                                 param_hint="--mail-type")
    types = [t.strip().upper() for t in mail_type.split(",") if t.strip()]
    unknown = [t for t in types if t not in MAIL_TYPES]
    if not types or unknown:
        raise typer.BadParameter(f"expected BEGIN, END, FAIL, REQUEUE or ALL (comma-separated), got "
                                 f"{(unknown or [mail_type])[0]!r}", param_hint="--mail-type")
    if mail_user is None:  # users carry no mail address yet: say where
        raise typer.BadParameter("give the address: --mail-user ADDR", param_hint="--mail-user")
    if not MAIL_ADDRESS.fullmatch(mail_user):
        raise typer.BadParameter(f"expected one mail address, got {mail_user!r}", param_hint="--mail-user")
    return {"email": mail_user, "mail_type": types}


def _autoscale_options(service: bool, ingress: Optional[str], lo: Optional[int], hi: Optional[int], target: Optional[float],
                       up: Optional[str], down: Optional[str], cold: Optional[str]) -> Optional[dict]:
    """The autoscaling options into `service.autoscale` (None: none given); usage errors (exit 2) for bad ones."""
    given = {"min": lo, "max": hi, "target_concurrency": target, "up_after_s": parse_duration(up, "--scale-up-after"),
             "down_after_s": parse_duration(down, "--scale-down-after"),
             "cold_start_timeout_s": parse_duration(cold, "--cold-start-timeout", positive=True)}
    given = {k: v for k, v in given.items() if v is not None}
    if not given:
        return None
    first = AUTOSCALE_FLAGS[next(iter(given))]
    if not service:
        raise typer.BadParameter("autoscaling is a service's: add --service", param_hint=first)
    if hi is None:
        raise typer.BadParameter("autoscaling needs --max-replicas (the most replicas it may run)", param_hint=first)
    if ingress is None:
        raise typer.BadParameter("autoscaling scales on the requests in flight through the service's ingress: add "
                                 "--ingress (a service without one runs --replicas)", param_hint="--max-replicas")
    if lo is not None and lo > hi:
        raise typer.BadParameter(f"must be at most --max-replicas ({lo} > {hi})", param_hint="--min-replicas")
    if target is not None and not target > 0:
        raise typer.BadParameter(f"must be above 0, got {target:g}", param_hint="--target-concurrency")
    return given


def _ingress_options(service: bool, ingress: Optional[str], key: Optional[str], service_settings: dict) -> Optional[str]:
    """--ingress and --ingress-key into `service_settings`; the key made here for `--ingress key` without
    --ingress-key (printed once after submit), else None. Usage errors (exit 2) for bad ones."""
    if ingress is None and key is None:
        return None
    if not service:
        raise typer.BadParameter("the ingress proxies to a service's replicas: add --service",
                                 param_hint="--ingress" if ingress is not None else "--ingress-key")
    if ingress is not None and ingress not in INGRESS_ACCESS:
        raise typer.BadParameter(f"expected one of {', '.join(INGRESS_ACCESS)}, got {ingress!r}", param_hint="--ingress")
    if key is not None and ingress not in (None, "key"):
        raise typer.BadParameter(f"a key goes with --ingress key, not --ingress {ingress}", param_hint="--ingress-key")
    made = None
    if key is None and ingress == "key":
        key = made = secrets.token_urlsafe(32)
    service_settings.update(ingress="key" if key is not None else ingress, ingress_key=key)
    return made


def _after_option(after: Optional[list[str]], after_array: Optional[list[int]]) -> Optional[list[str]]:
    """--after JOB[:ok|notok|any] and --after-array JOB as the JobSpec's `after` (None: neither given).

    An array succeeds when every element did, so --after-array JOB is JOB:ok, named for Slurm users.
    """
    found = []
    for value in after or []:
        job, _, condition = value.partition(":")
        if not re.fullmatch(r"[0-9]{1,19}", job.strip()) or condition not in ("", "ok", "notok", "any"):
            raise typer.BadParameter(f"expected JOB, JOB:ok, JOB:notok or JOB:any, got {value!r}", param_hint="--after")
        found.append(f"{int(job)}:{condition or 'ok'}")
    found.extend(f"{job}:ok" for job in after_array or [])
    return found or None


def _time_limit(timeout: Optional[str], time_limit: Optional[str]) -> Optional[float]:
    """`--timeout` or Slurm's `--time` (a bare number is minutes there, UNLIMITED none), in seconds; not both."""
    if time_limit is None:
        return parse_duration(timeout, "--timeout", positive=True)
    if timeout is not None:
        raise typer.BadParameter("give --time or --timeout, not both: they are the same limit", param_hint="--time")
    if time_limit.strip().lower() in UNLIMITED_TIMES:
        return None
    try:
        seconds = parse_time_limit(time_limit)
    except ValueError as exc:
        raise typer.BadParameter(str(exc).replace("(a plain number is seconds, not Slurm's minutes)",
                                                  "(here a plain number is minutes, as sbatch reads it)"),
                                 param_hint="--time") from None
    if seconds <= 0:
        raise typer.BadParameter(f"{time_limit!r}: must be more than 0 seconds", param_hint="--time")
    return seconds


def _memory_option(memory_mb: Optional[int], memory: Optional[str]) -> Optional[int]:
    """`--memory-mb MB` or Slurm's `--memory`/`--mem SIZE` (10G, 512M), in MB; not both."""
    if memory is None:
        return memory_mb
    if memory_mb is not None:
        raise typer.BadParameter("give --memory or --memory-mb, not both: they are the same request",
                                 param_hint="--memory")
    try:
        return memory_size_mb(memory)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--memory") from None


def _gpu_memory_option(size: Optional[str]) -> Optional[int]:
    """`--gpu-memory SIZE` (10G, 512M) in MB."""
    if size is None:
        return None
    try:
        return memory_size_mb(size)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--gpu-memory") from None


def _warn_signal_without_limit(spec: dict) -> None:
    """A `--signal` warning is sent before the time limit: without one it never fires (the signal is
    still that of every planned stop), which Slurm users expect to be told."""
    if spec.get("signal") and not spec.get("timeout_seconds") and not spec.get("service"):
        typer.echo(f"warning: --signal {spec['signal']}: the job has no time limit (--time) for it to fire "
                   "before; it is only the signal of planned stops (preemption, cancel, requeue, a drain)", err=True)


def _signal_option(text: Optional[str]) -> Optional[str]:
    """`--signal [B:]SIG[@SECONDS]`, checked here (a usage error naming the option) and sent as written."""
    if text is None:
        return None
    try:
        parse_signal(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--signal") from None
    return text


def _begin_option(text: Optional[str]) -> Optional[float]:
    """`--begin TIME` as a Unix time: an ISO time (UTC unless it names a zone) or now+N (a duration);
    a time already past is a usage error."""
    if text is None:
        return None
    try:
        at = parse_begin(text, time.time())
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--begin") from None
    return at


def _build_spec(command, file: Optional[Path], service: bool, settings: dict, service_settings: dict) -> dict:
    """The JobSpec of `submit`: the job file's fields (if any), then the options given, then the command."""
    if not command and not file:
        raise typer.BadParameter("give the command after `--`, e.g. gpulayer submit -- echo hello",
                                 param_hint="CMD")
    try:
        fields = read_job_file(file) if file else {}
        return spec_from_fields(fields, command, service, settings, service_settings)
    except ServiceOnly as exc:
        flags = [SERVICE_FLAGS[name] for name in exc.settings]
        raise typer.BadParameter(f"a service's setting{'s' if len(flags) > 1 else ''} ({', '.join(flags)}): add "
                                 "--service (without it the job runs once, as a batch job)", param_hint=flags[0]) from None
    except (TypeError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--file" if file else None) from None


def _test_only(found: dict, as_json: bool) -> int:
    """`submit --test-only`'s answer (POST /v1/jobs/estimate): "would start about 14:20 (in 35 min) on gpu-03",
    or why it is not known; exit 1, with the words of its waiting reason, for a spec that could never run."""
    if as_json:
        print_json(found)
    elif found["estimated_start_at"] is not None:
        when, ahead = start_parts(found["estimated_start_at"], found["now"])
        where = f" on {', '.join(found['workers'])}" if found["workers"] else ""
        typer.echo(f"would start {when if when == 'now' else f'about {when} ({ahead})'}{where}")
    elif found["runnable"]:
        typer.echo(f"start unknown: {found['estimate_reason']}")
    if not found["runnable"]:
        if not as_json:
            typer.echo(f"Error: {found['estimate_reason']}", err=True)
        return 1
    return 0


def _submit_remote(ctx, spec, wait, follow, as_json, cancel_on_interrupt: bool, project: Optional[str] = None,
                   mail: Optional[dict] = None, made_key: Optional[str] = None,
                   service_wait: tuple[float, int] = (ENDPOINT_WAIT_S, MAX_FAILED_STARTS)) -> int:
    client = client_of(ctx)
    # A mailbox rides on the submit: a server that sends no mail refuses both, before anything is made.
    try:
        job = client.submit(spec, project, mail=mail) if mail else client.submit(spec, project)
    except InvalidRequest as exc:
        if mail and exc.message.startswith("mail"):
            raise fail(f"--mail-type/--mail-user: {exc.message.partition(': ')[2] or exc.message} (nothing was "
                       "submitted)", 2) from None
        raise
    waits = (follow or wait) and not spec.get("service")
    # From here on the job exists: a Ctrl-C at any point, even while its id is being printed (typer would
    # turn it into a silent exit 130), cancels it or says how to.
    try:
        if not (as_json and waits):  # with --json, --wait and --follow print the Job as it ended, last
            _print_submitted(job, as_json)
        if job.data.get("ingress_url"):
            _print_ingress(job.data["ingress_url"], made_key, as_json)
        if spec.get("service"):
            return _wait_endpoints(job, as_json, *service_wait)
        if follow:
            follow_logs(job, as_json=as_json)
        elif wait:
            job.wait(on_waiting=tell_waiting)
        else:
            return 0
    except KeyboardInterrupt:
        return _interrupted(job, cancel_on_interrupt)
    return _ended(job, as_json)


def _wait_endpoints(job: Job, as_json: bool, wait_s: float, max_failed_starts: int) -> int:
    """Print a service's endpoints once every replica has one: 0. A replica that failed to start
    `max_failed_starts` times (1), or `wait_s` passed (124): the job's last log lines and why on
    stderr; the service itself goes on by its restart policy."""
    try:
        endpoints = job.endpoints(wait=wait_s, on_waiting=tell_waiting, max_failed_starts=max_failed_starts)
    except (ServiceNotStarting, WaitTimeout) as exc:
        for line in job.logs()[-SERVICE_LOG_LINES:]:  # on stderr: stdout holds the job id (and endpoints)
            system = line.get("stream") == "system"
            typer.echo(("[gpulayer] " if system else "") + line.get("text", "").rstrip("\n"), err=True)
        typer.echo(style(f"{exc}; it goes on restarting by its --restart policy: `gpulayer job cancel {job.id}` "
                         "stops it", "red", err=True), err=True)
        return 124 if isinstance(exc, WaitTimeout) else 1
    for endpoint in endpoints:
        if as_json:
            print_json({"endpoint": endpoint}, compact=True)
        else:
            typer.echo(endpoint)
    return 0


def _print_ingress(url: str, made_key: Optional[str], as_json: bool) -> None:
    """The service's ingress URL (and the key made for it, shown this once) after its id."""
    if as_json:
        print_json({"ingress_url": url, **({"ingress_key": made_key} if made_key else {})}, compact=True)
        return
    typer.echo(f"ingress {url}")
    if made_key:
        typer.echo(f"ingress key {made_key}")
        typer.echo("(the key is shown this once: the control plane keeps only its SHA-256)", err=True)


def _service_wait(spec: dict, wait_timeout: Optional[str], max_failed_starts: Optional[int]) -> tuple[float, int]:
    """How long `submit --service` waits for the endpoints, and after how many failed starts of a replica
    it gives up; both options are a service's (a usage error without one)."""
    if not spec.get("service") and (wait_timeout is not None or max_failed_starts is not None):
        flag = "--wait-timeout" if wait_timeout is not None else "--max-failed-starts"
        raise typer.BadParameter("waits for a service's endpoints: add --service (--wait waits for a job)",
                                 param_hint=flag)
    seconds = parse_duration(wait_timeout, "--wait-timeout", positive=True)
    return (ENDPOINT_WAIT_S if seconds is None else seconds,
            MAX_FAILED_STARTS if max_failed_starts is None else max_failed_starts)


def _print_submitted(job: Job, as_json: bool) -> None:
    """The job just submitted: its id alone, or with --json the Job as one line."""
    if as_json:
        print_json(job.data, compact=True)
    else:
        typer.echo(job.id)


def _ended(job: Job, as_json: bool) -> int:
    """The exit status of a job that ended, after a line on stderr saying why when it did not succeed
    (tell_ended; with --json, the Job as it ended is printed, one line)."""
    info = job.data if job.finished() else job.info()  # following or waiting left the job as it ended
    tell_ended(info)
    if as_json:
        print_json(info, compact=True)
    return exit_code_of(info)


def _interrupted(job: Job, cancel: bool, stop_wait_s: float = 0.0) -> int:
    """Ctrl-C while waiting on `job`: cancel it or say how to; the exit status (130)."""
    if cancel:
        job.cancel()
        if stop_wait_s:
            job.wait(timeout=stop_wait_s)
        try:
            typer.echo(f"job {job.id} cancelled", err=True)
        except OSError:  # SIGHUP: the terminal is gone
            pass
    else:
        try:
            state = job.info()["state"]  # the copy the wait fetched last may be a second old
        except ClientError:
            state = job.data.get("state") or "queued"
        if job.finished():
            typer.echo(f"job {job.id} {state}", err=True)
        else:
            typer.echo(f"job {job.id} is still {state}: gpulayer job cancel {job.id}", err=True)
    return 130


def _submit_local(spec: dict, home: Path, as_json: bool) -> int:
    """Submit `spec` to an in-process control plane, stream its logs, return its exit code.

    Ctrl-C, SIGTERM and SIGHUP (a closed terminal) cancel the job and stop the control plane and
    worker (exit 130, 143, 129): the job cannot outlive the command.
    """
    from gpulayer.cli.local import signals_interrupt
    with signals_interrupt() as received:
        try:
            return _run_local(spec, home, as_json, received)
        except KeyboardInterrupt:  # before the job was made: the control plane and worker stopped
            return 128 + received[0] if received else 130


def _run_local(spec: dict, home: Path, as_json: bool, received: list[int]) -> int:
    from gpulayer.cli.local import WORKER_STOP_S, local_control_plane, quiet_logs, unmet
    quiet_logs()
    with local_control_plane(home) as (client, _tokens, worker):
        # This machine is a local run's only worker: what it can never meet is refused, not waited for.
        reason = unmet(spec, worker) if worker is not None else None
        if reason:
            raise fail(f"{reason}: a `--target local` job runs on this machine alone (send it to a control "
                       "plane with such workers: --url, GPULAYER_URL)", 2)
        job = client.submit(spec)
        try:
            if not as_json:
                print(job.id, flush=True)
            follow_logs(job, as_json=as_json)
        except KeyboardInterrupt:
            # The control plane and worker end with this command: the job cannot outlive it.
            code = _interrupted(job, True, WORKER_STOP_S)
            return 128 + received[0] if received else code
        if spec.get("outputs"):
            # Like `gpulayer job outputs --dest .`: the outputs land where the command was typed.
            for path in job.download_outputs(Path.cwd()):
                print(f"gpulayer: output {path}", file=sys.stderr)
        return _ended(job, as_json)


def _priority_option(value: Optional[str]) -> int | str | None:
    """--priority: a number, or the name of one of the server's priority classes (it checks the name)."""
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return value
