"""`gpulayer job ...`: status, logs, cancel, list, outputs and events of submitted jobs (`submit` is in submit.py)."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from gpulayer.cli import selection
from gpulayer.cli.common import (
    client_of, colour_on, exit_code_of, fmt_clock, fmt_time, parse_duration, print_json, print_log_line, print_table,
    stdout_closed,
)
from gpulayer.cli.following import follow_logs, line_prefix, task_prefixes, tell_ended, waiting_line
from gpulayer.client.errors import ApiError, WaitTimeout
from gpulayer.protocol import JOB_STATES, array_text, parse_time_limit, plural
from gpulayer.client.jobs import Job

job_app = typer.Typer(help="Inspect and control submitted jobs.", no_args_is_help=True)

WATCH_S = 2.0  # `job list --watch` redraws this often

JobArg = Annotated[int, typer.Argument(help="The job id.", metavar="JOB", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]
IndexOpt = Annotated[Optional[int], typer.Option("--index", metavar="N", min=0, help="One element of an array (or one replica or rank): its index.")]


@job_app.command("status")
def job_status(ctx: typer.Context, job_id: JobArg, index: IndexOpt = None, as_json: JsonOpt = False) -> None:
    """The job's state, times, what it waits for, and each task's worker, address, endpoint and GPUs.

    Its elapsed and CPU time as sacct's (`elapsed=`, `cpu_time=`); a running
    task's GPUs with their newest utilization and memory, as Slurm's sstat.

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
    usage = _gpu_usage(job, index, info)
    if as_json:
        print_json({**info, "gpu_usage": list(usage.values())} if usage else info)
        return
    typer.echo(f"job {info['id']} {info.get('name') or ''}".rstrip())
    typer.echo(f"state={info['state']} exit_code={_dash(info.get('exit_code'))} "
               f"created={fmt_time(info.get('created_at'))} finished={fmt_time(info.get('finished_at'))}"
               + (f" reason={info['reason']}" if info.get("reason") else "")
               + (f" owner={info['owner']} project={info.get('project') or '-'}" if info.get("owner") else ""))
    _print_times(info)
    wiring = info.get("spec") or {}  # how its GPUs and ranks must be wired (docs/workers.md, "Topology")
    if wiring.get("gpu_link") or wiring.get("same"):
        typer.echo(" ".join([f"gpu_link={wiring['gpu_link']}"] * bool(wiring.get("gpu_link"))
                            + [f"same={','.join(wiring['same'])}"] * bool(wiring.get("same"))))
    if info.get("waiting_reason"):
        typer.echo(waiting_line(info["waiting_reason"]))
    if info.get("reservation"):  # EASY backfill: where and from when its room is held (docs/scheduling-time.md)
        held = info["reservation"]
        typer.echo(f"reserved: {', '.join(held['workers'])} from {fmt_clock(held['start_at'])}")
    start = selection.start_line(info, time.time())
    if start:  # a waiting job's forecast start (docs/scheduling-time.md), or why it has none
        typer.echo(start)
    if info.get("ingress_url"):  # a service's URL on the control plane (docs/access.md, "Ingress")
        typer.echo(f"ingress_url={info['ingress_url']}")
    for line in selection.scaling_lines(info.get("scaling")):  # an autoscaled service's replicas over time
        typer.echo(line)
    if info.get("kind") == "service" and (info.get("revision") or 1) > 1:  # after a rolling update
        typer.echo(f"revision={info['revision']}")
    for dep in info.get("after") or []:
        typer.echo(f"after: job {dep['job']} {dep['condition']} "
                   + (f"(it is {dep['state']})" if dep.get("state") else "(you may not see it)"))
    _print_array(info.get("array"), info["id"])
    for task in info.get("tasks", []):
        typer.echo(f"  task {task['task_id']} index={task.get('index')} attempt={task.get('attempt')} "
                   f"state={task.get('state')} worker={_worker(task)} "
                   f"address={_dash(task.get('address'))} endpoint={_dash(task.get('endpoint'))} "
                   f"restarts={task.get('restarts') or 0} exit_code={_dash(task.get('exit_code'))}"
                   + (f" gpu={','.join(map(str, task['gpus']))} share={task['gpu_share']:g}"
                      if task.get("gpu_share") and task.get("gpus") else "")
                   + (f" reason={task['reason']}" if task.get("reason") else "")
                   + (f" revision={task['revision']}" if info.get("kind") == "service" and task.get("revision") else ""))
        if task.get("restart_message"):
            typer.echo(f"    {task['restart_message']}")
        for gpu in (usage.get(task["task_id"]) or {}).get("gpus") or []:
            typer.echo(f"    {_gpu_line(gpu)}")
    for pre in info.get("preemptions") or []:
        done = f"requeued {fmt_time(pre['done_at'])}" if pre.get("done_at") else "stopping"
        typer.echo(f"preempted: task {pre['task_id']} on worker {pre['worker_id']} at {fmt_time(pre['asked_at'])} "
                   + (f"for task {pre['for_task_id']} (job {pre['for_job_id']}, {pre['reason']}), "
                      if pre.get("for_job_id") is not None else f"for a job you may not see ({pre['reason']}), ")
                   + done)


