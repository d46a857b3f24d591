"""`gpulayer submit` and `gpulayer job ...`: thin wrappers over gpulayer.client.api."""
from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer


from gpulayer.client import specs
from gpulayer.cli.common import (
    client_of, exit_code_of, fail, fmt_time, global_options, home_of, parse_pairs, print_json,
    print_log_line, print_table,
)
from gpulayer.client.api import Job, server_configured

job_app = typer.Typer(help="Inspect and control submitted jobs.", no_args_is_help=True)

ENDPOINT_WAIT_S = 365 * 86400.0  # `submit --service` waits until the service is up or ends


class Target(str, Enum):
    local = "local"
    remote = "remote"


class Restart(str, Enum):
    always = "always"
    on_failure = "on_failure"


def _opt(*names: str, help: str, **kw):
    return typer.Option(*names, help=help, **kw)


def submit(
    ctx: typer.Context,
    command: Annotated[Optional[list[str]], typer.Argument(help="The command, after `--`.", metavar="CMD", show_default=False)] = None,
    target: Annotated[Optional[Target], _opt("--target", help="local: run here with no server; remote: send to the control plane. Default: remote when a server is configured.")] = None,
    name: Annotated[Optional[str], _opt("--name", help="A label for people.")] = None,
    accelerator: Annotated[Optional[str], _opt("--accelerator", help="'cuda' (alone: one GPU).")] = None,
    gpus: Annotated[Optional[int], _opt("--gpus", help="GPUs per task.", min=0)] = None,
    cpus: Annotated[Optional[float], _opt("--cpus", help="CPUs per task.", min=0)] = None,
    memory_mb: Annotated[Optional[int], _opt("--memory-mb", help="Memory per task, MB.", min=0)] = None,
    label: Annotated[Optional[list[str]], _opt("--label", help="k=v a worker must carry (repeatable).")] = None,
    env: Annotated[Optional[list[str]], _opt("--env", help="K=V for the task's environment (repeatable).")] = None,
    source: Annotated[Optional[Path], _opt("--source", help="Directory packed (git-tracked files only in a checkout) and unpacked as the working directory.")] = None,
    input_: Annotated[Optional[list[str]], _opt("--input", help="Local file or folder uploaded and placed at the same relative path (repeatable).")] = None,
    output: Annotated[Optional[list[str]], _opt("--output", help="Relative path collected after the run (repeatable).")] = None,
    retry: Annotated[Optional[int], _opt("--retry", help="Max attempts.", min=1)] = None,
    retry_on: Annotated[Optional[list[str]], _opt("--retry-on", help="Reason to retry on: worker_lost, worker_revoked, failed, timed_out, start_timeout (repeatable).")] = None,
    timeout: Annotated[Optional[float], _opt("--timeout", help="End the task after S seconds.", min=0)] = None,
    silence_timeout: Annotated[Optional[float], _opt("--silence-timeout", help="End the task after S seconds without output.", min=0)] = None,
    priority: Annotated[Optional[int], _opt("--priority", help="Higher runs first.")] = None,
    nodes: Annotated[Optional[int], _opt("--nodes", help="Multi-node: ranks, each on its own worker.", min=1)] = None,
    secret: Annotated[Optional[list[str]], _opt("--secret", help="Secret passed as an environment variable (repeatable).")] = None,
    service: Annotated[bool, _opt("--service", help="A long-running service.")] = False,
    replicas: Annotated[int, _opt("--replicas", help="Service replicas, each on its own worker.", min=1)] = 1,
    no_port: Annotated[bool, _opt("--no-port", help="Do not pick a $PORT for the service.")] = False,
    restart: Annotated[Restart, _opt("--restart", help="When to restart a service replica.")] = Restart.always,
    max_restarts: Annotated[Optional[int], _opt("--max-restarts", help="Restarts per replica (default: no limit).", min=0)] = None,
    health_path: Annotated[Optional[str], _opt("--health-path", help="HTTP path that must answer 2xx.")] = None,
    weights: Annotated[Optional[str], _opt("--weights", help="Artifact digest or local file passed to the service.")] = None,
    wait: Annotated[bool, _opt("--wait", help="Wait and exit with the job's exit code.")] = False,
    follow: Annotated[bool, _opt("--follow", help="Stream the logs, then exit with the job's exit code.")] = False,
    as_json: Annotated[bool, _opt("--json", help="Print the Job as JSON instead of its id.")] = False,
) -> None:
    """Submit a job (or a service): prints the job id on the first line of stdout."""
    if not command:
        raise typer.BadParameter("give the command after `--`, e.g. gpulayer submit -- echo hello",
                                 param_hint="CMD")
    settings = dict(
        name=name, env=parse_pairs(env, "--env") or None, accelerator=accelerator, gpus=gpus,
        cpus=cpus, memory_mb=memory_mb, labels=parse_pairs(label, "--label") or None, retry=retry,
        retry_on=retry_on or None, timeout_seconds=timeout, silence_timeout_seconds=silence_timeout,
        source=str(source) if source else None, inputs=list(input_) if input_ else None,
        outputs=output or None, nodes=nodes, priority=priority, secrets=secret or None,
    )
    if service:
        spec = specs.service(command, replicas=replicas, port=not no_port, restart=restart.value,
                             max_restarts=max_restarts, health_path=health_path, weights=weights, **settings)
    else:
        spec = specs.job(command, **settings)
    opts = global_options(ctx)
    remote = target == Target.remote or (target is None and server_configured(opts.url, opts.home))
    if not remote:
        if service:
            raise fail("--service needs a control plane: run `gpulayer up`, or pass --url / GPULAYER_URL", 2)
        raise typer.Exit(_submit_local(spec, home_of(ctx), as_json))
    raise typer.Exit(_submit_remote(ctx, spec, service, wait, follow, as_json))


