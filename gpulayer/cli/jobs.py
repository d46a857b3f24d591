"""`gpulayer submit` and `gpulayer job ...`: thin wrappers over gpulayer.client.api."""
from __future__ import annotations

import json
import re
import sys
import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer


from gpulayer.cli import selection
from gpulayer.cli.common import (
    client_of, colour_on, exit_code_of, fail, fmt_time, global_options, home_of, parse_duration, parse_pairs,
    print_json, print_log_line, print_table, style,
)
from gpulayer.client.errors import ApiError, ClientError
from gpulayer.protocol import JOB_STATES, array_text, plural
from gpulayer.client.api import FINISHED_STATES, Job, server_configured
from gpulayer.client.jobfile import read_job_file, spec_from_fields
from gpulayer.client.transfers import check_local_paths

job_app = typer.Typer(help="Inspect and control submitted jobs.", no_args_is_help=True)

ENDPOINT_WAIT_S = 365 * 86400.0  # `submit --service` waits until the service is up or ends
WATCH_S = 2.0  # `job list --watch` redraws this often


class Target(str, Enum):
    local = "local"
    remote = "remote"


class Restart(str, Enum):
    always = "always"
    on_failure = "on_failure"


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
    gpu_model: Annotated[Optional[str], _opt("--gpu-model", help="Only GPUs of this model, or MIG profile (1g.10gb): the label gpu_model=MODEL.")] = None,
    env: Annotated[Optional[list[str]], _opt("--env", help="K=V for the task's environment (repeatable).")] = None,
    source: Annotated[Optional[Path], _opt("--source", help="Directory packed (git-tracked files only in a checkout) and unpacked as the working directory.")] = None,
    input_: Annotated[Optional[list[str]], _opt("--input", help="Local file or folder uploaded and placed at the same relative path (repeatable).")] = None,
    output: Annotated[Optional[list[str]], _opt("--output", help="Relative path collected after the run (repeatable).")] = None,
    retry: Annotated[Optional[int], _opt("--retry", help="Max attempts.", min=1)] = None,
    retry_on: Annotated[Optional[list[str]], _opt("--retry-on", help="Reason to retry on: worker_lost, worker_revoked, failed, timed_out, start_timeout (repeatable).")] = None,
    timeout: Annotated[Optional[str], _opt("--timeout", metavar="DURATION", help="End the task after this long: seconds, 30m, 12h, 2d, or Slurm's 1:00:00, 2-00:00:00.")] = None,
    silence_timeout: Annotated[Optional[str], _opt("--silence-timeout", metavar="DURATION", help="End the task after this long without output (as --timeout).")] = None,
    priority: Annotated[Optional[str], _opt("--priority", help="Higher runs first: a number, or a class of the server (low=-10, normal=0, high=10 by default).")] = None,
    preemptible: Annotated[bool, _opt("--preemptible", help="May be stopped (SIGTERM, a grace, SIGKILL) and requeued, same attempt, for higher-priority work; $GPULAYER_PREEMPTED=1 in the next run.")] = False,
    nodes: Annotated[Optional[int], _opt("--nodes", help="Multi-node: ranks, each on its own worker.", min=1)] = None,
    secret: Annotated[Optional[list[str]], _opt("--secret", help="Secret passed as an environment variable (repeatable).")] = None,
    service: Annotated[bool, _opt("--service", help="A long-running service.")] = False,
    replicas: Annotated[Optional[int], _opt("--replicas", help="Service replicas, each on its own worker (default 1).", min=1)] = None,
    no_port: Annotated[bool, _opt("--no-port", help="Do not pick a $PORT for the service.")] = False,
    restart: Annotated[Optional[Restart], _opt("--restart", help="When to restart a service replica (default always).")] = None,
    max_restarts: Annotated[Optional[int], _opt("--max-restarts", help="Restarts per replica (default: no limit).", min=0)] = None,
    health_path: Annotated[Optional[str], _opt("--health-path", help="HTTP path that must answer 2xx.")] = None,
    weights: Annotated[Optional[str], _opt("--weights", help="Artifact digest or local file passed to the service.")] = None,
    array: Annotated[Optional[str], _opt("--array", metavar="INDICES", help="A job array, one task per index, like sbatch --array: 0-999, 1,5,9-12, 0-15:4; %N caps how many run at once (0-999%16). Each task sees $GPULAYER_ARRAY_INDEX and $GPULAYER_ARRAY_SIZE.")] = None,
    after: Annotated[Optional[list[str]], _opt("--after", metavar="JOB[:ok|notok|any]", help="Run after that job ends: ok (the default) once it succeeded, notok once it did not, any however (repeatable). Cancelled (dependency_failed) when it cannot be met.")] = None,
    after_array: Annotated[Optional[list[int]], _opt("--after-array", metavar="JOB", help="Run after every element of array JOB succeeded (repeatable).")] = None,
    network: Annotated[Optional[Network], _opt("--network", help="shared (the default): the worker's network; none: a loopback of the task's own (needs a sandboxed worker).")] = None,
    run_as_root: Annotated[bool, _opt("--run-as-root", help="Run as root where the worker runs as root and allows it (worker start --allow-root-tasks).")] = False,
    project: Annotated[Optional[str], _opt("--project", help="The project it counts against (default: your only project, else default).")] = None,
    wait: Annotated[bool, _opt("--wait", help="Wait and exit with the job's exit code.")] = False,
    follow: Annotated[bool, _opt("--follow", help="Stream the logs, then exit with the job's exit code.")] = False,
    as_json: Annotated[bool, _opt("--json", help="Print the Job as JSON instead of its id.")] = False,
    file: Annotated[Optional[Path], _opt("--file", "-f", help="A TOML file of JobSpec fields, as gl.job() takes them (options and a command after `--` override it).", exists=True, dir_okay=False)] = None,
    dry_run: Annotated[bool, _opt("--dry-run", help="Print the JobSpec that would be sent, and send nothing.")] = False,
    cancel_on_interrupt: Annotated[Optional[bool], _opt("--cancel-on-interrupt/--no-cancel-on-interrupt", help="Ctrl-C during --wait/--follow cancels the job (default: yes with --target local, no against a server).", show_default=False)] = None,
) -> None:
    """Submit a job (or a service): prints the job id on the first line of stdout.

    \b
    Examples:
      gpulayer submit --gpus 1 --wait -- python train.py
      gpulayer submit -f job.toml --dry-run
      gpulayer submit --array 0-999%16 -- python sweep.py
      gpulayer submit --after 41 -- python evaluate.py
    """
    settings = dict(
        name=name, env=parse_pairs(env, "--env") or None, accelerator=accelerator, gpus=gpus,
        cpus=cpus, memory_mb=memory_mb, labels=_labels_option(label, gpu_model), retry=retry,
        retry_on=retry_on or None, timeout_seconds=parse_duration(timeout, "--timeout", positive=True),
        silence_timeout_seconds=parse_duration(silence_timeout, "--silence-timeout", positive=True),
        source=str(source) if source else None, inputs=list(input_) if input_ else None,
        outputs=output or None, nodes=nodes, priority=_priority_option(priority), secrets=secret or None,
        array=array, after=_after_option(after, after_array), preemptible=True if preemptible else None,
        network=network.value if network else None, run_as_root=True if run_as_root else None,
    )
    service_settings = dict(replicas=replicas, port=False if no_port else None,
                            restart=restart.value if restart else None, max_restarts=max_restarts,
                            health_path=health_path, weights=weights)
    spec = _build_spec(command, file, service, settings, service_settings)
    check_local_paths(spec)  # a missing --source or --input is bad input, dry run or not
    if dry_run:
        print_json(spec)
        return
    opts = global_options(ctx)
    remote = target == Target.remote or (target is None and server_configured(opts.url, opts.home))
    if not remote:
        if spec.get("service"):
            raise fail("--service needs a control plane: run `gpulayer up`, or pass --url / GPULAYER_URL", 2)
        if cancel_on_interrupt is False:
            raise fail("--no-cancel-on-interrupt needs a control plane: a --target local job ends with the command", 2)
        raise typer.Exit(_submit_local(spec, home_of(ctx), as_json))
    for array_id in after_array or []:  # --after-array names an array: say so before anything is sent
        if client_of(ctx).get_job(array_id).data.get("array") is None:
            raise fail(f"--after-array: job {array_id} is no array (use --after {array_id})", 2)
    raise typer.Exit(_submit_remote(ctx, spec, wait, follow, as_json, bool(cancel_on_interrupt), project))


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


