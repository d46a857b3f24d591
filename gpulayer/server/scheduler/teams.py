"""Teams: users, projects, memberships, and who may do what with a job (docs/teams.md, docs/security.md).

Roles: an admin may do everything; in a project, a `manager` manages the project's jobs,
members and secrets, a `member` submits to it. A job belongs to its owner (the user that
submitted it) and its project. What a caller may do with a job is one of three levels:

  manage  cancel, read logs, outputs and endpoints: the owner, the project's managers, admins
  read    read logs, outputs and endpoints: also every member when the project's visibility
          is `project`
  see     that it exists (id, name, owner, state, resources; not its env, logs or outputs):
          every other member of the project

Anyone else gets 404 for the job, as if it did not exist, so ids do not leak. Every
function here takes a read or write connection; the callers choose the transaction. How a job reads,
and what of it a caller who may only see it gets, is views.py's.
"""
from __future__ import annotations

import json
import re

import apsw

from gpulayer.protocol import plural
from gpulayer.server.errors import Conflict, Forbidden, InvalidRequest, NotFound
from gpulayer.server.scheduler import access, events, jobs
from gpulayer.server.scheduler.spec import ValidSpec, referenced_digests
from gpulayer.server.store.queries import QUERIES, one, row, rows

ADMIN_USER_ID = 1
DEFAULT_PROJECT_ID = 1
DEFAULT_PROJECT = "default"
ROLES = ("manager", "member")
VISIBILITIES = ("private", "project")
LEVELS = {"see": 1, "read": 2, "manage": 3}
NAME = re.compile(r"[a-z][a-z0-9_.-]{0,63}")   # fullmatch: `$` lets a trailing newline in
_WHAT = {"read": "read its logs, outputs and endpoints", "manage": "cancel it"}


def check_name(name, field: str) -> str:
    """A user or project name: lower-case letters, digits, `_ . -`, starting with a letter (64 at most)."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise InvalidRequest(f"{field}: must be 1-64 lower-case letters, digits, '_', '.' or '-', "
                             "starting with a letter", field=field)
    return name


def require_admin(principal, what: str) -> None:
    if not getattr(principal, "admin", False):
        raise Forbidden(f"only an admin may {what}")


# -- jobs: ownership ----------------------------------------------------------

def job_meta(conn: apsw.Connection, principal, job_id: int) -> dict:
    """The job's `owner` and `project` (names) and what `principal` may do with it (`level`: manage, read or
    see); NotFound when nothing (or there is no such job)."""
    found = row(conn, "job_owners", ids=json.dumps([job_id]), user_id=principal.user_id)
    allowed = level(principal, found)
    if found is None or allowed is None:
        raise NotFound(f"no job {job_id}")
    return {"id": job_id, "owner": found["owner"], "project": found["project"], "level": allowed}


def level(principal, found: dict | None) -> str | None:
    """What the caller may do with a job, from its job_owners row; None: it may not know the job exists."""
    if found is None:
        return None
    if principal.admin or found["user_id"] == principal.user_id or found["role"] == "manager":
        return "manage"
    if found["role"] == "member":
        return "read" if found["visibility"] == "project" else "see"
    return None


def check_job(conn: apsw.Connection, principal, job_id: int, need: str, action: str | None = None) -> dict:
    """job_meta, when the caller's level on the job is at least `need`: Forbidden when it only sees the job
    (naming `action`, "hold it", else what `need` allows), NotFound when not even that."""
    meta = job_meta(conn, principal, job_id)
    if LEVELS[meta["level"]] < LEVELS[need]:
        raise Forbidden(f"job {job_id} is not yours: only its owner, the managers of its project and admins may "
                        f"{action or _WHAT[need]}" + (" (members too, when the project's visibility is `project`)"
                                            if need == "read" else ""))
    return meta


def unseen(conn: apsw.Connection, principal, ids: list[int]) -> set[int]:
    """Those of the jobs `ids` that `principal` may not see (a job that does not exist among them)."""
    found = {r["id"]: r for r in rows(conn, "job_owners", ids=json.dumps(ids), user_id=principal.user_id)}
    return {job_id for job_id in ids if level(principal, found.get(job_id)) is None}


def submit_project(conn: apsw.Connection, principal, project: str | None) -> int:
    """The project a job is submitted to: the one named, else the user's only project, else `default`.

    Members may submit to their projects only (admins anywhere): Forbidden otherwise.
    """
    if project is not None:
        found = row(conn, "project_by_name", name=check_name(project, "project"))
        if found is None:
            if principal.admin:
                raise InvalidRequest(f"project: no project named {project!r}", code="unknown_project")
            raise Forbidden(f"user {principal.user} is not a member of project {project!r}")
        if not principal.admin and row(conn, "membership_role", user_id=principal.user_id,
                                       project_id=found["id"]) is None:
            raise Forbidden(f"user {principal.user} is not a member of project {project!r}")
        return found["id"]
    mine = rows(conn, "user_projects", user_id=principal.user_id)
    if principal.admin:
        return mine[0]["id"] if len(mine) == 1 else DEFAULT_PROJECT_ID
    if len(mine) == 1:
        return mine[0]["id"]
    if any(p["id"] == DEFAULT_PROJECT_ID for p in mine):
        return DEFAULT_PROJECT_ID
    if not mine:
        raise Forbidden(f"user {principal.user} is in no project: an admin adds it to one "
                        "(`gpulayer project add-member PROJECT USER`)")
    raise InvalidRequest(f"user {principal.user} is in projects {', '.join(p['name'] for p in mine)}: "
                         "name one with --project", code="project_required")


def submit(conn: apsw.Connection, principal, project: str | None, spec: ValidSpec, now: float) -> int:
    """jobs.submit, owned by the caller in the project it may submit to, at a priority it may ask for."""
    project_id = submit_project(conn, principal, project)
    check_priority(conn, principal, project_id, spec.priority)
    _check_dependencies(conn, principal, spec)
    access.check_named(conn, principal, referenced_digests(spec))
    return jobs.submit(conn, spec, now, principal.user_id or ADMIN_USER_ID, project_id)


def check_priority(conn: apsw.Connection, principal, project_id: int, priority: int) -> None:
    """A job's priority is at most its project's ceiling (max_priority), as Slurm lets users only lower
    theirs (--nice): Forbidden above it. Admins are not bound; managers are, and may raise the ceiling."""
    if principal.admin:
        return
    found = row(conn, "project_priority_ceiling", project_id=project_id)
    if found is not None and priority > found["max_priority"]:
        raise Forbidden(f"priority {priority} is above the ceiling of project {found['name']} "
                        f"(max_priority {found['max_priority']}): ask for {found['max_priority']} or less, or ask "
                        "its managers or an admin to raise it (`gpulayer project set "
                        f"{found['name']} --max-priority N`)", code="priority_above_ceiling",
                        max_priority=found["max_priority"])


def _check_dependencies(conn: apsw.Connection, principal, spec: ValidSpec) -> None:
    """Every job in `after` is one the caller may see (as for GET /v1/jobs/{id}): any other is answered as a
    job that does not exist, so `after` tells neither which ids exist nor how another's job ends."""
    ids = [dep.job for dep in spec.after]
    if not ids or principal.admin:
        return
    hidden_ids = unseen(conn, principal, ids)
    hidden = next((job_id for job_id in ids if job_id in hidden_ids), None)
    if hidden is not None:
        raise jobs.no_dependency(hidden)


