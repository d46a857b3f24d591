"""`gpulayer worker list|start` and `gpulayer join`: run or list worker agents."""
from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Annotated, Optional

import typer

from gpulayer.cli.common import (client_of, fail, fmt_time, global_options, home_of, parse_duration, parse_pairs,
                                 print_json, print_table)

worker_app = typer.Typer(help="List workers, or run a worker agent on this machine.", no_args_is_help=True)

Name = Annotated[Optional[str], typer.Option("--name", help="Worker name (default: the host name).")]
Labels = Annotated[Optional[list[str]], typer.Option("--label", help="k=v this worker carries (repeatable).")]
Python = Annotated[Optional[str], typer.Option("--python", help="Interpreter that tasks get as `python`.")]
Advertise = Annotated[Optional[str], typer.Option("--advertise-address", help="Address others reach this worker at (multi-node jobs, service endpoints); default: this machine's address on its route to the control plane.")]
Parallel = Annotated[int, typer.Option("--parallel", help="Tasks run at the same time.", min=1)]
Cpus = Annotated[Optional[float], typer.Option("--cpus", help="CPUs to advertise (default: detected).", min=0)]
Gpus = Annotated[Optional[int], typer.Option("--gpus", help="GPUs to advertise (default: detected; 0 means none).", min=0)]
GpuSharing = Annotated[str, typer.Option("--gpu-sharing", metavar="mps|time-slice|off", help="Share each GPU between fractional tasks (submit --gpu-fraction / --gpu-memory): mps runs NVIDIA MPS's control daemon per GPU (without it installed the worker says so and offers whole GPUs), time-slice gives the device and enforces each task's memory share; off: whole GPUs only (docs/workers.md, \"Sharing a GPU\").")]
PinCpus = Annotated[bool, typer.Option("--pin-cpus", envvar="GPULAYER_WORKER_PIN_CPUS", show_envvar=True, help="Run each task on the CPUs local to its GPUs (their NUMA node; the union across nodes), split between tasks that ask --cpus so they do not overlap where there are cores enough; tasks without GPUs run on the CPUs no GPU task holds (docs/workers.md, \"Pinning CPUs\").")]
RamMb = Annotated[Optional[int], typer.Option("--ram-mb", help="Memory to advertise, MB (default: detected).", min=0)]
MaxIdle = Annotated[str, typer.Option("--max-idle", metavar="DURATION", help="Exit after this long idle (seconds, or 30m, 2h, ...); 0 never.")]
DrainTimeout = Annotated[str, typer.Option("--drain-timeout", metavar="DURATION", help="On SIGTERM (or Ctrl-C), take no new task and let running ones finish for up to this long (seconds, or 10m, ...) before stopping them; a second signal stops at once.")]
StateDir = Annotated[Optional[Path], typer.Option("--state-dir", envvar="GPULAYER_WORKER_STATE_DIR", show_envvar=True, help="Task working directories, running tasks' records and the pinned CA (default: $GPULAYER_HOME/workers/NAME, one per worker name).")]
Insecure = Annotated[bool, typer.Option("--insecure", help="Allow plain HTTP to a non-loopback control plane.")]
JoinToken = Annotated[Optional[str], typer.Option("--token", envvar="GPULAYER_JOIN_TOKEN", show_envvar=True, help="Join token glj_...; prefer --token-file or the environment variable, which keep it out of process listings.")]
SandboxMode = Annotated[str, typer.Option("--sandbox", envvar="GPULAYER_WORKER_SANDBOX", show_envvar=True, help="auto: each task in a bubblewrap sandbox where bwrap works, else unsandboxed with a warning; bwrap: sandbox or refuse to start; none: tasks run as the agent, unconfined (docs/security.md). Default: auto.")]
SandboxBind = Annotated[Optional[list[str]], typer.Option("--sandbox-bind", envvar="GPULAYER_WORKER_SANDBOX_BIND", show_envvar=True, metavar="HOST[:TASK][:ro]", help="Bind a host path into every sandboxed task, at TASK (default the same path), read-only with :ro; repeatable (/data:/data:ro, /scratch).")]
#: --sandbox unless told: agent/sandbox.DEFAULT_MODE (not imported: the CLI loads the agent lazily).
SANDBOX_DEFAULT = "auto"
NoExec = Annotated[bool, typer.Option("--no-exec", envvar="GPULAYER_WORKER_NO_EXEC", show_envvar=True, help="Run no command for the relay: refuse `gpulayer exec`, `shell` and SSH into this worker's tasks; port-forward and ingress still work (docs/security.md).")]
RunAs = Annotated[Optional[str], typer.Option("--run-as", envvar="GPULAYER_WORKER_RUN_AS", show_envvar=True, help="The user a root agent's sandboxed tasks run as (default: gpulayer-task, created if missing, else nobody).")]
AllowRootTasks = Annotated[bool, typer.Option("--allow-root-tasks", help="Let a job that asks (run_as_root) run as root when the agent runs as root.")]
TokenFile = Annotated[Optional[str], typer.Option("--token-file", envvar="GPULAYER_JOIN_TOKEN_FILE", show_envvar=True, help="File holding the join token (wins over --token and GPULAYER_JOIN_TOKEN).")]


