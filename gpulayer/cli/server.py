"""`gpulayer server ...` (start, prune, backup), `up`, `explore` and `artifacts gc`: the control plane's side."""
from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from gpulayer.cli.common import fail, home_of, print_json
from gpulayer.protocol import (
    DEFAULT_PORT, HEARTBEAT_INTERVAL_S, JOB_RETENTION_S, LEASE_TTL_S, LOG_RETENTION_S, MAX_OUTPUT_BYTES,
)

server_app = typer.Typer(help="Initialise, run and back up a control plane.", no_args_is_help=True)
artifacts_app = typer.Typer(help="The control plane's artifact store.", no_args_is_help=True)

Home = Annotated[Optional[Path], typer.Option("--home", envvar="GPULAYER_HOME", show_envvar=True,
                                              help="The control plane's home directory (default ~/.gpulayer).")]


def _seconds(value: Optional[str]) -> Optional[float]:
    """A duration option (`30d`, `12h`, `90s`) in seconds; a usage error otherwise."""
    if value is None:
        return None
    from gpulayer.server.errors import ConfigError
    from gpulayer.server.scheduler.retention import parse_duration
    try:
        return parse_duration(value)
    except ConfigError as exc:
        raise typer.BadParameter(exc.message) from None


LogRetention = Annotated[Optional[str], typer.Option(
    "--log-retention", callback=_seconds, metavar="DURATION",
    help=f"Prune the log lines of jobs that ended this long ago (30d, 12h, 90s; default {LOG_RETENTION_S // 86400:g}d).")]
JobRetention = Annotated[Optional[str], typer.Option(
    "--job-retention", callback=_seconds, metavar="DURATION",
    help=f"Prune ended jobs (tasks, events, logs), loose events and departed workers this old "
         f"(default {JOB_RETENTION_S // 86400:g}d).")]


def _retention(log_retention, job_retention) -> dict:
    """ControlPlaneConfig's retention settings that were given."""
    given = {"log_retention_s": log_retention, "job_retention_s": job_retention}
    return {k: v for k, v in given.items() if v is not None}


class Synchronous(str, Enum):
    normal = "normal"
    full = "full"


class FrontEnd(str, Enum):
    cheroot = "cheroot"
    granian = "granian"


HeartbeatInterval = Annotated[float, typer.Option("--heartbeat-interval", help="Seconds between worker heartbeats.", min=0.01)]
LeaseTTL = Annotated[float, typer.Option("--lease-ttl", help="Seconds without a heartbeat before a worker's tasks are lost.", min=0.01)]
SynchronousOpt = Annotated[Synchronous, typer.Option("--synchronous", help="SQLite synchronous: normal (fast) or full (survives power loss).")]
MaxOutputMB = Annotated[int, typer.Option("--max-output-mb", help="Largest task output a worker may upload, in MiB.", min=1)]


@server_app.command("init")
def server_init(ctx: typer.Context, home: Home = None,
                as_json: Annotated[bool, typer.Option("--json", help="Print the tokens as JSON.")] = False,
                force: Annotated[bool, typer.Option("--force", help="Rotate both tokens of an initialised home.")] = False) -> None:
    """Create the server secret and the client and join tokens (shown once; only hashes are kept)."""
    from gpulayer.server.process import init_home
    where = home_of(ctx, home)
    tokens = init_home(where, force=True) if force else init_home(where)
    if as_json:
        print_json({"home": str(where), **tokens})
        return
    typer.echo(f"initialised {where}")
    typer.echo(f"client token: {tokens['client_token']}   (GPULAYER_TOKEN for the CLI and Python client)")
    typer.echo(f"join token:   {tokens['join_token']}   (GPULAYER_JOIN_TOKEN for workers)")
    typer.echo("Both are shown once: store them now.", err=True)


@server_app.command("start")
def server_start(
    ctx: typer.Context,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on (0: any free one).", min=0, max=65535)] = DEFAULT_PORT,
    tls_cert: Annotated[Optional[Path], typer.Option("--tls-cert", help="PEM certificate (chain) for HTTPS.")] = None,
    tls_key: Annotated[Optional[Path], typer.Option("--tls-key", help="PEM private key for HTTPS.")] = None,
    allow_insecure_remote: Annotated[bool, typer.Option("--allow-insecure-remote", help="Allow plain HTTP on a non-loopback address (behind a TLS proxy you control).")] = False,
    home: Home = None,
    heartbeat_interval: HeartbeatInterval = HEARTBEAT_INTERVAL_S,
    lease_ttl: LeaseTTL = LEASE_TTL_S,
    synchronous: SynchronousOpt = Synchronous.normal,
    max_output_mb: MaxOutputMB = MAX_OUTPUT_BYTES // 1024 ** 2,
    log_retention: LogRetention = None,
    job_retention: JobRetention = None,
    http: Annotated[FrontEnd, typer.Option("--http", help="The HTTP front end: cheroot, or granian (needs the granian package; docs/benchmarks.md, \"Front ends\").")] = FrontEnd.cheroot,
) -> None:
    """Run the control plane in the foreground until SIGTERM or Ctrl-C."""
    if bool(tls_cert) != bool(tls_key):
        raise typer.BadParameter("give both --tls-cert and --tls-key, or neither", param_hint="--tls-key")
    from gpulayer.server.config import ControlPlaneConfig
    from gpulayer.server.process import run_server
    config = ControlPlaneConfig(home=home_of(ctx, home), host=host, port=port, tls_cert=tls_cert,
                                tls_key=tls_key, allow_insecure_remote=allow_insecure_remote, http=http.value,
                                **_plane_settings(heartbeat_interval, lease_ttl, synchronous, max_output_mb,
                                                  log_retention, job_retention))
    raise typer.Exit(run_server(config) or 0)