def _print_times(info: dict) -> None:
    """`elapsed=0:12:03 cpu_time=0:48:12 gpu_time=...` (sacct's Elapsed and CPUTime), once the job started."""
    now = time.time()
    times = {"elapsed": selection.elapsed(info, now), "cpu_time": selection.held_time(info, now, "cpus"),
             "gpu_time": selection.held_time(info, now, "gpus") if (info.get("spec") or {}).get("gpus") else None}
    if times["elapsed"]:
        typer.echo(" ".join(f"{k}={v}" for k, v in times.items() if v))


def _gpu_usage(job: Job, index: Optional[int], info: dict) -> dict[int, dict]:
    """The running tasks' GPU use by task id (Slurm's sstat); none when no task runs, when the caller may
    see the job but not read it (403), or from a server older than the route (404)."""
    if not any(t.get("state") == "running" for t in info.get("tasks") or []):
        return {}
    try:
        return {t["task_id"]: t for t in job.gpu_usage(index)}
    except ApiError as exc:
        if exc.status in (403, 404):
            return {}
        raise


def _gpu_line(gpu: dict) -> str:
    """`gpu 0 GPU-...: 87% busy, 30512/81559 MiB (3 s ago)`: one GPU of a running task, its newest sample."""
    name = f"gpu {gpu['index']}" + (f" {gpu['uuid']}" if gpu.get("uuid") else "")
    if gpu.get("at") is None:
        return f"{name}: no sample yet"
    busy = "-" if gpu.get("utilization_pct") is None else f"{gpu['utilization_pct']:g}%"
    used, total = gpu.get("memory_used_mb"), gpu.get("memory_total_mb")
    memory = "-" if used is None else f"{used}/{_dash(total)} MiB"
    return f"{name}: {busy} busy, {memory} ({gpu.get('age_s') or 0:.0f} s ago)"


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
        prefixes = task_prefixes(job.data) if index is None else {}
        for line in job.logs(index=index):
            print_log_line(line, line_prefix(prefixes, line))
    if follow:
        if stdout_closed():  # `| head` went: nothing more to say, on stderr neither
            raise BrokenPipeError("stdout was closed")
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
            info, cancelled = _cancel_one(client, job_id, quiet=as_json, known=listed.get(job_id))
        except ApiError as exc:
            failed += 1
            typer.echo(error_line(job_id, exc), err=True)
            continue
        answers.append(info)
        if not cancelled and job_id not in listed:  # named, and it had ended: an error, as scancel makes it
            failed += 1
    if as_json:
        print_json(answers)
    if failed:
        raise typer.Exit(1)


def _cancel_element(client, job_id: int, index: int, as_json: bool) -> int:
    """`job cancel JOB --index N`: one element of an array; says whether it had ended already."""
    job = client.get_job(job_id)
    before = job.element(index)["tasks"]
    answer = job.cancel(index=index)
    ended = bool(before) and before[0].get("finished_at") is not None
    if as_json:
        print_json(answer)
    elif ended:
        typer.echo(f"Error: job {job_id} element {index} has already ended ({before[0]['state']}): "
                   "nothing to cancel", err=True)
    else:
        typer.echo(f"job {job_id} element {index} cancelled")
    return 1 if ended else 0


