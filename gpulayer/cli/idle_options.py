"""The idle policy's options (docs/workers.md "Idle GPUs"), one set for `submit`, `project add/set` and the fleet
default of `server start` / `up`: `--idle-timeout 30m --idle-below 5% --idle-action notify|requeue|cancel`."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from gpulayer.cli.common import parse_duration
from gpulayer.client.specs import percent
from gpulayer.protocol.jobspec import IDLE_ACTIONS

_ACTIONS = "|".join(IDLE_ACTIONS)
IdleTimeoutOpt = Annotated[Optional[str], typer.Option(
    "--idle-timeout", metavar="DURATION",
    help="Idle policy: act on a task whose every GPU stays under --idle-below for this long (30m, 2h; at least "
         "one heartbeat interval, a GPU sample).")]
IdleBelowOpt = Annotated[Optional[str], typer.Option(
    "--idle-below", metavar="PCT", help="Idle policy: GPU utilisation under this is idle (5 or 5%; 0-100, default 5).")]
IdleActionOpt = Annotated[Optional[str], typer.Option(
    "--idle-action", metavar=_ACTIONS,
    help="Idle policy: notify (an event, the job's notifications), requeue (stopped as for a preemption, back to "
         "the queue, same attempt) or cancel (default notify).")]
IdleWarningOpt = Annotated[str, typer.Option(
    "--idle-warning", metavar="DURATION",
    help="Idle tasks with a shell or SSH session open are warned first and acted on after this long (default 10m).")]
IdleCheckOpt = Annotated[str, typer.Option(
    "--idle-check-interval", metavar="DURATION", help="How often upkeep looks for idle tasks (default 10s).")]


def idle_policy(timeout: Optional[str], below: Optional[str], action: Optional[str]) -> dict:
    """The JobSpec / project fields the options give (those not given left out); a usage error for a bad one."""
    found: dict = {}
    if timeout is not None:
        found["idle_timeout_seconds"] = parse_duration(timeout, "--idle-timeout", positive=True)
    if below is not None:
        try:
            found["idle_below_pct"] = percent(below)
        except ValueError as exc:
            raise typer.BadParameter(str(exc).replace("idle_below_pct", "--idle-below"), param_hint="--idle-below") from None
    if action is not None:
        if action not in IDLE_ACTIONS:
            raise typer.BadParameter(f"{action!r} is none of {', '.join(IDLE_ACTIONS)}", param_hint="--idle-action")
        found["idle_action"] = action
    return found


def fleet_settings(timeout: Optional[str], below: Optional[str], action: Optional[str], warning: str,
                   check_interval: str, heartbeat_interval_s: float) -> dict:
    """The ControlPlaneConfig fields of the fleet's default idle policy (`server start`, `up`)."""
    policy = idle_policy(timeout, below, action)
    timeout_s = policy.get("idle_timeout_seconds")
    if timeout_s is not None and timeout_s < heartbeat_interval_s:
        raise typer.BadParameter(f"{timeout_s:g} seconds is under one GPU sample interval (the heartbeat interval, "
                                 f"{heartbeat_interval_s:g} s)", param_hint="--idle-timeout")
    return dict(idle_timeout_s=timeout_s, idle_below_pct=policy.get("idle_below_pct", 5.0),
                idle_action=policy.get("idle_action", "notify"),
                idle_warning_s=parse_duration(warning, "--idle-warning", positive=True),
                idle_check_interval_s=parse_duration(check_interval, "--idle-check-interval", positive=True))