def _submit_remote(ctx, spec, service, wait, follow, as_json) -> int:
    client = client_of(ctx)
    job = client.submit(spec)
    if as_json:
        print_json(job.data, compact=True)
    else:
        typer.echo(job.id)
    if service:
        for endpoint in job.endpoints(wait=ENDPOINT_WAIT_S):
            typer.echo(endpoint)
        return 0
    if follow:
        follow_logs(job)
    elif wait:
        job.wait()
    else:
        return 0
    return exit_code_of(job.info())


def _submit_local(spec: dict, home: Path, as_json: bool) -> int:
    """Submit `spec` to an in-process control plane, stream its logs, return its exit code."""
    from gpulayer.cli.local import WORKER_STOP_S, local_control_plane, quiet_logs
    quiet_logs()
    with local_control_plane(home) as (client, _tokens):
        job = client.submit(spec)
        if as_json:
            print_json(job.data, compact=True)
        else:
            print(job.id, flush=True)
        try:
            follow_logs(job)
        except KeyboardInterrupt:
            job.cancel()
            job.wait(timeout=WORKER_STOP_S)
            return 130
        if spec.get("outputs"):
            # Like `gpulayer job outputs --dest .`: the outputs land where the command was typed.
            for path in job.download_outputs(Path.cwd()):
                print(f"gpulayer: output {path}", file=sys.stderr)
        return exit_code_of(job.info())


def follow_logs(job: Job) -> None:
    """Print the job's logs until it has finished (prefixed by task when it has several)."""
    prefixes = _task_prefixes(job.info())
    for line in job.logs(follow=True):
        print_log_line(line, prefixes.get(line.get("task_id"), ""))


def _task_prefixes(info: dict) -> dict:
    spec = info.get("spec") or {}
    width = max(int(spec.get("nodes") or 1), int((spec.get("service") or {}).get("replicas") or 1))
    if width <= 1:
        return {}
    return {t["task_id"]: f"[{t.get('index', '?')}] " for t in info.get("tasks", [])}