def _cancel_one(client, job_id: int, quiet: bool, known: Optional[dict] = None) -> tuple[dict, bool]:
    """Cancel one job unless it has finished; say which (unless quiet); the job, and whether this cancelled it.
    `known`: the job as just listed (not read again: its cancel answers how it stands). A job that had ended
    is said as an error when it was named (`job cancel 12`), as a note when a --name/--state choice found it
    running."""
    job = Job(client, known) if known is not None else client.get_job(job_id)
    if job.finished():
        info = job.data
    else:
        info = job.cancel()
        if info["state"] == "cancelled":
            if not quiet:
                typer.echo(f"job {job_id} cancelled")
            return info, True
    if not quiet and known is None:
        typer.echo(f"Error: job {job_id} has already ended ({info['state']}): nothing to cancel", err=True)
    elif not quiet:
        typer.echo(f"job {job_id} ended meanwhile ({info['state']})", err=True)
    return info, False


JobsArg = Annotated[list[int], typer.Argument(help="Job ids.", metavar="JOB...", show_default=False)]


@job_app.command("hold")
def job_hold(ctx: typer.Context, job_ids: JobsArg, as_json: JsonOpt = False) -> None:
    """Keep jobs from starting until released (Slurm's `scontrol hold`): they wait with the reason `held`.

    An array with elements running keeps them, and holds the rest.

    \b
    Example:
      gpulayer job hold 12 13
    """
    _each(ctx, job_ids, as_json, lambda job: job.hold(), "held")


@job_app.command("release")
def job_release(ctx: typer.Context, job_ids: JobsArg, as_json: JsonOpt = False) -> None:
    """Let held jobs run (Slurm's `scontrol release`), once nothing else keeps them (--after, --begin).

    \b
    Example:
      gpulayer job release 12 13
    """
    _each(ctx, job_ids, as_json, lambda job: job.release(), "released")


@job_app.command("requeue")
def job_requeue(ctx: typer.Context, job_ids: JobsArg, index: Annotated[Optional[int], typer.Option(
                    "--index", metavar="N", min=0, help="One element of an array (one JOB only).")] = None,
                hold: Annotated[bool, typer.Option("--hold", help="Held once queued (Slurm's requeuehold).")] = False,
                as_json: JsonOpt = False) -> None:
    """Run jobs again, each as a new attempt not counted against its retries (Slurm's `scontrol requeue`).

    A running job is sent its stop signal (SIGTERM, or its --signal's), given its grace, then queued
    again; one that ended runs again. An array: all its elements, or --index N.

    \b
    Examples:
      gpulayer job requeue 12
      gpulayer job requeue 12 --index 7 --hold
    """
    if index is not None and len(job_ids) != 1:
        raise typer.BadParameter("--index requeues one element of one array: give one JOB", param_hint="--index")
    _each(ctx, job_ids, as_json, lambda job: job.requeue(index=index, hold=hold), "requeued")


@job_app.command("update")
def job_update(ctx: typer.Context, job_id: JobArg,
               priority: Annotated[Optional[str], typer.Option("--priority", help="A number, or a class of the server (low, normal, high); above the project's ceiling only for admins.")] = None,
               time_limit: Annotated[Optional[str], typer.Option("--time", "--timeout", metavar="TIME", help="The time limit, as submit --time takes it; a running attempt's deadline becomes its start plus this (past already: it ends now, as at its time limit); 'none' for no limit.")] = None,
               name: Annotated[Optional[str], typer.Option("--name", help="A new name.")] = None,
               as_json: JsonOpt = False) -> None:
    """Change a job not ended (Slurm's `scontrol update`): its priority, time limit or name.

    A new time limit applies to the running attempt too (its worker hears it within a heartbeat): a limit
    already passed stops it as its time limit does (the --signal warning, SIGTERM, the grace, SIGKILL).

    \b
    Examples:
      gpulayer job update 12 --priority low
      gpulayer job update 12 --time 2:00:00 --name long-run
    """
    changes: dict = {}
    if priority is not None:
        changes["priority"] = int(priority) if priority.lstrip("-").isdigit() else priority
    if time_limit is not None:
        changes["timeout_seconds"] = None if time_limit == "none" else _time_option(time_limit)
    if name is not None:
        changes["name"] = name
    if not changes:
        raise typer.BadParameter("give what to change: --priority, --time or --name", param_hint="--priority")
    info = client_of(ctx).get_job(job_id).update(**changes)
    if as_json:
        print_json(info)
    else:
        typer.echo(f"job {job_id} updated: " + ", ".join(f"{k}={v}" for k, v in changes.items()))


