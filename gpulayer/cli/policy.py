"""`gpulayer policy replay`: a policy change replayed on the recorded jobs of a window, offline (docs/cli.md).

Like `gpulayer sql` it reads the control plane's state file, opened read-only, and changes nothing: the
replay runs on in-memory copies (gpulayer/server/scheduler/policy_replay.py; apsw is the server extra's,
imported when the command runs).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from gpulayer.cli.common import fail, home_of, parse_duration, print_json, print_table
from gpulayer.cli.sql import STATE_FILE

policy_app = typer.Typer(help="What-if on history: replay a scheduling policy change (offline, read-only).",
                         no_args_is_help=True)

RUNS = ("actual", "baseline", "changed")


@policy_app.command("replay")
def replay(ctx: typer.Context,
           since: Annotated[str, typer.Option("--since", help="The window: jobs submitted this long ago until now (7d, 12h, 90m).")] = "7d",
           setting: Annotated[Optional[list[str]], typer.Option("--set", help="KEY=VALUE: a changed setting; repeatable. quota.PROJECT=GPUS|none, weight.PROJECT=W, backfill=on|off, backfill_depth=N, priority_class.NAME=N, fairshare_half_life=DURATION.")] = None,
           home: Annotated[Optional[Path], typer.Option("--home", envvar="GPULAYER_HOME", show_envvar=True, help="The control plane's home directory (default ~/.gpulayer).")] = None,
           state: Annotated[Optional[Path], typer.Option("--state", help="State file to read (default: HOME/state.db).")] = None,
           as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False) -> None:
    """Re-run the window's recorded jobs through the placement rules, as they are and with --set changes.

    \b
    Examples:
      gpulayer policy replay --since 7d --set backfill=off
      gpulayer policy replay --since 2d --set quota.vision=16 --set weight.nlp=2 --json
    """
    from gpulayer.server.scheduler import policy_replay as pr
    from gpulayer.server.store.db import connect

    window = parse_duration(since, "--since", positive=True)
    path = state or home_of(ctx, home) / STATE_FILE
    if not path.exists():
        raise fail(f"no state file at {path} (run `gpulayer server init` or `gpulayer up` first, or pass --state)", 2)
    conn = connect(path, readonly=True)
    try:
        projects = pr.project_names(conn)
        changes = [pr.parse_change(text, projects, lambda v: parse_duration(v, "--set", positive=True))
                   for text in setting or []]
        until = time.time()
        report = pr.policy_replay(conn, until - (window or 0), until, changes)
    except (pr.ReplayError, typer.BadParameter) as e:
        raise fail(str(e.message if isinstance(e, typer.BadParameter) else e), 2) from None
    finally:
        conn.close()
    if as_json:
        print_json(report)
    else:
        _print(report)


def _seconds(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}s" if abs(value) < 120 else f"{value / 60:.1f}m" if abs(value) < 7200 else f"{value / 3600:.1f}h"


def _print(report: dict) -> None:
    w, runs = report["window"], report["runs"]
    typer.echo(f"window: {w['jobs']} jobs, {w['workers']} workers, {w['gpus']} GPUs; "
               f"changed: {', '.join(report['settings']) or 'nothing (baseline only)'}")
    projects = sorted({p for r in runs.values() for p in r["gpu_hours"]})
    table = [["mean wait", *(_seconds(runs[k]["mean_wait_s"]) for k in RUNS)],
             ["worst wait", *(_seconds(runs[k]["worst_wait_s"]) for k in RUNS)],
             ["not started", *(str(runs[k]["not_started"]) for k in RUNS)],
             ["GPU utilisation", *(_share(runs[k]["gpu_utilisation"]) for k in RUNS)]]
    table += [[f"GPU-hours {p}", *(f"{runs[k]['gpu_hours'].get(p, 0):.2f}" for k in RUNS)] for p in projects]
    print_table(table, ["", *RUNS])
    if report["changed_most"]:
        typer.echo("\nwaits changed most (baseline -> changed):")
        print_table([[j["job"], j["name"], j["project"], j["gpus"], _seconds(j["actual_wait_s"]),
                      _seconds(j["baseline_wait_s"]), _seconds(j["changed_wait_s"]), _seconds(j["delta_s"])]
                     for j in report["changed_most"]],
                    ["JOB", "NAME", "PROJECT", "GPUS", "ACTUAL", "BASELINE", "CHANGED", "DELTA"])


def _share(value: Optional[float]) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"