# -- secrets: per project -------------------------------------------------------

def secret_project(conn: apsw.Connection, principal, project: str | None, manage: bool) -> int:
    """The project whose secrets the caller reads (any member) or sets (`manage`: managers, admins).

    No project named: the caller's only project, else `default`. NotFound for a project the caller is not in.
    """
    if project is None:
        mine = rows(conn, "user_projects", user_id=principal.user_id)
        found = mine[0] if len(mine) == 1 and not principal.admin else row(conn, "project_by_name", name=DEFAULT_PROJECT)
    else:
        found = row(conn, "project_by_name", name=check_name(project, "project"))
    if found is None:
        raise NotFound(f"no project {project!r}")
    if principal.admin:
        return found["id"]
    role = row(conn, "membership_role", user_id=principal.user_id, project_id=found["id"])
    if role is None:
        raise NotFound(f"no project {found['name']!r}")
    if manage and role["role"] != "manager":
        raise Forbidden(f"only the managers of project {found['name']} and admins may set or delete its secrets")
    return found["id"]


# -- users ----------------------------------------------------------------------

def _user_view(found: dict) -> dict:
    return {"name": found["name"], "admin": bool(found["admin"]), "max_running_jobs": found["max_running_jobs"],
            "created_at": found["created_at"], "projects": json.loads(found["projects"])}


def _user(conn: apsw.Connection, name: str) -> dict:
    found = row(conn, "user_by_name", name=name)
    if found is None or found["removed_at"] is not None:
        raise NotFound(f"no user {name!r}")
    return found


def _project(conn: apsw.Connection, name: str) -> dict:
    found = row(conn, "project_by_name", name=name)
    if found is None:
        raise NotFound(f"no project {name!r}")
    return found


