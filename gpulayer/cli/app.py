"""The `gpulayer` command: a thin typer layer over gpulayer.client (and, lazily, the control plane and agent).

Commands live in jobs.py (submit, job), workers.py (worker, join),
fleet.py (token, secret) and server.py (server, up, explore,
artifacts). Every failure ends as one line `Error: ...` on stderr: exit
status 2 for bad usage, 1 for a refusal or an unreachable server.
"""
from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from collections.abc import Sequence
from typing import Annotated, Any, Optional

import typer
from typer.core import TyperGroup

from typer.exceptions import Abort

try:  # typer >= 0.20 vendors click
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - older typer
    from click import exceptions as click_exceptions  # type: ignore[no-redef]

from gpulayer.cli import access as cli_access
from gpulayer.cli import fleet as cli_fleet
from gpulayer.cli import images as cli_images
from gpulayer.cli import jobs as cli_jobs
from gpulayer.cli import notify as cli_notify
from gpulayer.cli import service as cli_service
from gpulayer.cli import server as cli_server
from gpulayer.cli import policy as cli_policy
from gpulayer.cli import sql as cli_sql
from gpulayer.cli import submit as cli_submit
from gpulayer.cli import teams as cli_teams
from gpulayer.cli import usage as cli_usage
from gpulayer.cli import workers as cli_workers
from gpulayer.cli.common import GlobalOptions
from gpulayer.client.errors import ApiError, BadInput, ClientError, InvalidRequest


