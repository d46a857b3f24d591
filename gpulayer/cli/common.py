"""What every CLI module shares: global options, parsing helpers, output helpers."""
from __future__ import annotations

import json
import os
import select
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from gpulayer.client.api import Client, connect
from gpulayer.client.settings import server_configured
from gpulayer.protocol import default_home
from gpulayer.protocol import parse_duration as duration_seconds

@dataclass
class GlobalOptions:
    """The options given before the command: where the control plane is and how to trust it."""

    url: Optional[str] = None
    token: Optional[str] = None
    ca_file: Optional[str] = None
    home: Optional[Path] = None


def global_options(ctx: typer.Context) -> GlobalOptions:
    """The GlobalOptions the top-level callback stored (defaults when run without it)."""
    root = ctx.find_root()
    if not isinstance(root.obj, GlobalOptions):
        root.obj = GlobalOptions()
    return root.obj


def home_of(ctx: typer.Context, home: Optional[Path] = None) -> Path:
    """The command's --home, else the global one, else $GPULAYER_HOME or ~/.gpulayer."""
    chosen = home or global_options(ctx).home
    return Path(chosen).expanduser() if chosen else default_home()


def client_of(ctx: typer.Context) -> Client:
    """A Client for the configured control plane, else for this home's local jobs (ClientError when neither)."""
    opts = global_options(ctx)
    if (opts.token or "").startswith("glj_"):
        raise fail("--token (GPULAYER_TOKEN) holds a join token (glj_...), which only workers use "
                   "(`gpulayer join URL`, GPULAYER_JOIN_TOKEN): give a client token (glc_...)", 2)
    if not server_configured(opts.url, opts.home):
        from gpulayer.cli.local import history_client
        local = history_client(home_of(ctx), ctx.call_on_close)
        if local is not None:
            return local
    return connect(opts.url, opts.token, opts.ca_file, opts.home)


def parse_pairs(values: Optional[list[str]], option: str) -> dict[str, str]:
    """['k=v', ...] → {k: v}; a malformed entry is a usage error naming the option."""
    pairs: dict[str, str] = {}
    for value in values or []:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"expected KEY=VALUE, got {value!r}", param_hint=option)
        pairs[key] = val
    return pairs