def add_user(conn: apsw.Connection, name: str, admin: bool, projects: list[tuple[str, str]], max_running_jobs: int | None,
             now: float, reclaim: bool = False) -> int:
    """A new user in `projects` [(name, role)]; returns its id. With no project named, the user joins
    `default` as a member. Conflict when the name is taken, and when a removed user had it, unless `reclaim`:
    that user then comes back, with its jobs, logs and outputs (the name is the account).
    """
    removed = row(conn, "user_by_name", name=name)
    if removed is not None and removed["removed_at"] is not None and not reclaim:
        raise Conflict(f"user {name!r} was removed; adding the name again gives back its old account, its jobs, "
                       "logs and outputs included: say reclaim (`gpulayer user add --reclaim`) to do that, "
                       "or choose another name", code="user_removed")
    found = row(conn, "insert_user", name=name, admin=int(admin), max_running_jobs=max_running_jobs, now=now)
    if found is None:
        raise Conflict(f"there is already a user named {name!r}", code="user_exists")
    user_id = found["id"]
    for project, role in projects or [(DEFAULT_PROJECT, "member")]:
        row(conn, "put_membership", user_id=user_id, project_id=_project(conn, project)["id"], role=role)
    events.record(conn, now, "user_added", user=name, admin=admin, max_running_jobs=max_running_jobs,
                  **({"reclaimed": True} if removed is not None else {}),
                  projects=[{"project": p, "role": r} for p, r in projects or [(DEFAULT_PROJECT, "member")]])
    return user_id


def set_user(conn: apsw.Connection, name: str, changes: dict, now: float) -> None:
    """Change `admin` and/or `max_running_jobs` (null clears it)."""
    found = _user(conn, name)
    if found["id"] == ADMIN_USER_ID and changes.get("admin") is False:
        raise InvalidRequest("the first admin (user admin) stays an admin", code="first_admin")
    row(conn, "update_user", user_id=found["id"], admin=None if "admin" not in changes else int(changes["admin"]),
        set_limit=int("max_running_jobs" in changes), max_running_jobs=changes.get("max_running_jobs"))
    events.record(conn, now, "user_changed", user=name, **changes)


def remove_user(conn: apsw.Connection, name: str, now: float) -> list[str]:
    """Mark a user removed, out of every project, its client tokens revoked (its jobs stay its own); the jtis."""
    found = _user(conn, name)
    if found["id"] == ADMIN_USER_ID:
        raise InvalidRequest("the first admin (user admin) cannot be removed: it owns server init's token",
                             code="first_admin")
    row(conn, "remove_user", user_id=found["id"], now=now)
    row(conn, "remove_user_memberships", user_id=found["id"])
    revoked = [r["jti"] for r in rows(conn, "revoke_user_tokens", user_id=found["id"], now=now)]
    events.record(conn, now, "user_removed", user=name, tokens_revoked=revoked)
    return revoked


def list_users(conn: apsw.Connection, after: str = "", limit: int = -1) -> list[dict]:
    """Users by name: after `after`, at most `limit` (-1: all)."""
    return [_user_view(u) for u in rows(conn, "list_users", after=after, limit=limit)]


def get_user(conn: apsw.Connection, name: str) -> dict:
    return next(u for u in list_users(conn) if u["name"] == _user(conn, name)["name"])


def whoami(conn: apsw.Connection, principal) -> dict:
    """The caller: its user, whether an admin, its projects and roles, and its token."""
    found = row(conn, "user_by_id", user_id=principal.user_id)
    return {"user": principal.user, "admin": principal.admin,
            "max_running_jobs": found["max_running_jobs"] if found else None,
            "projects": [{"project": p["name"], "role": p["role"]}
                         for p in rows(conn, "user_projects", user_id=principal.user_id)],
            "token": {"jti": principal.jti, "name": principal.name}}


# -- projects -------------------------------------------------------------------

def _project_view(found: dict) -> dict:
    return {"name": found["name"], "visibility": found["visibility"], "gpus": found["gpu_quota"],
            "borrow": found["gpu_borrow"], "weight": found["weight"], "max_priority": found["max_priority"],
            "idle_timeout_seconds": found["idle_timeout_s"], "idle_below_pct": found["idle_below_pct"],
            "idle_action": found["idle_action"], "created_at": found["created_at"],
            "members": json.loads(found["members"])}


def add_project(conn: apsw.Connection, body: dict, now: float) -> None:
    if row(conn, "project_by_name", name=body["name"]) is not None:
        raise Conflict(f"there is already a project named {body['name']!r}", code="project_exists")
    added = row(conn, "insert_project", name=body["name"], visibility=body.get("visibility") or "private",
                gpu_quota=body.get("gpus"), gpu_borrow=body.get("borrow") or 0, weight=body.get("weight"),
                max_priority=body.get("max_priority") or 0, now=now)
    if any(body.get(k) is not None for k in ("idle_timeout_seconds", "idle_below_pct", "idle_action")):
        _set_idle(conn, added["id"] if added else 0, body)
    events.record(conn, now, "project_added", **body)


