"""`gpulayer usage`: the usage ledger summed, like Slurm's sreport (Client.usage)."""
from __future__ import annotations

from typing import Annotated

import typer

from gpulayer.cli.common import client_of, fmt_time, parse_duration, print_json, print_table


def usage(
    ctx: typer.Context,
    by: Annotated[str, typer.Option("--by", help="Sum per user, project, job-name or label:KEY.")] = "user",
    since: Annotated[str, typer.Option("--since", metavar="DURATION", help="Runs that ended within this long: 30d, 12h, 90m, seconds, or Slurm's 1:00:00, 2-00:00:00.")] = "30d",
    as_json: Annotated[bool, typer.Option("--json", help="Print the answer as JSON.")] = False,
) -> None:
    """GPU-hours, CPU-hours, runs and jobs from the usage ledger, as Slurm's sreport.

    An admin sees everyone's; a user their own and those of the projects they manage.

    \b
    Examples:
      gpulayer usage
      gpulayer usage --by project --since 7d
      gpulayer usage --by label:team --json
    """
    parse_duration(since, "--since")  # a bad one is refused here, naming the option, as every duration is
    answer = client_of(ctx).usage(by=by, since=since)
    if as_json:
        print_json(answer)
        return
    typer.echo(f"usage by {answer['by']}, runs ended {fmt_time(answer['since'])} .. {fmt_time(answer['until'])}")
    print_table([[r["key"] if r["key"] is not None else "-", f"{r['gpu_hours']:.2f}", f"{r['cpu_hours']:.2f}",
                  r["jobs"], r["runs"], r["preempted"]] for r in answer["rows"]],
                [answer["by"].upper(), "GPU-HOURS", "CPU-HOURS", "JOBS", "RUNS", "PREEMPTED"])