def _plane_settings(heartbeat_interval, lease_ttl, synchronous, max_output_mb, log_retention,
                    job_retention) -> dict:
    """The ControlPlaneConfig fields that `server start` and `up` both take."""
    return dict(heartbeat_interval_s=heartbeat_interval, lease_ttl_s=lease_ttl, synchronous=synchronous.value,
                max_output_bytes=max_output_mb * 1024 ** 2, **_retention(log_retention, job_retention))


@server_app.command("prune")
def server_prune(ctx: typer.Context, home: Home = None,
                 dry_run: Annotated[bool, typer.Option("--dry-run", help="Count what would be removed; remove nothing.")] = False,
                 log_retention: LogRetention = None, job_retention: JobRetention = None,
                 as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Apply retention now (as upkeep does on its own) and print what was removed; safe while the server runs."""
    from gpulayer.server.scheduler.retention import run_prune
    # The options' callback (_seconds) has turned their text into seconds.
    result = run_prune(home_of(ctx, home), dry_run=dry_run, log_retention_s=log_retention,  # type: ignore[arg-type]
                       job_retention_s=job_retention)  # type: ignore[arg-type]
    if as_json:
        print_json(result)
        return
    verb = "would remove" if dry_run else "removed"
    typer.echo(f"{verb} {result['jobs']} job(s), {result['log_lines']} log line(s), {result['events']} event(s), "
               f"{result['workers']} departed worker(s)")


@server_app.command("rotate-join-token")
def server_rotate_join_token(ctx: typer.Context, home: Home = None) -> None:
    """Replace the join token of `server init`; the old one stops working (joined workers stay)."""
    from gpulayer.server.process import rotate_join_token
    typer.echo(rotate_join_token(home_of(ctx, home)))


@server_app.command("backup")
def server_backup(ctx: typer.Context,
                  dest: Annotated[Path, typer.Argument(help="File to write the copy of the state file to.")],
                  home: Home = None) -> None:
    """Take a consistent copy of the state file while the server runs (SQLite backup API)."""
    from gpulayer.server.process import backup
    result = backup(home_of(ctx, home), dest) or {}
    details = " ".join(f"{k}={v}" for k, v in result.items() if k != "dest")
    typer.echo(f"backed up to {dest} {details}".rstrip(), err=True)


def up(ctx: typer.Context, home: Home = None,
       host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "0.0.0.0",
       port: Annotated[int, typer.Option("--port", help="Port to listen on.", min=0, max=65535)] = DEFAULT_PORT,
       parallel: Annotated[Optional[int], typer.Option("--parallel", help="Tasks the local worker runs at once (default: CPU count).", min=1)] = None,
       heartbeat_interval: HeartbeatInterval = HEARTBEAT_INTERVAL_S, lease_ttl: LeaseTTL = LEASE_TTL_S,
       synchronous: SynchronousOpt = Synchronous.normal, max_output_mb: MaxOutputMB = MAX_OUTPUT_BYTES // 1024 ** 2,
       log_retention: LogRetention = None, job_retention: JobRetention = None) -> None:
    """Start a control plane over TLS and a local worker; print the line that joins other machines."""
    from gpulayer.cli.up import run_up
    raise typer.Exit(run_up(home_of(ctx, home), host, port, parallel,
                            **_plane_settings(heartbeat_interval, lease_ttl, synchronous, max_output_mb,
                                              log_retention, job_retention)))


def explore(ctx: typer.Context, home: Home = None,
            state: Annotated[Optional[Path], typer.Option("--state", help="State file to open (default: HOME/state.db).")] = None,
            host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
            port: Annotated[int, typer.Option("--port", help="Port to listen on.", min=0, max=65535)] = 8471,
            token_required: Annotated[bool, typer.Option("--token-required", help="Ask for the home's client token (`server init`); needed off loopback.")] = False) -> None:
    """Browse the state file read-only in a web page."""
    from gpulayer.server.config import HomeLayout
    from gpulayer.server.errors import ConfigError
    from gpulayer.server.security.auth import client_token_check
    import explorer
    where = home_of(ctx, home)
    path = state or HomeLayout(where).state
    if not Path(path).exists():
        raise fail(f"no state file at {path} (run `gpulayer server init` or `gpulayer up` first, or pass --state)", 2)
    try:
        auth = client_token_check(where) if token_required else None
        explorer.serve(str(path), host=host, port=port, auth=auth)
    except (ConfigError, explorer.Exposed) as e:
        raise fail(str(e), 2) from None
    except (OSError, ValueError) as e:   # waitress: the address is taken or does not resolve
        raise fail(f"cannot listen on {host} port {port}: {getattr(e, 'strerror', None) or e}", 2) from None


@artifacts_app.command("gc")
def artifacts_gc(ctx: typer.Context, home: Home = None,
                 dry_run: Annotated[bool, typer.Option("--dry-run", help="Print what would be removed; remove nothing.")] = False,
                 as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Remove artifacts no job references that are older than the retention period."""
    from gpulayer.server.scheduler.retention import run_gc
    removed = run_gc(home_of(ctx, home), dry_run=dry_run)
    if as_json:
        print_json(removed)
        return
    for item in removed:
        typer.echo(item)
    verb = "would remove" if dry_run else "removed"
    typer.echo(f"{verb} {len(removed)} artifact(s)", err=True)
