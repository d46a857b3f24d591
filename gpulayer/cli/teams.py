"""`gpulayer user ...`, `gpulayer project ...` and `gpulayer whoami`: who shares the fleet (docs/teams.md)."""
from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from gpulayer.cli.common import client_of, fail, fmt_time, print_json, print_table
from gpulayer.cli.idle_options import IdleActionOpt, IdleBelowOpt, idle_policy
from gpulayer.protocol import plural

user_app = typer.Typer(help="Users: who holds client tokens (admins add and remove them).", no_args_is_help=True)
project_app = typer.Typer(help="Projects: groups of users that share GPUs, with quotas.", no_args_is_help=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]
ROLES = ("member", "manager")


def _membership(value: str) -> tuple[str, str]:
    """`P` or `P:manager` / `P:member` → (project, role); a usage error otherwise."""
    project, _, role = value.partition(":")
    role = role or "member"
    if not project or role not in ROLES:
        raise fail(f"--project {value!r}: give PROJECT or PROJECT:manager (or PROJECT:member)", 2)
    return project, role


def _report(answer: dict, as_json: bool, message: str) -> None:
    """The changed user or project as JSON, or a line on stderr saying what changed."""
    if as_json:
        print_json(answer)
    else:
        typer.echo(message, err=True)


def _projects_text(projects: list[dict]) -> str:
    return ",".join(f"{p['project']}:{p['role']}" if p.get("role") == "manager" else p["project"]
                    for p in projects or []) or "-"


@user_app.command("add")
def user_add(ctx: typer.Context,
             name: Annotated[str, typer.Argument(help="The user's name (lower-case letters, digits, _ . -).")],
             admin: Annotated[bool, typer.Option("--admin", help="May do everything.")] = False,
             project: Annotated[Optional[list[str]], typer.Option("--project", help="P or P:manager (repeatable; default: member of default).")] = None,
             max_running_jobs: Annotated[Optional[int], typer.Option("--max-running-jobs", min=0, help="At most this many of its jobs run at once.")] = None,
             reclaim: Annotated[bool, typer.Option("--reclaim", help="The name was a removed user's: bring that account back, its jobs, logs and outputs included.")] = False,
             as_json: JsonOpt = False) -> None:
    """Add a user; its client token is printed once, alone on the first line (details on stderr).

    A removed user's name is refused unless --reclaim: the name is the account, so it would get
    the old user's jobs, logs and outputs.

    \b
    Example:
      gpulayer user add alice --project vision:manager --project nlp --max-running-jobs 20
    """
    answer = client_of(ctx).add_user(name, admin=admin, projects=[_membership(p) for p in project or []],
                                     max_running_jobs=max_running_jobs, reclaim=reclaim)
    if as_json:
        print_json(answer)
        return
    typer.echo(answer["token"])
    typer.echo(f"user {answer['name']} added{' (admin)' if answer.get('admin') else ''} in "
               f"{_projects_text(answer.get('projects') or [])}; give them the token above "
               "(GPULAYER_TOKEN): it is not shown again", err=True)