def _run(settings: dict, root_token: Optional[str] = None) -> int:
    """Run the agent in the foreground with these settings; its exit code.

    `root_token` is the --token given before the command (a client token's
    place), told apart from the join token when it is one.
    """
    from agent.hardening import TokenFileError, read_token_file
    from gpulayer.cli.up import run_worker_foreground
    token_file = settings.pop("token_file", None)
    if token_file:
        try:
            settings["join_token"] = read_token_file(token_file)
        except TokenFileError as exc:
            raise fail(str(exc), 2) from None
    if not settings.get("join_token") and (root_token or "").startswith("glj_"):
        raise fail("the join token goes after the command (`gpulayer join URL --token-file FILE`, or "
                   "GPULAYER_JOIN_TOKEN); --token before the command is a client token (glc_...)", 2)
    if (settings.get("join_token") or "").startswith("glc_"):
        raise fail("that is a client token (glc_...), for commands like `gpulayer --token glc_... job list`; "
                   "a worker joins with a join token (glj_...), as `gpulayer up` prints or `gpulayer token create` mints", 2)
    if not settings.get("join_token"):
        raise fail("a join token is needed: pass --token-file or set GPULAYER_JOIN_TOKEN", 2)
    if not settings.get("url"):
        raise fail("no control plane URL: pass --url or set GPULAYER_URL", 2)
    return run_worker_foreground(settings)


def default_state_dir(ctx: typer.Context, name: Optional[str]) -> Path:
    """`$GPULAYER_HOME/workers/NAME` (NAME: --name, else the host name): each worker name its own folder,
    none shared with `up`'s worker (HOME/worker) or a local run's (HOME/local-worker)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name or socket.gethostname()).lstrip(".") or "worker"
    return home_of(ctx) / "workers" / safe


def _worker_settings(name, label, python, advertise_address, parallel, cpus, gpus, ram_mb,
                     max_idle, state_dir, insecure, drain_timeout="0", gpu_sharing="off", pin_cpus=False) -> dict:
    if gpu_sharing not in ("off", "mps", "time-slice"):
        raise typer.BadParameter(f"expected mps, time-slice or off, got {gpu_sharing!r}", param_hint="--gpu-sharing")
    return dict(gpu_sharing=gpu_sharing, pin_cpus=pin_cpus, name=name, labels=parse_pairs(label, "--label"), python=python,
                advertise_address=advertise_address, parallel=parallel, cpus=cpus, gpus=gpus,
                ram_mb=ram_mb, max_idle_s=parse_duration(max_idle, "--max-idle"), state_dir=state_dir,
                insecure=insecure, drain_timeout_s=parse_duration(drain_timeout, "--drain-timeout"))


def sandbox_settings(sandbox: str, run_as: Optional[str], allow_root_tasks: bool,
                     binds: Optional[list[str]] = None) -> dict:
    """--sandbox, --run-as, --allow-root-tasks and --sandbox-bind as WorkerConfig fields (a bad --sandbox or
    --sandbox-bind is a usage error)."""
    from agent.sandbox.bwrap import SandboxError, parse_bind
    if sandbox not in ("auto", "bwrap", "none"):
        raise typer.BadParameter(f"expected auto, bwrap or none, got {sandbox!r}", param_hint="--sandbox")
    for spec in binds or []:
        try:
            parse_bind(spec)
        except SandboxError as exc:
            raise typer.BadParameter(str(exc).removeprefix(f"--sandbox-bind {spec}: "),
                                     param_hint="--sandbox-bind") from None
    return dict(sandbox=sandbox, run_as=run_as, allow_root_tasks=allow_root_tasks, sandbox_binds=binds or [])


def _isolation_settings(ctx: typer.Context, sandbox: str, run_as: Optional[str], allow_root_tasks: bool,
                        token_file: Optional[str], binds: Optional[list[str]]) -> dict:
    """sandbox_settings, and what tasks must not see: this CLI's home, the token file."""
    hidden = [str(home_of(ctx)), *([token_file] if token_file else [])]
    return dict(sandbox_settings(sandbox, run_as, allow_root_tasks, binds), hidden_paths=hidden)