def _time_option(text: str) -> float:
    try:
        seconds = parse_time_limit(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--time") from None
    if seconds <= 0:
        raise typer.BadParameter(f"{text!r}: must be more than 0 seconds", param_hint="--time")
    return seconds


@job_app.command("wait")
def job_wait(ctx: typer.Context, job_ids: JobsArg,
             timeout: Annotated[Optional[str], typer.Option("--timeout", metavar="DURATION", help="Give up after this long (exit 124).")] = None,
             as_json: JsonOpt = False) -> None:
    """Block until every job ended; exit with the job's exit code, or with the first failure's.

    \b
    Examples:
      gpulayer job wait 12
      gpulayer job wait 12 13 14 --timeout 2h
    """
    limit = parse_duration(timeout, "--timeout")
    deadline = None if limit is None else time.monotonic() + limit
    client = client_of(ctx)
    jobs = [client.get_job(job_id) for job_id in job_ids]  # 404 for one that does not exist, before waiting
    ended: list[dict] = []
    for job in jobs:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            job.wait(timeout=left)
        except WaitTimeout:
            typer.echo(f"Error: job {job.id} is still {job.data['state']} after --timeout {timeout}", err=True)
            raise typer.Exit(124) from None
        ended.append(job.data)
    if as_json:
        print_json(ended)
    else:
        for info in ended:
            typer.echo(f"job {info['id']} {info['state']} exit_code={_dash(info.get('exit_code'))}")
    failed = next((info for info in ended if info["state"] != "succeeded"), None)
    raise typer.Exit(exit_code_of(failed) if failed else 0)


def error_line(job_id: int, exc: ApiError) -> str:
    """`Error: job 12 ...`: the server's message, naming the job once (its own words do, most often)."""
    said = exc.message if exc.message.startswith(f"job {job_id} ") else f"job {job_id}: {exc.message}"
    return f"Error: {said} ({exc.code})"


def _each(ctx: typer.Context, job_ids: list[int], as_json: bool, act, done: str) -> None:
    """Apply `act` to each job in turn; an error is said and the rest go on (exit 1 after)."""
    client, answers, failed = client_of(ctx), [], 0
    for job_id in job_ids:
        try:
            answers.append(act(client.get_job(job_id)))
        except ApiError as exc:
            failed += 1
            typer.echo(error_line(job_id, exc), err=True)
            continue
        if not as_json:
            reason = answers[-1].get("waiting_reason")
            typer.echo(f"job {job_id} {done}: {answers[-1]['state']}" + (f" ({reason})" if reason else ""))
    if as_json:
        print_json(answers)
    if failed:
        raise typer.Exit(1)


@job_app.command("list")
def job_list(ctx: typer.Context, state: StatesOpt = None, name: NameOpt = None, since: SinceOpt = None,
             limit: Annotated[int, typer.Option("--limit", help="At most this many (max 1000).", min=1, max=1000)] = 100,
             watch: Annotated[bool, typer.Option("--watch", "-w", help="Redraw every 2 s until Ctrl-C, like `watch`.")] = False,
             all_: Annotated[bool, typer.Option("--all", help="Every job you may see (yours and your projects'), not only yours.")] = False,
             user: Annotated[Optional[str], typer.Option("--user", help="That user's jobs (those you may see).")] = None,
             project: Annotated[Optional[str], typer.Option("--project", help="That project's jobs (those you may see).")] = None,
             columns: Annotated[Optional[str], typer.Option("--format", "-o", metavar="COLUMNS", help=f"These columns, in this order, as squeue -o: a comma-separated list of {', '.join(selection.COLUMNS)}.")] = None,
             no_header: Annotated[bool, typer.Option("--no-header", "--noheader", help="No header line (squeue's --noheader).")] = False,
             start: Annotated[bool, typer.Option("--start", help="Waiting jobs (queued and waiting, unless --state) with their expected start (a START column), as squeue --start.")] = False,
             as_json: JsonOpt = False) -> None:
    """Jobs, newest first (your own unless --all, --user or --project): state, exit code, name, priority, worker, elapsed time, command.

    --format picks the columns (cputime and gputime: each task's run times
    the CPUs or GPUs it holds, as sacct's CPUTime).

    \b
    Examples:
      gpulayer job list --state running --state queued
      gpulayer job list --name 'sweep-*' --since 2h --watch
      gpulayer job list --format id,state,name,elapsed,cputime --no-header
      gpulayer job list --start
    """
    if watch and as_json:
        raise typer.BadParameter("--watch draws a table: leave out --json", param_hint="--watch")
    if as_json and (columns or no_header):
        raise typer.BadParameter("--json prints every field: leave out --format and --no-header", param_hint="--json")
    since_ts = selection.parse_since(since)  # a bad --since is bad input before anything is asked
    scope = {"all": all_, "user": user, "project": project}
    chosen = selection.parse_columns(columns) or (selection.START_COLUMNS if start else selection.OWNER_COLUMNS
                                                  if any(scope.values()) else selection.DEFAULT_COLUMNS)
    if start and not state:
        state = selection.WAITING_STATES
    client = client_of(ctx)

    def select() -> list[dict]:  # with --start, soonest start first (those with none last), as squeue --start
        found = selection.select_jobs(client, state or [], name, since_ts, limit, **scope)
        return sorted(found, key=selection.start_order) if start else found
    if not watch:
        _print_jobs(select(), as_json, chosen, not no_header)
        return
    try:
        while True:
            jobs = select()
            if colour_on():
                typer.echo("\033[H\033[2J", nl=False)  # clear the screen, as `watch` does
            typer.echo(f"every {WATCH_S:g} s: gpulayer job list  {fmt_time(time.time())}\n")
            _print_jobs(jobs, False, chosen, not no_header)
            time.sleep(WATCH_S)
    except KeyboardInterrupt:
        pass  # the way out of --watch, as out of `watch`


def _print_jobs(jobs: list[dict], as_json: bool, columns: list[str], header: bool = True) -> None:
    """The jobs as a table of `columns` (selection.COLUMNS' names; `header`: with the headers' line), or JSON."""
    if as_json:
        print_json(jobs)
        return
    rows, headers = selection.table_of(jobs, columns, time.time())
    print_table(rows, headers, {i: selection.state_style for i, c in enumerate(columns) if c == "state"}, header)


@job_app.command("outputs")
def job_outputs(ctx: typer.Context, job_id: JobArg,
                dest: Annotated[Path, typer.Option("--dest", help="Directory to write the outputs into.")] = Path("."),
                index: IndexOpt = None, as_json: JsonOpt = False,
                checkpoint: Annotated[bool, typer.Option(
                    "--checkpoint", help="The newest checkpoint instead (docs/training.md).")] = False,
                attempt: Annotated[Optional[int], typer.Option(
                    "--attempt", metavar="N", min=1,
                    help="With --checkpoint: the newest checkpoint of attempt N.")] = None) -> None:
    """Download the job's outputs into --dest at their relative paths (--index N: one array element's).

    \b
    Examples:
      gpulayer job outputs 12 --dest results/
      gpulayer job outputs 12 --checkpoint --attempt 2 --dest ckpt/
    """
    job = client_of(ctx).get_job(job_id)
    if attempt is not None and not checkpoint:
        raise typer.BadParameter("--attempt goes with --checkpoint", param_hint="--attempt")
    if checkpoint:
        written = job.download_checkpoint(dest, attempt=attempt, index=index)
    else:
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


@job_app.command("checkpoints")
def job_checkpoints(ctx: typer.Context, job_id: JobArg, index: IndexOpt = None, as_json: JsonOpt = False) -> None:
    """The job's checkpoints, oldest first: index, attempt, time, files and bytes (docs/training.md).

    \b
    Example:
      gpulayer job checkpoints 12 --index 3
    """
    found = client_of(ctx).get_job(job_id).checkpoints(index)
    if as_json:
        print_json(found)
        return
    if not found:
        typer.echo(f"job {job_id} has no checkpoints", err=True)
        return
    rows = [[c["id"], c["index"], c["attempt"], c["kind"],
             time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(c["created_at"])), c["files"], c["bytes"]]
            for c in found]
    print_table(rows, ["ID", "INDEX", "ATTEMPT", "KIND", "TIME", "FILES", "BYTES"])


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