def may_change_project(conn: apsw.Connection, principal, name: str, changes: dict) -> None:
    """Admins change any of a project's settings; its managers only its priority ceiling (max_priority, their
    lever on what their members may ask for). Forbidden otherwise; NotFound for a project the caller is not in."""
    if principal.admin:
        return
    if set(changes) - {"max_priority"}:
        raise Forbidden("only an admin may change projects (their managers may set max_priority)")
    found = _project(conn, name)
    role = row(conn, "membership_role", user_id=principal.user_id, project_id=found["id"])
    if role is None:
        raise NotFound(f"no project {name!r}")
    if role["role"] != "manager":
        raise Forbidden(f"only the managers of project {name} and admins may set its max_priority")


def set_project(conn: apsw.Connection, name: str, changes: dict, now: float) -> None:
    found = _project(conn, name)
    row(conn, "update_project", project_id=found["id"], visibility=changes.get("visibility"),
        max_priority=changes.get("max_priority"),
        gpu_borrow=changes.get("borrow"), set_quota=int("gpus" in changes), gpu_quota=changes.get("gpus"),
        set_weight=int("weight" in changes), weight=changes.get("weight"), **_idle_params(changes))
    events.record(conn, now, "project_changed", project=name, **changes)


def _set_idle(conn: apsw.Connection, project_id: int, changes: dict) -> None:
    """The idle policy settings given in `changes` (docs/teams.md; None clears one), the others kept."""
    row(conn, "update_project", project_id=project_id, visibility=None, max_priority=None, gpu_borrow=None,
        set_quota=0, gpu_quota=None, set_weight=0, weight=None, **_idle_params(changes))


def _idle_params(changes: dict) -> dict:
    """update_project's idle parameters: those given in `changes` set (None clears), the others kept."""
    return dict(set_idle_timeout=int("idle_timeout_seconds" in changes),
                idle_timeout_s=changes.get("idle_timeout_seconds"),
                set_idle_below=int("idle_below_pct" in changes), idle_below_pct=changes.get("idle_below_pct"),
                set_idle_action=int("idle_action" in changes), idle_action=changes.get("idle_action"))


def remove_project(conn: apsw.Connection, name: str, now: float) -> None:
    """Remove a project with no job left to end: its memberships and secrets go too."""
    found = _project(conn, name)
    if found["id"] == DEFAULT_PROJECT_ID:
        raise InvalidRequest("the project default cannot be removed", code="default_project")
    active = one(conn, "project_active_jobs", project_id=found["id"])["n"]
    if active:
        raise Conflict(f"project {name} has {plural(active, 'job')} not ended yet: cancel them or wait",
                       code="project_busy")
    conn.execute(QUERIES["name_project_usage"], {"project_id": found["id"], "name": name})
    row(conn, "delete_project_memberships", project_id=found["id"])
    row(conn, "delete_project_secrets", project_id=found["id"])
    row(conn, "delete_project", project_id=found["id"])
    events.record(conn, now, "project_removed", project=name)


def list_projects(conn: apsw.Connection, principal, after: str = "", limit: int = -1) -> list[dict]:
    """Every project for an admin; the caller's own otherwise; by name, after `after`, at most `limit` (-1: all)."""
    return [_project_view(p) for p in rows(conn, "list_projects", user_id=None if principal.admin else principal.user_id,
                                           after=after, limit=limit)]


def get_project(conn: apsw.Connection, principal, name: str) -> dict:
    found = next((p for p in list_projects(conn, principal) if p["name"] == name), None)
    if found is None:
        raise NotFound(f"no project {name!r}")
    return found


def _may_manage_members(conn: apsw.Connection, principal, project: dict) -> None:
    if principal.admin:
        return
    role = row(conn, "membership_role", user_id=principal.user_id, project_id=project["id"])
    if role is None:
        raise NotFound(f"no project {project['name']!r}")
    if role["role"] != "manager":
        raise Forbidden(f"only the managers of project {project['name']} and admins may change its members")


def put_member(conn: apsw.Connection, principal, project: str, user: str, role: str, now: float) -> None:
    found = _project(conn, project)
    _may_manage_members(conn, principal, found)
    row(conn, "put_membership", user_id=_user(conn, user)["id"], project_id=found["id"], role=role)
    events.record(conn, now, "member_set", project=project, user=user, role=role)


def remove_member(conn: apsw.Connection, principal, project: str, user: str, now: float) -> None:
    found = _project(conn, project)
    _may_manage_members(conn, principal, found)
    if row(conn, "delete_membership", user_id=_user(conn, user)["id"], project_id=found["id"]) is None:
        raise NotFound(f"user {user} is not in project {project}")
    events.record(conn, now, "member_removed", project=project, user=user)