@worker_app.command("start")
def worker_start(ctx: typer.Context, name: Name = None, label: Labels = None, python: Python = None,
                 advertise_address: Advertise = None, parallel: Parallel = 1, cpus: Cpus = None,
                 gpus: Gpus = None, ram_mb: RamMb = None, max_idle: MaxIdle = "0",
                 state_dir: StateDir = None, insecure: Insecure = False, token: JoinToken = None,
                 token_file: TokenFile = None, drain_timeout: DrainTimeout = "0", sandbox: SandboxMode = SANDBOX_DEFAULT,
                 run_as: RunAs = None, allow_root_tasks: AllowRootTasks = False, sandbox_bind: SandboxBind = None,
                 no_exec: NoExec = False, gpu_sharing: GpuSharing = "off", pin_cpus: PinCpus = False) -> None:
    """Run a worker agent against the control plane of --url (GPULAYER_URL) until stopped.

    \b
    Example:
      GPULAYER_JOIN_TOKEN=glj_... gpulayer --url https://cp:8470 worker start --parallel 4
      GPULAYER_JOIN_TOKEN=glj_... gpulayer --url https://cp:8470 worker start --parallel 16 --gpu-sharing mps
      GPULAYER_JOIN_TOKEN=glj_... gpulayer --url https://cp:8470 worker start --parallel 8 --pin-cpus
    """
    opts = global_options(ctx)
    settings = _worker_settings(name, label, python, advertise_address, parallel, cpus, gpus, ram_mb,
                                max_idle, state_dir or default_state_dir(ctx, name), insecure, drain_timeout,
                                gpu_sharing, pin_cpus)
    settings.update(url=opts.url, join_token=token, token_file=token_file, ca_file=opts.ca_file,
                    no_exec=no_exec, **_isolation_settings(ctx, sandbox, run_as, allow_root_tasks, token_file, sandbox_bind))
    raise typer.Exit(_run(settings, opts.token))


def join(ctx: typer.Context,
         url: Annotated[str, typer.Argument(help="The control plane, e.g. https://10.0.0.5:8470.", show_default=False)],
         token: JoinToken = None, token_file: TokenFile = None,
         ca_file: Annotated[Optional[str], typer.Option("--ca-file", envvar="GPULAYER_CA_FILE", show_envvar=True, help="CA certificate of the control plane.")] = None,
         ca_fingerprint: Annotated[Optional[str], typer.Option("--ca-fingerprint", envvar="GPULAYER_CA_FINGERPRINT", show_envvar=True, help="sha256:HEX of the control plane's CA, pinned on first contact.")] = None,
         name: Name = None, label: Labels = None, python: Python = None,
         advertise_address: Advertise = None, parallel: Parallel = 1, cpus: Cpus = None,
         gpus: Gpus = None, ram_mb: RamMb = None, max_idle: MaxIdle = "0",
         state_dir: StateDir = None, insecure: Insecure = False, drain_timeout: DrainTimeout = "0",
         sandbox: SandboxMode = SANDBOX_DEFAULT, run_as: RunAs = None, allow_root_tasks: AllowRootTasks = False,
         sandbox_bind: SandboxBind = None, no_exec: NoExec = False, gpu_sharing: GpuSharing = "off",
         pin_cpus: PinCpus = False) -> None:
    """Join this machine to a control plane as a worker (the line `gpulayer up` prints).

    \b
    Example:
      GPULAYER_JOIN_TOKEN=glj_... gpulayer join https://10.0.0.5:8470 --ca-fingerprint sha256:...
    """
    if ca_file and ca_fingerprint:
        raise typer.BadParameter("give --ca-file or --ca-fingerprint, not both", param_hint="--ca-fingerprint")
    if ca_fingerprint and not ca_fingerprint.startswith("sha256:"):
        raise typer.BadParameter("expected sha256:HEX", param_hint="--ca-fingerprint")
    settings = _worker_settings(name, label, python, advertise_address, parallel, cpus, gpus, ram_mb,
                                max_idle, state_dir or default_state_dir(ctx, name), insecure, drain_timeout,
                                gpu_sharing, pin_cpus)
    settings.update(url=url.rstrip("/"), join_token=token, token_file=token_file, ca_file=ca_file or global_options(ctx).ca_file,
                    ca_fingerprint=ca_fingerprint, no_exec=no_exec, **_isolation_settings(ctx, sandbox, run_as, allow_root_tasks, token_file, sandbox_bind))
    raise typer.Exit(_run(settings, global_options(ctx).token))