def _build_spec(command, file: Optional[Path], service: bool, settings: dict, service_settings: dict) -> dict:
    """The JobSpec of `submit`: the job file's fields (if any), then the options given, then the command."""
    if not command and not file:
        raise typer.BadParameter("give the command after `--`, e.g. gpulayer submit -- echo hello",
                                 param_hint="CMD")
    try:
        fields = read_job_file(file) if file else {}
        return spec_from_fields(fields, command, service, settings, service_settings)
    except (TypeError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--file" if file else None) from None


def _submit_remote(ctx, spec, wait, follow, as_json, cancel_on_interrupt: bool, project: Optional[str] = None) -> int:
    client = client_of(ctx)
    job = client.submit(spec, project) if project else client.submit(spec)
    waits = (follow or wait) and not spec.get("service")
    if not (as_json and waits):  # with --json, --wait and --follow print the Job as it ended, last
        _print_submitted(job, as_json)
    try:
        if spec.get("service"):
            for endpoint in job.endpoints(wait=ENDPOINT_WAIT_S, on_waiting=tell_waiting):
                if as_json:
                    print_json({"endpoint": endpoint}, compact=True)
                else:
                    typer.echo(endpoint)
            return 0
        if follow:
            follow_logs(job, as_json=as_json)
        elif wait:
            job.wait(on_waiting=tell_waiting)
        else:
            return 0
    except KeyboardInterrupt:
        return _interrupted(job, cancel_on_interrupt)
    return _ended(job, as_json)


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


def tell_ended(info: dict, index: Optional[int] = None) -> None:
    """Why a job (or its element `index`: `info` is then that element's latest task) that did not succeed
    ended, one line on stderr: `job 7 failed: exit code 3`, `job 7 cancelled: its dependency job 5 failed
    (dependency_failed)`, `job 7 lost (worker_lost)`: what it asked for, then the reason's code in parentheses
    (a reason in words, as an agent writes them, after the exit code)."""
    state = info.get("state")
    if state not in FINISHED_STATES or state == "succeeded":
        return
    reason, code = info.get("reason"), info.get("exit_code")
    what = f"job {info['id']}" if index is None else f"job {info['job_id']} element {index}"
    coded = reason != state and re.fullmatch(r"[a-z_]+", reason or "") is not None  # worker_lost
    told = [_unmet_dependency(info.get("after") or [])] if reason == "dependency_failed" else []
    if code not in (None, 0) and f"exit code {code}" not in (reason or ""):
        told.append(f"exit code {code}")
    if reason and reason != state and not coded:  # the agent's words ("timeout: ran longer than ...")
        told.append(reason)
    line = f"{what} {state}" + (f": {', '.join(told)}" if told else "") + (f" ({reason})" if coded else "")
    typer.echo(style(line, "red", err=True), err=True)


def _unmet_dependency(after: list[dict]) -> str:
    """Which of a job's dependencies ended against its condition, in words; one the caller may not see
    (its state rendered null: teams.hide_unseen) is named as hidden, its state untold."""
    for dep in after:
        state, condition = dep.get("state"), dep.get("condition") or "ok"
        if state in FINISHED_STATES and (condition == "ok") != (state == "succeeded") and condition != "any":
            asked = "" if condition == "ok" else f", and it runs after {dep['job']}:{condition}"
            return f"its dependency job {dep['job']} {state}{asked}"
    hidden = next((dep for dep in after if dep.get("state") is None), None)
    if hidden is not None:
        return (f"its dependency job {hidden['job']} (hidden: you may not see it) did not end as "
                f"{hidden['job']}:{hidden.get('condition') or 'ok'} asks")
    return "a dependency did not end as it asks"


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


def waiting_line(message: str) -> str:
    """ "waiting: no online worker ...", said once ("waiting for capacity: ..." as it is)."""
    return message if message.startswith("waiting") else f"waiting: {message}"


def tell_waiting(message: str) -> None:
    """What a job waits for, on stderr ("waiting: no online worker ...")."""
    typer.echo(style(waiting_line(message), "yellow", err=True), err=True)


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


def follow_logs(job: Job, index: Optional[int] = None, as_json: bool = False) -> None:
    """Print the job's logs (`index`: of that element alone) until it has finished (prefixed by task when it
    has several; with `as_json`, each line as one JSON object on stdout, as `job logs --json` prints it).

    What the job waits for goes to stderr while it has not started (tell_waiting).
    """
    prefixes = _task_prefixes(job.data) if index is None else {}  # the job as submitted or just read
    for line in job.logs(follow=True, on_waiting=tell_waiting, index=index):
        if as_json:
            print_json(line, compact=True)
        else:
            print_log_line(line, _line_prefix(prefixes, line))


def _line_prefix(prefixes: Optional[dict], line: dict) -> str:
    """`[index] ` before a line of a job with several tasks; None for an array, whose lines carry their index."""
    if prefixes is None:
        return f"[{line['index']}] " if line.get("index") is not None else ""
    return prefixes.get(line.get("task_id"), "")


def _task_prefixes(info: dict) -> Optional[dict]:
    spec = info.get("spec") or {}
    width = max(int(spec.get("nodes") or 1), int((spec.get("service") or {}).get("replicas") or 1))
    if spec.get("array"):
        return None
    if width <= 1:
        return {}
    return {t["task_id"]: f"[{t.get('index', '?')}] " for t in info.get("tasks", [])}


JobArg = Annotated[int, typer.Argument(help="The job id.", metavar="JOB", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]
IndexOpt = Annotated[Optional[int], typer.Option("--index", metavar="N", min=0, help="One element of an array (or one replica or rank): its index.")]


@job_app.command("status")
def job_status(ctx: typer.Context, job_id: JobArg, index: IndexOpt = None, as_json: JsonOpt = False) -> None:
    """The job's state, what it waits for, and each task's worker, address and endpoint.

    An array's status counts its elements by state and lists, as ranges
    (0-999,1204), the indices that failed or were lost and, apart, those
    cancelled (its tasks listed are those running and those that failed;
    --index N shows one element's).

    \b
    Examples:
      gpulayer job status 12
      gpulayer job status 12 --index 7
    """
    job = client_of(ctx).get_job(job_id)
    info = job.element(index) if index is not None else job.data
    if as_json:
        print_json(info)
        return
    typer.echo(f"job {info['id']} {info.get('name') or ''}".rstrip())
    typer.echo(f"state={info['state']} exit_code={_dash(info.get('exit_code'))} "
               f"created={fmt_time(info.get('created_at'))} finished={fmt_time(info.get('finished_at'))}"
               + (f" reason={info['reason']}" if info.get("reason") else "")
               + (f" owner={info['owner']} project={info.get('project') or '-'}" if info.get("owner") else ""))
    if info.get("waiting_reason"):
        typer.echo(waiting_line(info["waiting_reason"]))
    for dep in info.get("after") or []:
        typer.echo(f"after: job {dep['job']} {dep['condition']} "
                   + (f"(it is {dep['state']})" if dep.get("state") else "(you may not see it)"))
    _print_array(info.get("array"), info["id"])
    for task in info.get("tasks", []):
        typer.echo(f"  task {task['task_id']} index={task.get('index')} attempt={task.get('attempt')} "
                   f"state={task.get('state')} worker={_worker(task)} "
                   f"address={_dash(task.get('address'))} endpoint={_dash(task.get('endpoint'))} "
                   f"restarts={task.get('restarts') or 0} exit_code={_dash(task.get('exit_code'))}"
                   + (f" reason={task['reason']}" if task.get("reason") else ""))
        if task.get("restart_message"):
            typer.echo(f"    {task['restart_message']}")
    for pre in info.get("preemptions") or []:
        done = f"requeued {fmt_time(pre['done_at'])}" if pre.get("done_at") else "stopping"
        typer.echo(f"preempted: task {pre['task_id']} on worker {pre['worker_id']} at {fmt_time(pre['asked_at'])} "
                   + (f"for task {pre['for_task_id']} (job {pre['for_job_id']}, {pre['reason']}), "
                      if pre.get("for_job_id") is not None else f"for a job you may not see ({pre['reason']}), ")
                   + done)


def _priority_option(value: Optional[str]) -> int | str | None:
    """--priority: a number, or the name of one of the server's priority classes (it checks the name)."""
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return value


def _print_array(array: Optional[dict], job_id: int) -> None:
    """An array's line: its indices, cap and element counts by state; then its failed indices."""
    if not array:
        return
    counts = array.get("counts") or {}
    order = ("succeeded", "failed", "lost", "cancelled", "running", "assigned", "queued", "held")
    text = ", ".join(f"{counts[s]} {s}" for s in order if counts.get(s))
    cap = f" %{array['max_running']}" if array.get("max_running") else ""
    typer.echo(f"array {array.get('indices')}{cap}: {array.get('done', 0)}/{array.get('size')} done ({text})")
    ended = array.get("failed_indices") or []  # the first 1,000 not succeeded, by index
    cancelled = set(array.get("cancelled_indices") or [])
    failed = [i for i in ended if i not in cancelled]
    if failed:
        more = " ..." if len(failed) < counts.get("failed", 0) + counts.get("lost", 0) else ""
        typer.echo(f"failed indices: {array_text(failed)}{more}  (their logs: gpulayer job logs {job_id} --index N)")
    if cancelled:
        more = " ..." if len(cancelled) < counts.get("cancelled", 0) else ""
        typer.echo(f"cancelled indices: {array_text(sorted(cancelled))}{more}")


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
             index: IndexOpt = None, as_json: JsonOpt = False) -> None:
    """The job's output: task stdout on stdout, stderr and system lines on stderr.

    With --follow, exits with the job's exit code once it ends (with --index,
    once that element has ended, with its exit code).

    \b
    Examples:
      gpulayer job logs 12 | head
      gpulayer job logs -f 12
      gpulayer job logs 12 --index 7
    """
    job = client_of(ctx).get_job(job_id)
    if index is not None:
        job.element(index)  # no such element: a clear error before any line
    if follow:
        follow_logs(job, index, as_json)
    elif as_json:
        for line in job.logs(index=index):
            print_json(line, compact=True)
    else:
        prefixes = _task_prefixes(job.data) if index is None else {}
        for line in job.logs(index=index):
            print_log_line(line, _line_prefix(prefixes, line))
    if follow:
        if index is not None:  # that element's latest task's exit status
            task = (job.element(index).get("tasks") or [{}])[0]
            tell_ended({**task, "job_id": job.id}, index)
            raise typer.Exit(exit_code_of({"state": task.get("state"), "exit_code": task.get("exit_code")}))
        info = job.data if job.finished() else job.info()
        tell_ended(info)
        raise typer.Exit(exit_code_of(info))


StatesOpt = Annotated[Optional[list[str]], typer.Option("--state", metavar="STATE", callback=selection.check_states, help=f"Only jobs in this state (repeatable): {', '.join(JOB_STATES)}.")]
NameOpt = Annotated[Optional[str], typer.Option("--name", metavar="GLOB", help="Only jobs whose name matches this glob (`sweep-*`).")]
SinceOpt = Annotated[Optional[str], typer.Option("--since", metavar="WHEN", help="Only jobs created since: a duration back from now (2h, 3d) or a date (2026-12-01, 2026-12-01T08:00).")]
CANCEL_MAX = 100_000  # jobs one `job cancel --name/--state` may select


@job_app.command("cancel")
def job_cancel(ctx: typer.Context,
               job_ids: Annotated[Optional[list[int]], typer.Argument(help="Job ids.", metavar="JOB...", show_default=False)] = None,
               name: NameOpt = None, state: StatesOpt = None, since: SinceOpt = None,
               index: Annotated[Optional[int], typer.Option("--index", metavar="N", min=0, help="Cancel one element of an array (one JOB only).")] = None,
               user: Annotated[Optional[str], typer.Option("--user", help="Choose among that user's jobs (those you may cancel); default your own.")] = None,
               as_json: JsonOpt = False) -> None:
    """Cancel jobs: every task (every replica, every rank, every element of an array) is stopped.

    Give ids, or choose with --name/--state/--since/--user (unfinished jobs only).
    --index N cancels one element of an array; the others go on.

    \b
    Examples:
      gpulayer job cancel 12 13 14
      gpulayer job cancel --name 'sweep-*' --state queued
      gpulayer job cancel 12 --index 7
    """
    if index is not None:
        if len(job_ids or []) != 1 or name or state or since or user:
            raise typer.BadParameter("--index cancels one element of one array: give one JOB", param_hint="--index")
        raise typer.Exit(_cancel_element(client_of(ctx), job_ids[0], index, as_json))  # type: ignore[index]
    if job_ids and (name or state or since or user):
        raise typer.BadParameter("give job ids, or --name/--state/--since/--user, not both", param_hint="JOB")
    if not job_ids and not (name or state or since or user):
        raise typer.BadParameter("give the jobs to cancel: ids, or --name/--state/--since/--user", param_hint="JOB")
    since_ts = selection.parse_since(since)
    client = client_of(ctx)
    listed: dict[int, dict] = {}
    if not job_ids:
        states = [s for s in state or selection.UNFINISHED if s in selection.UNFINISHED]
        chosen = selection.select_jobs(client, states, name, since_ts, CANCEL_MAX,
                                       user=user) if states else []
        listed = {j["id"]: j for j in chosen}
        job_ids = list(listed)
        if not job_ids and not as_json:
            typer.echo("no unfinished job matches", err=True)
    answers, failed = [], 0
    for job_id in job_ids:
        try:
            answers.append(_cancel_one(client, job_id, quiet=as_json, known=listed.get(job_id)))
        except ApiError as exc:
            failed += 1
            typer.echo(f"Error: {exc.message} ({exc.code})", err=True)
    if as_json:
        print_json(answers)
    if failed:
        raise typer.Exit(1)


def _cancel_element(client, job_id: int, index: int, as_json: bool) -> int:
    """`job cancel JOB --index N`: one element of an array; says whether it had ended already."""
    job = client.get_job(job_id)
    before = job.element(index)["tasks"]
    answer = job.cancel(index=index)
    if as_json:
        print_json(answer)
    elif before and before[0].get("finished_at") is not None:
        typer.echo(f"job {job_id} element {index} already finished ({before[0]['state']})")
    else:
        typer.echo(f"job {job_id} element {index} cancelled")
    return 0


def _cancel_one(client, job_id: int, quiet: bool, known: Optional[dict] = None) -> dict:
    """Cancel one job unless it has finished; say which (unless quiet); the Job. `known`: the job as just
    listed (not read again: its cancel answers how it stands)."""
    job = Job(client, known) if known is not None else client.get_job(job_id)
    if job.finished():
        info = job.data
    else:
        info = job.cancel()
        if info["state"] == "cancelled":
            if not quiet:
                typer.echo(f"job {job_id} cancelled")
            return info
    if not quiet:
        typer.echo(f"job {job_id} already finished ({info['state']})")
    return info


@job_app.command("list")
def job_list(ctx: typer.Context, state: StatesOpt = None, name: NameOpt = None, since: SinceOpt = None,
             limit: Annotated[int, typer.Option("--limit", help="At most this many (max 1000).", min=1, max=1000)] = 100,
             watch: Annotated[bool, typer.Option("--watch", "-w", help="Redraw every 2 s until Ctrl-C, like `watch`.")] = False,
             all_: Annotated[bool, typer.Option("--all", help="Every job you may see (yours and your projects'), not only yours.")] = False,
             user: Annotated[Optional[str], typer.Option("--user", help="That user's jobs (those you may see).")] = None,
             project: Annotated[Optional[str], typer.Option("--project", help="That project's jobs (those you may see).")] = None,
             as_json: JsonOpt = False) -> None:
    """Jobs, newest first (your own unless --all, --user or --project): state, exit code, name, priority, worker, elapsed time, command.

    \b
    Examples:
      gpulayer job list --state running --state queued
      gpulayer job list --name 'sweep-*' --since 2h --watch
    """
    if watch and as_json:
        raise typer.BadParameter("--watch draws a table: leave out --json", param_hint="--watch")
    since_ts = selection.parse_since(since)  # a bad --since is bad input before anything is asked
    client = client_of(ctx)
    scope = {"all": all_, "user": user, "project": project}
    if not watch:
        _print_jobs(selection.select_jobs(client, state or [], name, since_ts, limit, **scope), as_json,
                    any(scope.values()))
        return
    try:
        while True:
            jobs = selection.select_jobs(client, state or [], name, since_ts, limit, **scope)
            if colour_on():
                typer.echo("\033[H\033[2J", nl=False)  # clear the screen, as `watch` does
            typer.echo(f"every {WATCH_S:g} s: gpulayer job list  {fmt_time(time.time())}\n")
            _print_jobs(jobs, False, any(scope.values()))
            time.sleep(WATCH_S)
    except KeyboardInterrupt:
        pass  # the way out of --watch, as out of `watch`


def _print_jobs(jobs: list[dict], as_json: bool, owners: bool = False) -> None:
    """The jobs as a table (`owners`: with USER and PROJECT after NAME, as `--all/--user/--project` list
    other people's), or JSON."""
    if as_json:
        print_json(jobs)
        return
    now = time.time()
    rows, headers = [selection.job_row(j, now) for j in jobs], selection.HEADERS
    if owners:
        rows = [[*r[:4], j.get("owner") or "-", j.get("project") or "-", *r[4:]] for r, j in zip(rows, jobs)]
        headers = [*headers[:4], "USER", "PROJECT", *headers[4:]]
    print_table(rows, headers, {1: selection.state_style})


@job_app.command("outputs")
def job_outputs(ctx: typer.Context, job_id: JobArg,
                dest: Annotated[Path, typer.Option("--dest", help="Directory to write the outputs into.")] = Path("."),
                index: IndexOpt = None, as_json: JsonOpt = False) -> None:
    """Download the job's outputs into --dest at their relative paths (--index N: one array element's).

    \b
    Example:
      gpulayer job outputs 12 --dest results/
    """
    job = client_of(ctx).get_job(job_id)
    written = job.download_outputs(dest, index=index)
    if as_json:
        print_json([str(p) for p in written])
        return
    for path in written:
        typer.echo(str(path))
    if not written:
        typer.echo(f"job {job_id} has no outputs", err=True)
    else:
        typer.echo(f"{plural(len(written), 'output file')} written under {dest}", err=True)


@job_app.command("events")
def job_events(ctx: typer.Context, job_id: JobArg, as_json: JsonOpt = False) -> None:
    """The job's events, oldest first.

    \b
    Example:
      gpulayer job events 12
    """
    events = client_of(ctx).get_job(job_id).events()
    if as_json:
        print_json(events)
        return
    for event in events:
        rest = {k: v for k, v in event.items() if k not in ("at", "kind", "id", "job_id")}
        typer.echo(f"{fmt_time(event.get('at'))}  {event.get('kind')}  {json.dumps(rest, sort_keys=True)}")