def parse_duration(text: Optional[str], option: str, positive: bool = False) -> Optional[float]:
    """A duration option in seconds (gpulayer.protocol.parse_duration: '90', '30m', '12h', '1:00:00',
    '2-00:00:00'); None stays None. A usage error naming the option and the forms otherwise, and for 0
    when `positive`."""
    if text is None:
        return None
    try:
        seconds = duration_seconds(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from None
    if positive and seconds <= 0:
        raise typer.BadParameter(f"{text!r}: must be more than 0 seconds", param_hint=option)
    return seconds


def duration_option(option: str, positive: bool = False):
    """A typer callback that turns the text of a duration option into seconds (parse_duration)."""
    return lambda value: parse_duration(value, option, positive)


def print_json(data: Any, compact: bool = False) -> None:
    """Write `data` as JSON on stdout (one line when compact)."""
    if compact:
        typer.echo(json.dumps(data, separators=(",", ":"), sort_keys=True))
    else:
        typer.echo(json.dumps(data, indent=2, sort_keys=True))


def print_table(rows: list[list[Any]], headers: list[str], styles: Optional[dict[int, Any]] = None,
                header: bool = True) -> None:
    """Left-aligned columns on stdout; empty cells show as '-', a line break in a cell as a space.

    `styles` maps a column's number to a function that colours its padded cell; `header` False leaves the
    headers' line out (squeue's --noheader), their widths still kept.
    """
    cells = [[("-" if c is None or c == "" else " ".join(str(c).splitlines())) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    styles = styles or {}
    if header:
        typer.echo("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip())
    for row in cells:
        padded = [styles[i](c.ljust(w)) if i in styles else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        typer.echo("  ".join(padded).rstrip())


def print_log_line(line: dict, prefix: str = "") -> None:
    """A task's stdout line to stdout; its stderr and system lines to stderr."""
    text = line.get("text", "")
    stream = line.get("stream")
    if stream == "system":
        text = f"[gpulayer] {text}"
    if stream != "stdout" and stdout_closed():
        raise BrokenPipeError("stdout was closed")  # `job logs 7 | head -2`: stop, as at the next stdout line
    out = sys.stdout if stream == "stdout" else sys.stderr
    out.write(f"{prefix}{text}" + ("" if text.endswith("\n") else "\n"))
    out.flush()


def stdout_closed() -> bool:
    """True when stdout is a pipe whose reader has gone (`| head` has read its lines): writing to it would
    fail, so the lines meant for stderr beside it must stop too."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError, AttributeError):  # no real stdout (a test runner's)
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def exit_code_of(job: dict) -> int:
    """The exit status the CLI returns for a finished job: the job's own, 1 when it has none."""
    code = job.get("exit_code")
    if job.get("state") == "succeeded":
        return 0
    if isinstance(code, int) and code != 0:
        return code if 0 < code < 256 else 1
    return 1


def colour_on(err: bool = False) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set (no-color.org)."""
    if os.environ.get("NO_COLOR"):
        return False
    return (sys.stderr if err else sys.stdout).isatty()


def style(text: str, colour: str, err: bool = False) -> str:
    """`text` in `colour` when the stream it goes to (stdout, or stderr with err) takes colour."""
    return typer.style(text, fg=colour) if colour_on(err) else text


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print `Error: message` on stderr and return the Exit to raise."""
    typer.echo(f"Error: {message}", err=True)
    return typer.Exit(code)


def fmt_clock(ts: float, now: Optional[float] = None) -> str:
    """Unix seconds → local 'HH:MM' within a day of `now` (default: the clock), else 'YYYY-MM-DD HH:MM'."""
    import time
    now = time.time() if now is None else now
    return time.strftime("%H:%M" if abs(ts - now) < 86400 else "%Y-%m-%d %H:%M", time.localtime(ts))


def fmt_time(ts: Optional[float]) -> str:
    """Unix seconds → local 'YYYY-MM-DD HH:MM:SS' ('-' for None)."""
    if ts is None:
        return "-"
    import time
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def start_parts(at: float, now: float) -> tuple[str, str]:
    """An expected start as people say it: ("14:20", "in 35 min") (local time; the date too when not
    today); ("now", "") when it is due."""
    import time
    ahead = at - now
    if ahead < 30:
        return "now", ""
    same_day = time.localtime(at)[:3] == time.localtime(now)[:3]
    when = time.strftime("%H:%M" if same_day else "%Y-%m-%d %H:%M", time.localtime(at))
    minutes = round(ahead / 60)
    if minutes < 60:
        return when, f"in {max(minutes, 1)} min"
    if minutes < 48 * 60:
        return when, f"in {minutes // 60} h {minutes % 60:02d} min"
    return when, f"in {ahead / 86400:.1f} days"


def fmt_start(at: float, now: float) -> str:
    """start_parts as one text: "14:20, in 35 min", "now"."""
    return ", ".join(p for p in start_parts(at, now) if p)


def _front_ends(value: int) -> int:
    """--front-ends past this machine's cores is allowed (a test, a machine about to grow), with a warning."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if value > cores:
        typer.echo(f"Warning: --front-ends {value} is more than the {cores} cores this process may use: the front "
                   "ends will share cores (docs/cli.md)", err=True)
    return value


FrontEnds = Annotated[int, typer.Option(
    "--front-ends", min=1, metavar="N", callback=_front_ends,
    help="HTTP front-end processes on the port (SO_REUSEPORT), besides one writer process that runs every write "
         "and upkeep; 1: one process serves all (docs/architecture.md, \"When one machine is not enough\").")]