JobArg = Annotated[int, typer.Argument(help="The job id.", metavar="JOB", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]


@job_app.command("status")
def job_status(ctx: typer.Context, job_id: JobArg, as_json: JsonOpt = False) -> None:
    """The job's state, and each task's worker, address and endpoint."""
    info = client_of(ctx).get_job(job_id).data
    if as_json:
        print_json(info)
        return
    typer.echo(f"job {info['id']} {info.get('name') or ''}".rstrip())
    typer.echo(f"state={info['state']} exit_code={_dash(info.get('exit_code'))} "
               f"created={fmt_time(info.get('created_at'))} finished={fmt_time(info.get('finished_at'))}")
    if info.get("waiting_reason"):
        typer.echo(f"waiting: {info['waiting_reason']}")
    for task in info.get("tasks", []):
        typer.echo(f"  task {task['task_id']} index={task.get('index')} attempt={task.get('attempt')} "
                   f"state={task.get('state')} worker={_worker(task)} "
                   f"address={_dash(task.get('address'))} endpoint={_dash(task.get('endpoint'))} "
                   f"restarts={task.get('restarts') or 0} exit_code={_dash(task.get('exit_code'))}"
                   + (f" reason={task['reason']}" if task.get("reason") else ""))


def _worker(task: dict) -> str:
    """`name(id)` of a task's worker, or '-' while it has none."""
    if task.get("worker_id") is None:
        return "-"
    return f"{task['worker_name']}({task['worker_id']})" if task.get("worker_name") else str(task["worker_id"])


def _dash(value) -> str:
    return "-" if value is None else str(value)


@job_app.command("logs")
def job_logs(ctx: typer.Context, job_id: JobArg,
             follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")] = False,
             as_json: JsonOpt = False) -> None:
    """The job's output: task stdout on stdout, stderr and system lines on stderr."""
    job = client_of(ctx).get_job(job_id)
    if as_json:
        for line in job.logs(follow=follow):
            print_json(line, compact=True)
    elif follow:
        follow_logs(job)
    else:
        prefixes = _task_prefixes(job.data)
        for line in job.logs():
            print_log_line(line, prefixes.get(line.get("task_id"), ""))


@job_app.command("cancel")
def job_cancel(ctx: typer.Context, job_id: JobArg, as_json: JsonOpt = False) -> None:
    """Cancel a job: every task (every replica, every rank) is stopped."""
    info = client_of(ctx).get_job(job_id).cancel()
    if as_json:
        print_json(info)
    else:
        typer.echo(f"job {info['id']} {info['state']}")


@job_app.command("list")
def job_list(ctx: typer.Context,
             state: Annotated[Optional[str], typer.Option("--state", help="Only jobs in this state.")] = None,
             limit: Annotated[int, typer.Option("--limit", help="At most this many (max 1000).", min=1, max=1000)] = 100,
             as_json: JsonOpt = False) -> None:
    """Jobs, newest first."""
    jobs = client_of(ctx).jobs(state=state, limit=limit)
    if as_json:
        print_json(jobs)
        return
    rows = [[j["id"], j["state"], j.get("exit_code"), j.get("name"), fmt_time(j.get("created_at")),
             " ".join((j.get("spec") or {}).get("command", []))[:60]] for j in jobs]
    print_table(rows, ["ID", "STATE", "EXIT", "NAME", "CREATED", "COMMAND"])


@job_app.command("outputs")
def job_outputs(ctx: typer.Context, job_id: JobArg,
                dest: Annotated[Path, typer.Option("--dest", help="Directory to write the outputs into.")] = Path("."),
                as_json: JsonOpt = False) -> None:
    """Download the job's outputs into --dest at their relative paths."""
    job = client_of(ctx).get_job(job_id)
    written = job.download_outputs(dest)
    if as_json:
        print_json([str(p) for p in written])
        return
    for path in written:
        typer.echo(str(path))
    if not written:
        typer.echo(f"job {job_id} has no outputs", err=True)


@job_app.command("events")
def job_events(ctx: typer.Context, job_id: JobArg, as_json: JsonOpt = False) -> None:
    """The job's events, oldest first."""
    events = client_of(ctx).get_job(job_id).events()
    if as_json:
        print_json(events)
        return
    for event in events:
        rest = {k: v for k, v in event.items() if k not in ("at", "kind", "id", "job_id")}
        typer.echo(f"{fmt_time(event.get('at'))}  {event.get('kind')}  {json.dumps(rest, sort_keys=True)}")