class GpulayerGroup(TyperGroup):
    """The root group: turns every error into one `Error:` line and an exit status."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _no_flag_placeholders(self)

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, windows_expand_args: bool = True, **extra: Any) -> Any:
        """Run the CLI; with standalone_mode, exit with the status, else return it."""
        code = self._run(args, prog_name or "gpulayer", complete_var, {**extra, "windows_expand_args": windows_expand_args})
        if standalone_mode:
            sys.exit(code)
        return code

    def invoke(self, ctx):
        """Run the command; a reader of stdout that went away (`gpulayer job logs 7 | head`) ends it with 0."""
        try:
            return super().invoke(ctx)
        except BrokenPipeError:  # caught here, before click turns it into exit status 1
            _quiet_stdout()
            return 0

    def _run(self, args, prog_name, complete_var, extra) -> int:
        try:
            rv = super().main(args=args, prog_name=prog_name, complete_var=complete_var,
                              standalone_mode=False, **extra)
        except click_exceptions.ClickException as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # a group without its command: help was shown
                sys.stderr.write(exc.format_message().strip() and f"{exc.format_message()}\n")
                return exc.exit_code
            sys.stderr.write(f"Error: {_usage_message(exc)}\n")
            return exc.exit_code
        except SystemExit as exc:  # typer exits by itself on a broken pipe
            return exc.code if isinstance(exc.code, int) else 1
        except Abort:
            sys.stderr.write("Error: aborted\n")
            return 130
        except (KeyboardInterrupt, EOFError):
            sys.stderr.write("Error: interrupted\n")
            return 130
        except Exception as exc:  # noqa: BLE001 - the one place that turns errors into exit codes
            return _report(exc)
        return rv if isinstance(rv, int) else 0


def _values_optional(args: list[str]) -> list[str]:
    """`submit --ingress` alone (at the end, or before another option or `--`) is `--ingress token`: typer's
    click takes no option whose value may be left out."""
    if "submit" not in args:
        return args
    end = args.index("--") if "--" in args else len(args)
    out = []
    for i, arg in enumerate(args):
        out.append(arg)
        if i < end and arg in cli_submit.VALUE_OPTIONAL and (i + 1 == len(args) or args[i + 1].startswith("-")):
            out.append(cli_submit.VALUE_OPTIONAL[arg])
    return out


def _no_flag_placeholders(command) -> None:
    """typer's help shows `<bool>` after a flag as if it took a value: a flag shows no placeholder.

    Wraps each command's get_params, which help reads, so the options added
    late (--help, the completion ones) are covered too.
    """
    get_params = command.get_params

    def params_without_placeholders(ctx):
        params = get_params(ctx)
        for param in params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
        return params

    command.get_params = params_without_placeholders
    for sub in getattr(command, "commands", {}).values():
        _no_flag_placeholders(sub)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so that flushing it at exit does not fail on the closed pipe again."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (a test runner's): nothing to flush there
        pass


#: What a typed option's value failed to be, in the option's words, by pydantic's error type (typer
#: validates option values with pydantic, whose own words are "Input should be a valid integer, ...").
VALUE_KINDS = {"int_parsing": "a whole number", "int_from_float": "a whole number", "float_parsing": "a number",
               "bool_parsing": "true or false", "int_type": "a whole number", "float_type": "a number"}


def _in_the_options_words(exc) -> None:
    """Rewrite a typed option's refusal (`--gpus two`) from pydantic's words into the option's: `'two' is
    not a whole number`; other refusals are left as they are."""
    errors = getattr(exc.__cause__, "errors", None)
    if not isinstance(exc, click_exceptions.BadParameter) or not callable(errors):
        return
    first = (errors() or [{}])[0]
    kind, bounds, given = VALUE_KINDS.get(first.get("type", "")), first.get("ctx") or {}, str(first.get("input"))
    if kind is not None:
        exc.message = f"{given!r} is not {kind}"
    elif first.get("type") in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        name, limit = next(iter(bounds.items()), ("", ""))
        words = {"ge": f"{limit} or more", "gt": f"more than {limit}", "le": f"{limit} or less", "lt": f"less than {limit}"}
        exc.message = f"{given}: must be {words.get(name, limit)}"


def _usage_message(exc) -> str:
    """click's message plus which command's --help to read, on one line."""
    _in_the_options_words(exc)
    message = exc.format_message()
    ctx = getattr(exc, "ctx", None)
    if isinstance(exc, click_exceptions.UsageError) and ctx is not None:
        message += f" (see `{ctx.command_path} --help`)"
    return message.replace("\n", " ")


#: The import names of the `server` extra (pyproject.toml): the base install lacks them.
SERVER_PACKAGES = frozenset({"apsw", "falcon", "cheroot", "cryptography", "jinja2", "prometheus_client",
                             "waitress", "sqlite_utils", "lightkube", "httpx2"})


def _report(exc: Exception) -> int:
    """Print one `Error:` line for an error raised by a command; return the exit status."""
    missing = (exc.name or "").split(".")[0] if isinstance(exc, ImportError) else ""
    if missing in SERVER_PACKAGES:
        sys.stderr.write(f"Error: this command needs the control plane's packages ({missing} is not installed): "
                         "pip install 'gpulayer[server]'\n")
        return 1
    if isinstance(exc, ApiError):  # a 400 (413, 422) refuses what was given: bad input, as a usage error is
        sys.stderr.write(f"Error: {exc.message} ({exc.code})\n")
        return 2 if isinstance(exc, InvalidRequest) else 1
    if isinstance(exc, ClientError):
        sys.stderr.write(f"Error: {exc.message}\n")
        return 2 if isinstance(exc, BadInput) else 1
    # Only the commands that run a control plane here (server, up, local) load the server's
    # errors; the others must not import the server at all (docs/architecture.md).
    server_errors = sys.modules.get("gpulayer.server.errors")
    if server_errors is not None and isinstance(exc, server_errors.GpulayerError):
        sys.stderr.write(f"Error: {exc.message} ({exc.code})\n")
        return 2 if isinstance(exc, server_errors.ConfigError) else 1
    if isinstance(exc, (ValueError, TypeError, OSError)) and not os.environ.get("GPULAYER_DEBUG"):
        sys.stderr.write(f"Error: {exc}\n")
        return 1
    if os.environ.get("GPULAYER_DEBUG"):
        traceback.print_exc()
    sys.stderr.write(f"Error: unexpected {type(exc).__name__}: {exc} (set GPULAYER_DEBUG=1 for a traceback)\n")
    return 1


app = typer.Typer(
    cls=GpulayerGroup, name="gpulayer", no_args_is_help=True, add_completion=True,
    pretty_exceptions_enable=False,
    help="GPUlayer: run jobs and services on GPU workers that dial out to one control plane.\n\n"
         "\b\nExamples:\n  gpulayer up                 # a control plane and a worker here\n"
         "  gpulayer submit --gpus 1 --follow -- python train.py",
)


def _print_version(value: bool) -> None:
    if value:
        from gpulayer import __version__
        typer.echo(f"gpulayer {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    url: Annotated[Optional[str], typer.Option("--url", envvar="GPULAYER_URL", show_envvar=True, help="Control plane URL, e.g. https://cp.internal:8470.")] = None,
    token: Annotated[Optional[str], typer.Option("--token", envvar="GPULAYER_TOKEN", show_envvar=True, help="Client token glc_...")] = None,
    ca_file: Annotated[Optional[str], typer.Option("--ca-file", envvar="GPULAYER_CA_FILE", show_envvar=True, help="CA certificate to trust for the control plane.")] = None,
    home: Annotated[Optional[Path], typer.Option("--home", envvar="GPULAYER_HOME", show_envvar=True, help="Home directory: state, TLS files, client.json (default ~/.gpulayer).")] = None,
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")] = False,
) -> None:
    """GPUlayer: run jobs and services on GPU workers that dial out to one control plane."""
    ctx.obj = GlobalOptions(url=url, token=token, ca_file=ca_file, home=home)


_LOOSE = {"allow_interspersed_args": False}
app.command("submit", context_settings=_LOOSE)(cli_submit.submit)
app.add_typer(cli_jobs.job_app, name="job")
app.add_typer(cli_service.service_app, name="service")
app.command("exec")(cli_access.exec_command)
app.command("shell")(cli_access.shell_command)
app.command("port-forward")(cli_access.port_forward_command)
app.command("ssh-config")(cli_access.ssh_config_command)
app.command("ssh-proxy")(cli_access.ssh_proxy_command)
app.add_typer(cli_workers.worker_app, name="worker")
app.command("join")(cli_workers.join)
app.add_typer(cli_fleet.token_app, name="token")
app.add_typer(cli_fleet.secret_app, name="secret")
app.add_typer(cli_notify.webhook_app, name="webhook")
app.add_typer(cli_notify.alert_app, name="alert")
app.add_typer(cli_teams.user_app, name="user")
app.add_typer(cli_teams.project_app, name="project")
app.command("whoami")(cli_teams.whoami)
app.command("usage")(cli_usage.usage)
app.add_typer(cli_server.server_app, name="server")
app.command("up")(cli_server.up)
app.command("explore")(cli_server.explore)
app.command("sql")(cli_sql.sql)
app.add_typer(cli_policy.policy_app, name="policy")
app.add_typer(cli_server.artifacts_app, name="artifacts")
app.add_typer(cli_images.image_app, name="image")


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point of the `gpulayer` console script; returns the exit status."""
    command = typer.main.get_command(app)
    argv = _values_optional(sys.argv[1:] if argv is None else list(argv))
    return command.main(args=argv, prog_name="gpulayer", standalone_mode=False)


if __name__ == "__main__":
    from gpulayer.proc.ending import run_and_end
    from gpulayer.proc.malloc import keep_freed_memory
    keep_freed_memory()
    run_and_end(main)
