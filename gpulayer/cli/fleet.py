"""`gpulayer token ...` and `gpulayer secret ...`: who may join, what jobs may read."""
from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from gpulayer.cli.common import client_of, fail, fmt_time, parse_duration, parse_pairs, print_json, print_table

token_app = typer.Typer(help="Worker join tokens bound to a name and labels; client tokens of users.", no_args_is_help=True)
secret_app = typer.Typer(help="Secrets that jobs receive as environment variables.", no_args_is_help=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]
ProjectOpt = Annotated[Optional[str], typer.Option("--project", help="The project whose secrets (default: your only project, else default).")]


@token_app.command("create")
def token_create(ctx: typer.Context,
                 name: Annotated[Optional[str], typer.Option("--name", help="The name its workers carry (--kind client: default the user's name).")] = None,
                 label: Annotated[Optional[list[str]], typer.Option("--label", help="k=v its workers carry (repeatable).")] = None,
                 expires: Annotated[str, typer.Option("--expires", help="Lifetime: 3600, 30m, 12h, 365d, 2w.")] = "365d",
                 kind: Annotated[str, typer.Option("--kind", help="join (a worker's), metrics, or client (a user's).")] = "join",
                 user: Annotated[Optional[str], typer.Option("--user", help="--kind client: whose (default you; another user: admins).")] = None,
                 as_json: JsonOpt = False) -> None:
    """Mint a token: printed once, alone on the first line (details on stderr).

    \b
    Example:
      gpulayer token create --name gpu-07 --label pool=a100 --expires 30d
      gpulayer token create --kind client --user alice --expires 90d
    """
    labels, expires_in_s = parse_pairs(label, "--label"), parse_duration(expires, "--expires")
    if kind not in ("join", "metrics", "client"):
        raise fail("--kind: must be join, metrics or client", 2)
    if user is not None and kind != "client":
        raise fail("--user: only a client token (--kind client) belongs to a user", 2)
    if name is None and kind != "client":
        raise fail(f"--name: a {kind} token needs one (only a client token defaults to its user's name)", 2)
    answer = client_of(ctx).create_token(name, labels, expires_in_s, kind=None if kind == "join" else kind, user=user)
    if as_json:
        print_json(answer)
        return
    typer.echo(answer["token"])
    typer.echo(f"jti={answer.get('jti')} name={answer.get('name')} "
               f"expires={fmt_time(answer.get('expires_at'))} (the token is not shown again)", err=True)


@token_app.command("list")
def token_list(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Minted join tokens (never their secret part).

    \b
    Example:
      gpulayer token list --json
    """
    tokens = client_of(ctx).tokens()
    if as_json:
        print_json(tokens)
        return
    rows = [[t.get("jti"), t.get("name"), ",".join(f"{k}={v}" for k, v in sorted((t.get("labels") or {}).items())),
             fmt_time(t.get("created_at")), fmt_time(t.get("expires_at")),
             "revoked" if t.get("revoked_at") else "active"] for t in tokens]
    print_table(rows, ["JTI", "NAME", "LABELS", "CREATED", "EXPIRES", "STATE"])


@token_app.command("revoke")
def token_revoke(ctx: typer.Context,
                 jti: Annotated[str, typer.Argument(help="The token's jti (see `token list`).")]) -> None:
    """Revoke a join token: its workers stop at their next heartbeat and their tasks are requeued.

    \b
    Example:
      gpulayer token revoke JTI   # the jti from `gpulayer token list`
    """
    client_of(ctx).revoke_token(jti)
    typer.echo(f"revoked {jti}")


def _read_secret_value(name: str) -> str:
    """The value from stdin when piped (one trailing newline dropped), else a hidden prompt."""
    if not sys.stdin.isatty():
        value = sys.stdin.read()
        value = value[:-1] if value.endswith("\n") else value
        value = value[:-1] if value.endswith("\r") else value
    else:
        value = typer.prompt(f"Value of {name}", hide_input=True)
    if value == "":
        raise fail("the secret's value is empty", 2)
    return value


@secret_app.command("set")
def secret_set(ctx: typer.Context,
               name: Annotated[str, typer.Argument(help="Its name, also the variable jobs receive.")],
               label: Annotated[Optional[list[str]], typer.Option("--label", help="k=v a worker's token must carry to receive it (repeatable).")] = None,
               project: ProjectOpt = None) -> None:
    """Store a project's secret (its managers, admins). The value comes from stdin when piped, else a hidden prompt; never an argument.

    \b
    Example:
      printf %s "$HF_TOKEN" | gpulayer secret set HF_TOKEN --project vision
    """
    labels = parse_pairs(label, "--label")
    client_of(ctx).set_secret(name, _read_secret_value(name), labels, project)
    typer.echo(f"secret {name} set", err=True)


@secret_app.command("list")
def secret_list(ctx: typer.Context, project: ProjectOpt = None, as_json: JsonOpt = False) -> None:
    """A project's secret names and labels (never values).

    \b
    Example:
      gpulayer secret list --project vision
    """
    secrets = client_of(ctx).secrets(project)
    if as_json:
        print_json(secrets)
        return
    rows = [[s.get("name"), ",".join(f"{k}={v}" for k, v in sorted((s.get("labels") or {}).items())),
             fmt_time(s.get("updated_at") or s.get("created_at"))] for s in secrets]
    print_table(rows, ["NAME", "LABELS", "UPDATED"])


@secret_app.command("delete")
def secret_delete(ctx: typer.Context, name: Annotated[str, typer.Argument(help="The secret's name.")],
                  project: ProjectOpt = None) -> None:
    """Delete a project's secret; its jobs that name it wait until it is set again.

    \b
    Example:
      gpulayer secret delete HF_TOKEN --project vision
    """
    client_of(ctx).delete_secret(name, project)
    typer.echo(f"secret {name} deleted", err=True)