@user_app.command("list")
def user_list(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Every user, with its projects and roles (admins).

    \b
    Example:
      gpulayer user list --json
    """
    users = client_of(ctx).users()
    if as_json:
        print_json(users)
        return
    print_table([[u["name"], "yes" if u["admin"] else "", _projects_text(u.get("projects") or []),
                  "-" if u.get("max_running_jobs") is None else u["max_running_jobs"], fmt_time(u.get("created_at"))]
                 for u in users], ["NAME", "ADMIN", "PROJECTS", "MAX RUNNING", "CREATED"])


@user_app.command("set")
def user_set(ctx: typer.Context,
             name: Annotated[str, typer.Argument(help="The user's name.")],
             admin: Annotated[Optional[bool], typer.Option("--admin/--no-admin", help="Make or unmake an admin.")] = None,
             max_running_jobs: Annotated[Optional[int], typer.Option("--max-running-jobs", min=0, help="At most this many of its jobs run at once.")] = None,
             no_limit: Annotated[bool, typer.Option("--no-max-running-jobs", help="Lift the running-jobs limit.")] = False,
             as_json: JsonOpt = False) -> None:
    """Change a user's admin flag or running-jobs limit (admins).

    \b
    Example:
      gpulayer user set alice --max-running-jobs 50
    """
    changes: dict = {}
    if admin is not None:
        changes["admin"] = admin
    if max_running_jobs is not None and no_limit:
        raise fail("give --max-running-jobs N or --no-max-running-jobs, not both", 2)
    if max_running_jobs is not None or no_limit:
        changes["max_running_jobs"] = max_running_jobs
    if not changes:
        raise fail("nothing to change: give --admin/--no-admin or --max-running-jobs", 2)
    _report(client_of(ctx).set_user(name, **changes), as_json, f"user {name} changed")


@user_app.command("remove")
def user_remove(ctx: typer.Context, name: Annotated[str, typer.Argument(help="The user's name.")]) -> None:
    """Remove a user (admins): its client tokens stop working at once; its jobs stay its own.

    \b
    Example:
      gpulayer user remove bob
    """
    answer = client_of(ctx).remove_user(name)
    typer.echo(f"user {name} removed ({plural(len(answer.get('tokens_revoked') or []), 'token')} revoked)", err=True)


def _settings(gpus: Optional[int], no_quota: bool, borrow: Optional[int], weight: Optional[float],
              visibility: Optional[str], max_priority: Optional[int] = None) -> dict:
    if gpus is not None and no_quota:
        raise fail("give --gpus N or --no-quota, not both", 2)
    if visibility is not None and visibility not in ("private", "project"):
        raise fail("--visibility: must be private or project", 2)
    found: dict = {}
    if gpus is not None or no_quota:
        found["gpus"] = gpus
    for key, value in (("borrow", borrow), ("weight", weight), ("visibility", visibility),
                       ("max_priority", max_priority)):
        if value is not None:
            found[key] = value
    return found


GpusOpt = Annotated[Optional[int], typer.Option("--gpus", min=0, help="Its GPU quota (nominal).")]
NoQuotaOpt = Annotated[bool, typer.Option("--no-quota", help="No GPU quota.")]
BorrowOpt = Annotated[Optional[int], typer.Option("--borrow", min=0, help="GPUs it may borrow beyond its quota when idle.")]
WeightOpt = Annotated[Optional[float], typer.Option("--weight", min=0.000001, help="Its fair share (default: its quota).")]
MaxPriorityOpt = Annotated[Optional[int], typer.Option("--max-priority", min=-1_000_000, max=1_000_000, help="The highest --priority its members may ask for (default 0: they may only lower theirs); admins are not bound, its managers may set it.")]
VisibilityOpt = Annotated[Optional[str], typer.Option("--visibility", help="private (members see each other's jobs exist) or project (and read their logs and outputs).")]


IdleTimeoutOpt = Annotated[Optional[str], typer.Option(
    "--idle-timeout", metavar="DURATION|off",
    help="Its idle policy (docs/teams.md): act on a task whose every GPU stays under --idle-below this long (30m); "
         "off: none of its own (the fleet default applies).")]


def _idle(timeout: Optional[str], below: Optional[str], action: Optional[str]) -> dict:
    """The project's idle policy options as its settings; `--idle-timeout off` clears its own timeout."""
    if timeout == "off":
        return {"idle_timeout_seconds": None, **idle_policy(None, below, action)}
    return idle_policy(timeout, below, action)


@project_app.command("add")
def project_add(ctx: typer.Context, name: Annotated[str, typer.Argument(help="The project's name.")],
                gpus: GpusOpt = None, borrow: BorrowOpt = None, weight: WeightOpt = None,
                visibility: VisibilityOpt = None, max_priority: MaxPriorityOpt = None,
                idle_timeout: IdleTimeoutOpt = None, idle_below: IdleBelowOpt = None,
                idle_action: IdleActionOpt = None, as_json: JsonOpt = False) -> None:
    """Add a project (admins).

    \b
    Example:
      gpulayer project add vision --gpus 16 --borrow 8 --visibility project --max-priority 10
    """
    settings = _settings(gpus, False, borrow, weight, visibility, max_priority)
    _report(client_of(ctx).add_project(name, **settings, **_idle(idle_timeout, idle_below, idle_action)),
            as_json, f"project {name} added")


@project_app.command("set")
def project_set(ctx: typer.Context, name: Annotated[str, typer.Argument(help="The project's name.")],
                gpus: GpusOpt = None, no_quota: NoQuotaOpt = False, borrow: BorrowOpt = None,
                weight: WeightOpt = None, visibility: VisibilityOpt = None, max_priority: MaxPriorityOpt = None,
                idle_timeout: IdleTimeoutOpt = None, idle_below: IdleBelowOpt = None,
                idle_action: IdleActionOpt = None, as_json: JsonOpt = False) -> None:
    """Change a project's quota, borrowing limit, weight, visibility, priority ceiling or idle policy.

    Admins change them all; the project's managers its priority ceiling.

    \b
    Example:
      gpulayer project set vision --gpus 24 --weight 2
      gpulayer project set vision --max-priority 10
      gpulayer project set vision --idle-timeout 30m --idle-below 5% --idle-action requeue
    """
    settings = {**_settings(gpus, no_quota, borrow, weight, visibility, max_priority),
                **_idle(idle_timeout, idle_below, idle_action)}
    if not settings:
        raise fail("nothing to change: give --gpus, --borrow, --weight, --visibility, --max-priority or an --idle-* "
                   "option", 2)
    _report(client_of(ctx).set_project(name, **settings), as_json, f"project {name} changed")


@project_app.command("list")
def project_list(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """The projects you are in (admins: all), with their settings and members.

    \b
    Example:
      gpulayer project list
    """
    projects = client_of(ctx).projects()
    if as_json:
        print_json(projects)
        return
    print_table([[p["name"], "-" if p.get("gpus") is None else p["gpus"], p.get("borrow", 0),
                  "-" if p.get("weight") is None else f"{p['weight']:g}", p.get("max_priority", 0), p.get("visibility"),
                  ",".join(f"{m['user']}:{m['role']}" if m["role"] == "manager" else m["user"]
                           for m in p.get("members") or []) or "-"]
                 for p in projects], ["NAME", "GPUS", "BORROW", "WEIGHT", "MAX PRIORITY", "VISIBILITY", "MEMBERS"])


@project_app.command("remove")
def project_remove(ctx: typer.Context, name: Annotated[str, typer.Argument(help="The project's name.")],
                   yes: Annotated[bool, typer.Option("--yes", "-y", "--force", help="Remove it without asking, whatever it holds.")] = False) -> None:
    """Remove a project with no job left to end (admins): its memberships and secrets go too.

    A project with members or jobs is removed only once confirmed (--yes
    where nobody can answer); its usage keeps its name.

    \b
    Example:
      gpulayer project remove old-sweeps --yes
    """
    client = client_of(ctx)
    held = _project_holds(client, name)
    if held and not yes:
        if not sys.stdin.isatty():
            raise fail(f"project {name} holds {held}: pass --yes to remove it (nothing was changed)", 2)
        if not typer.confirm(f"project {name} holds {held}; its memberships and secrets go. Remove it?"):
            raise fail(f"project {name} kept", 1)
    client.remove_project(name)
    typer.echo(f"project {name} removed", err=True)


def _project_holds(client, name: str) -> str:
    """What a project holds, said for a confirmation (`2 members (alice, bob) and 14 jobs`); '' when nothing
    (or when the caller may not list it: the DELETE answers for it)."""
    project = next((p for p in client.projects() if p["name"] == name), None)
    if project is None:
        return ""
    members = [m["user"] for m in project.get("members") or []]
    jobs = len(client.jobs(limit=1000, all=True, project=name))
    parts = ([f"{plural(len(members), 'member')} ({', '.join(members[:5])}{', ...' if len(members) > 5 else ''})"]
             if members else []) + ([f"{'1000+ jobs' if jobs >= 1000 else plural(jobs, 'job')}"] if jobs else [])
    return " and ".join(parts)


@project_app.command("add-member")
def project_add_member(ctx: typer.Context, name: Annotated[str, typer.Argument(help="The project.")],
                       user: Annotated[str, typer.Argument(help="The user.")],
                       manager: Annotated[bool, typer.Option("--manager", help="As a manager (else a member).")] = False) -> None:
    """Add a user to a project, or change its role there (the project's managers, admins).

    \b
    Example:
      gpulayer project add-member vision carol --manager
    """
    client_of(ctx).set_member(name, user, "manager" if manager else "member")
    typer.echo(f"{user} is a {'manager' if manager else 'member'} of {name}", err=True)


@project_app.command("remove-member")
def project_remove_member(ctx: typer.Context, name: Annotated[str, typer.Argument(help="The project.")],
                          user: Annotated[str, typer.Argument(help="The user.")]) -> None:
    """Take a user out of a project (the project's managers, admins); its jobs there stay its own.

    \b
    Example:
      gpulayer project remove-member vision carol
    """
    client_of(ctx).remove_member(name, user)
    typer.echo(f"{user} left {name}", err=True)


def whoami(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Who your token says you are: user, admin or not, projects and roles.

    \b
    Example:
      gpulayer whoami --json
    """
    client = client_of(ctx)
    if not hasattr(client, "whoami"):
        raise fail("whoami needs a control plane (this home runs jobs locally, as you)", 2)
    answer = client.whoami()
    if as_json:
        print_json(answer)
        return
    typer.echo(f"{answer['user']}{' (admin)' if answer.get('admin') else ''}")
    typer.echo(f"projects: {_projects_text(answer.get('projects') or [])}")