@worker_app.command("list")
def worker_list(ctx: typer.Context,
                as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Workers the control plane knows: state, free slots, resources, labels.

    \b
    Example:
      gpulayer worker list
    """
    workers = client_of(ctx).workers()
    if as_json:
        print_json(workers)
        return
    rows = []
    for w in workers:
        res = w.get("resources") or {}
        labels = ",".join(f"{k}={v}" for k, v in sorted((w.get("labels") or {}).items()))
        rows.append([w["id"], w.get("name"), _state(w), _slots(w),
                     res.get("cpus"), _gpus(w), res.get("memory_mb"),
                     labels, isolation_of(w), w.get("advertise_address"), fmt_time(w.get("last_seen_at")),
                     w.get("cordon_reason")])
    print_table(rows, ["ID", "NAME", "STATE", "SLOTS", "CPUS", "GPUS", "MEM_MB", "LABELS", "ISOLATION", "ADDRESS",
                       "LAST_SEEN", "REASON"])
    _print_provisioning(client_of(ctx))


def isolation_of(worker: dict) -> str:
    """How a worker isolates its tasks, in a word or two: `bwrap`, `bwrap:gpulayer-task`, `none`, `none!` (it
    wanted a sandbox and could not have one: its `isolation.warning` says why), `?` (an older agent)."""
    found = worker.get("isolation") or {}
    if not found.get("sandbox"):
        return "?"
    user = f":{found['user']}" if found.get("user") else ""
    return f"{found['sandbox']}{user}{'!' if found.get('warning') else ''}"


def _slots(worker: dict) -> str:
    """Slots in use / all slots, as `squeue`'s CPUS=used/total reads: `1/4`."""
    total, free = worker.get("slots"), (worker.get("free") or {}).get("slots")
    return f"{total - free}/{total}" if isinstance(total, int) and isinstance(free, int) else f"?/{total}"


def _state(worker: dict) -> str:
    """`online`, or `online+drained` (the cordon after the worker's own state), as Slurm's `idle+drain`."""
    state = str(worker.get("state"))
    return f"{state}+{worker['cordon']}" if worker.get("cordon") else state


def _gpus(worker: dict) -> str:
    """free/total GPUs, and the unhealthy ones' indices when there are some: `6/8 (bad: 3)`; a worker sharing
    its GPUs adds its mode and the shares held: `2/4 mps (1.5 on 2)`."""
    text = f"{(worker.get('free') or {}).get('gpus', '?')}/{(worker.get('resources') or {}).get('gpus', 0)}"
    bad = [str(g["index"]) for g in worker.get("gpus") or [] if not g.get("healthy", True)]
    res, shares = worker.get("resources") or {}, worker.get("gpu_shares") or {}
    if res.get("gpu_sharing", "off") != "off":  # fractions of a GPU: the mode, and the shares held on how many GPUs
        text += f" {res['gpu_sharing']}"
        if shares.get("gpus"):
            text += f" ({shares.get('used', 0):g} on {shares['gpus']})"
    return f"{text} (bad: {','.join(bad)})" if bad else text


WorkerRef = Annotated[str, typer.Argument(help="The worker's id or name (`gpulayer worker list`).", show_default=False)]
Reason = Annotated[str, typer.Option("--reason", help="Why (shown in `worker list`, the explorer and the events).",
                                     show_default=False)]


@worker_app.command("cordon")
def worker_cordon(ctx: typer.Context, worker: WorkerRef, reason: Reason) -> None:
    """Give a worker no new task; what runs there goes on (Slurm: scontrol update state=drain).

    \b
    Example:
      gpulayer worker cordon gpu-07 --reason "fan noise, RMA ticket 4411"
    """
    _print_cordon(client_of(ctx).cordon_worker(worker, reason))


@worker_app.command("drain")
def worker_drain(ctx: typer.Context, worker: WorkerRef, reason: Reason,
                 timeout: Annotated[Optional[str], typer.Option("--timeout", metavar="DURATION", help="After this long (90, 30m, 2h, 1:30:00), stop what still runs and put it back in the queue, same attempt (no retry used up); default: wait for it to end.")] = None) -> None:
    """Cordon a worker; it shows `drained` once its tasks have ended (or at --timeout, when they are stopped).

    \b
    Example:
      gpulayer worker drain gpu-07 --reason "kernel upgrade" --timeout 2h
    """
    timeout_s = parse_duration(timeout, "--timeout")
    _print_cordon(client_of(ctx).drain_worker(worker, reason, timeout_s))


@worker_app.command("uncordon")
def worker_uncordon(ctx: typer.Context, worker: WorkerRef) -> None:
    """Put a cordoned, draining or drained worker back into service (Slurm: state=resume).

    \b
    Example:
      gpulayer worker uncordon gpu-07
    """
    _print_cordon(client_of(ctx).uncordon_worker(worker))


@worker_app.command("gpu-reset")
def worker_gpu_reset(ctx: typer.Context, worker: WorkerRef,
                     gpu: Annotated[int, typer.Option("--gpu", help="The device index (as `worker list --json` shows under gpus).", min=0, show_default=False)]) -> None:
    """Mark a GPU its agent reported unhealthy as healthy again (after the fault was dealt with).

    \b
    Example:
      gpulayer worker gpu-reset gpu-07 --gpu 3
    """
    answer = client_of(ctx).reset_gpu(worker, gpu)
    typer.echo(f"worker {answer['name']} (id {answer['worker_id']}): GPU {gpu} marked healthy")


def _print_cordon(answer: dict) -> None:
    if answer.get("cordon"):
        until = f", stopping what still runs at {fmt_time(answer['drain_deadline'])}" if answer.get("drain_deadline") else ""
        typer.echo(f"worker {answer['name']} (id {answer['id']}): {answer['cordon']}: {answer['cordon_reason']}{until}")
    else:
        typer.echo(f"worker {answer['name']} (id {answer['id']}): in service")


def _print_provisioning(client) -> None:
    """Below the workers: recent provision requests (Slurm jobs, Kubernetes Pods), when any provisioner is configured."""
    from gpulayer.client.errors import NotFound
    try:
        state = client.provisioners(limit=20)
    except NotFound:  # a control plane from before /v1/provisioners
        return
    if not state["provisioners"] and not state["requests"]:
        return
    kinds = [k for k in ("slurm", "kubernetes") if any(p.get("type", "slurm") == k for p in state["provisioners"])]
    typer.echo(f"\nProvisioning ({', '.join(k.capitalize() for k in kinds) or 'Slurm'}): " + ", ".join(
        f"{p['name']} [{', '.join(f['name'] for f in p['profiles'])}]" for p in state["provisioners"]))
    rows = [[r["id"], r["provisioner"], r["profile"], r["state"], r["slurm_job_id"], r.get("worker_name"),
             fmt_time(r["updated_at"]), (r["last_error"] or "").splitlines()[0][:80] if r["last_error"] else None]
            for r in state["requests"]]
    if rows:
        print_table(rows, ["REQ", "PROVISIONER", "PROFILE", "STATE", "JOB/POD" if "kubernetes" in kinds else "SLURM_JOB",
                           "WORKER", "UPDATED", "LAST_ERROR"])
