"""`gpulayer service ...`: a running service's rolling updates (docs/services.md, "Rolling updates", "Canary")."""

from __future__ import annotations

import time
from typing import Annotated, Optional

import typer

from gpulayer.cli.common import client_of, fail, fmt_time, parse_pairs, print_json, print_table

service_app = typer.Typer(help="A running service's revisions: rolling updates, canaries, promote, rollback.",
                          no_args_is_help=True)

JobArg = Annotated[int, typer.Argument(help="The service's job id.", metavar="JOB", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]
WaitOpt = Annotated[Optional[float], typer.Option("--wait", metavar="SECONDS", min=0,
                                                  help="Wait up to SECONDS for the rollout to end; exit 1 when it rolled back.")]
#: The request's fields (which the server's refusals name: `canary: must be ...`) as this CLI's options.
FLAGS = {"image": "--image", "env": "--env", "command": "COMMAND", "max_surge": "--max-surge",
         "max_unavailable": "--max-unavailable", "canary": "--canary", "ready_timeout_s": "--ready-timeout",
         "drain_s": "--drain"}
ENDED = ("finished", "rolled_back", "ended")


@service_app.command("update")
def service_update(
    ctx: typer.Context, job_id: JobArg,
    command: Annotated[Optional[list[str]], typer.Argument(help="The new command, after `--`.", metavar="CMD",
                                                           show_default=False)] = None,
    image: Annotated[Optional[str], typer.Option("--image", metavar="IMAGE", help="The new image: an oci-archive tar or OCI layout dir here (uploaded), or a name a worker has cached.")] = None,
    env: Annotated[Optional[list[str]], typer.Option("--env", help="K=V set in the new revision's environment (repeatable).")] = None,
    unset_env: Annotated[Optional[list[str]], typer.Option("--unset-env", metavar="K", help="A name removed from it (repeatable).")] = None,
    max_surge: Annotated[int, typer.Option("--max-surge", min=0, help="Replicas over the service's count at once while rolling.")] = 1,
    max_unavailable: Annotated[int, typer.Option("--max-unavailable", min=0, help="Replicas under its count at once while rolling (below the count).")] = 0,
    canary: Annotated[Optional[int], typer.Option("--canary", metavar="PERCENT", help="Send PERCENT (1-99) of ingress requests to one new replica and wait for `service promote` (or `rollback`).")] = None,
    ready_timeout: Annotated[Optional[float], typer.Option("--ready-timeout", metavar="SECONDS", help="A new replica's time from its start to ready, else the update rolls back (default: its health check's failures x interval; 300 without one).")] = None,
    drain: Annotated[float, typer.Option("--drain", metavar="SECONDS", min=0, help="An old replica's time to finish its in-flight requests before it is stopped.")] = 30.0,
    wait: WaitOpt = None, as_json: JsonOpt = False,
) -> None:
    """Roll a running service to a new revision: its image, environment or command changed.

    One new replica is started beside the old ones (--max-surge), and once it is ready (its health check,
    else its port) one old replica leaves the ingress, finishes its requests and stops; and so on. A new
    replica that fails, restarts or is not ready in time rolls the update back: the old replicas serve on.

    \b
    Examples:
      gpulayer service update 12 --env MODEL_REV=7
      gpulayer service update 12 --image registry/serve:2 --canary 10
      gpulayer service update 12 -- python serve.py --port "$PORT" --fast
    """
    if canary is not None and not 1 <= canary <= 99:
        raise fail("--canary: a share of requests from 1 to 99 (percent)", 2)
    changes: dict = {}
    if image is not None:
        changes["image"] = image
    names = {**parse_pairs(env, "--env"), **{name: None for name in unset_env or []}}
    if names:
        changes["env"] = names
    if command:
        changes["command"] = list(command)
    if not changes:
        raise fail("give what the new revision changes: --image, --env, --unset-env or a command after `--`", 2)
    job = client_of(ctx).get_job(job_id)
    shown = _as_flags(lambda: job.update(**changes, max_surge=max_surge, max_unavailable=max_unavailable,
                                         canary=canary, ready_timeout_s=ready_timeout, drain_s=drain))
    revision = _latest(shown)
    if wait is not None:
        shown = _wait(job, revision, wait)
    if as_json:
        print_json(shown)
        return
    typer.echo(_said(job_id, shown, revision))
    update = next((u for u in shown["updates"] if u["revision"] == revision), None)
    if wait is not None and (update is None or update["state"] != "finished"):
        raise typer.Exit(1)


def _latest(shown: dict) -> int:
    """The revision an update, promote or rollback answered about: the rollout's, or (it ended in the same
    call: a rollback of a replica not yet placed, say) the newest update's."""
    return (shown["rollout"] or shown["updates"][0])["revision"]


def _as_flags(call):
    """`call()`; a refusal that names a field of the request names the option that set it instead."""
    from gpulayer.client.errors import ApiError
    try:
        return call()
    except ApiError as exc:
        field, colon, rest = exc.message.partition(": ")
        if colon and field.split(".")[0] in FLAGS:
            exc.message = f"{FLAGS[field.split('.')[0]]}: {rest}"
            exc.args = (exc.message,)
        raise


def _wait(job, revision: int, seconds: float) -> dict:
    deadline = time.monotonic() + seconds
    while True:
        shown = job.service()
        update = next((u for u in shown["updates"] if u["revision"] == revision), None)
        if update is None or update["state"] in ENDED:
            return shown
        if time.monotonic() >= deadline:
            raise fail(f"job {job.id}: revision {revision} still {update['state']} after {seconds:g} s "
                       "(`gpulayer service status` follows it)")
        time.sleep(0.5)


def _said(job_id: int, shown: dict, revision: int) -> str:
    update = next((u for u in shown["updates"] if u["revision"] == revision), None)
    if update is None:
        return f"job {job_id}: revision {revision}"
    state = update["state"]
    if state == "rolling" and update["canary"] is not None and update["promoted_at"] is None:
        return (f"job {job_id}: revision {revision} canary: {update['canary']}% of ingress requests once its replica "
                f"is ready; `gpulayer service promote {job_id}` or `rollback {job_id}`")
    if state == "rolled_back":
        return f"job {job_id}: revision {revision} rolled back ({update['reason']}); serving revision {shown['revision']}"
    if state == "rolling_back":
        return f"job {job_id}: revision {revision} rolling back ({update['reason']})"
    return f"job {job_id}: revision {revision} {state} (from revision {update['from_revision']})"


@service_app.command("promote")
def service_promote(ctx: typer.Context, job_id: JobArg, as_json: JsonOpt = False) -> None:
    """A canary's rollout goes on to every replica.

    \b
    Example:
      gpulayer service promote 12
    """
    shown = client_of(ctx).get_job(job_id).promote()
    if as_json:
        print_json(shown)
    else:
        typer.echo(f"job {job_id}: revision {_latest(shown)} promoted: rolling out to every replica")


@service_app.command("rollback")
def service_rollback(ctx: typer.Context, job_id: JobArg, wait: WaitOpt = None, as_json: JsonOpt = False) -> None:
    """Turn the rollout under way around: every replica runs the revision served before it again.

    \b
    Example:
      gpulayer service rollback 12
    """
    job = client_of(ctx).get_job(job_id)
    shown = job.rollback()
    revision = _latest(shown)
    if wait is not None:
        shown = _wait(job, revision, wait)
    if as_json:
        print_json(shown)
    else:
        typer.echo(_said(job_id, shown, revision))


@service_app.command("status")
def service_status(ctx: typer.Context, job_id: JobArg, as_json: JsonOpt = False) -> None:
    """A service's revisions: the one it serves, its replicas by revision, its updates newest first.

    \b
    Example:
      gpulayer service status 12
    """
    shown = client_of(ctx).get_job(job_id).service()
    if as_json:
        print_json(shown)
        return
    typer.echo(f"job {job_id}: serving revision {shown['revision']}")
    for r in shown["replicas"]:
        typer.echo(f"  revision {r['revision']}: {r['replicas']} replica(s), {r['ready']} ready, {r['draining']} draining")
    if shown["updates"]:
        print_table([[u["revision"], u["from_revision"], u["state"], ",".join(sorted(u["changes"])),
                      f"{u['canary']}%" if u["canary"] else None, fmt_time(u["created_at"]),
                      fmt_time(u["finished_at"]), u["reason"]]
                     for u in shown["updates"]],
                    ["REVISION", "FROM", "STATE", "CHANGES", "CANARY", "STARTED", "ENDED", "REASON"])
