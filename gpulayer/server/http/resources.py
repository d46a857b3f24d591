"""Falcon resources for /v1: parse, call the scheduler, render. No SQL, no scheduling rules.

Each resource names who may call it in `auth` (token kinds); the auth
middleware in app.py enforces it before any responder runs.
"""
from __future__ import annotations

import functools

import falcon

from gpulayer.protocol import JOB_STATES
from gpulayer.server.config import PROTOCOL
from gpulayer.server.errors import InvalidRequest, NotFound
from gpulayer.server.http import paging, wire
from gpulayer.server.notify import targets
from gpulayer.server.provisioning import config as provisioners_json
from gpulayer.server.provisioning import loop as provisioner
from gpulayer.server.scheduler import checkpoints, secrets, teams, tokens, views, workers
from gpulayer.server.validators import check_digest

LOG_RETRY_AFTER_S = 1.0
MAX_INDEX = 1 << 62   # `index` (an array's element, a replica, a rank) in a job's URLs and its cancel
MAX_NAME_GLOB = 256   # `GET /v1/jobs?name=`
MAX_TIME = 1e11       # `GET /v1/jobs?since=` (Unix seconds)


class Resource:
    """Base: holds the injected dependencies."""

    auth: tuple[str, ...] = ("client",)

    def __init__(self, deps):
        self.deps = deps
        self.sched = deps.scheduler
        self.store = deps.store

    def shown(self, req, job: dict) -> dict:
        """A rendered Job as the wire carries it: its ingress URL and its start-time estimate."""
        return self.sched.estimates.apply(with_ingress_url(req, job))


class Health(Resource):
    auth = ()

    def on_get(self, req, resp):
        """200 `ok: true` while writes can succeed; else 503 `ok: false` with the writer's and the disk's state."""
        health = self.deps.store.health()
        # Replication lagging or down leaves writes possible: `degraded`, still 200 (not down).
        extra = {}
        if self.deps.replication is not None:
            replication = self.deps.replication()
            extra = {"degraded": replication["degraded"], "replication": replication}
        restored = self.sched.restored   # a restored plane, while its reconciliation rules apply
        if restored is not None and restored.active():
            extra["reconcile"] = restored.describe()
        if health["ok"]:
            resp.media = {"ok": True, "protocol": PROTOCOL, **extra}
            return
        resp.status = falcon.HTTP_503
        resp.media = {"protocol": PROTOCOL, **health, **extra}


class CACert(Resource):
    """The control plane's CA certificate (public), for `join --ca-fingerprint` pinning."""

    auth = ()

    def on_get(self, req, resp):
        if not self.deps.ca_file:
            raise NotFound("this control plane has no CA of its own (it serves plain HTTP or an outside certificate)")
        resp.content_type = "application/x-pem-file"
        resp.text = self.deps.ca_file.read_text()


class SshHostCA(Resource):
    """The public key of the control plane's SSH host CA (public), for `gpulayer ssh-config`'s known_hosts."""

    auth = ()

    def on_get(self, req, resp):
        from gpulayer.server.relay import sshca

        resp.content_type = "text/plain"
        resp.text = sshca.for_home(self.deps.config.home).public_line() + "\n"


# -- clients -----------------------------------------------------------------

def _job_access(req, resp, resource, params, need: str, action: str | None = None):
    """Before a /v1/jobs/{id} action: 404 unless the caller may see the job, 403 short of `need` (teams.LEVELS),
    naming `action` ("hold it"); the job's owner, project and the caller's level kept in req.context.job_meta."""
    req.context.job_meta = resource.store.read(teams.check_job, req.context.principal, params["job_id"], need,
                                               action)


def _still_allowed(req, resource, job_id: int, need: str):
    """A parked /v1/jobs/{id} request's check after each wake-up: its caller is still authenticated (401 once
    removed or revoked) and, when its principal was read again, may still `need` the job (404, 403 once out of
    its project)."""
    seen = [req.context.principal]

    def check() -> None:
        principal = req.context.recheck()
        if principal is not seen[0]:   # a fresh lookup (after an invalidation or the cache's TTL)
            resource.store.read(teams.check_job, principal, job_id, need)
            seen[0] = principal
    return check


class Jobs(Resource):
    def on_post(self, req, resp):
        body = wire.read_json(req)
        project = body.pop("project", None)  # beside the JobSpec: which project the job counts against
        mailbox = targets.parse_mailbox(body.pop("mail", None), smtp=bool(self.deps.config.smtp_url))  # beside it too
        job_id = self.sched.submit(body, req.context.principal, project, mailbox)  # the job and its mailbox: one write
        resp.status = falcon.HTTP_201
        resp.location = f"/v1/jobs/{job_id}"
        resp.media = self.shown(req, self.store.read(views.rendered_for, req.context.principal, job_id))

    def on_get(self, req, resp):
        state, name = req.get_param("state"), req.get_param("name")
        if state is not None and state not in JOB_STATES:
            raise InvalidRequest(f"state: must be one of {', '.join(JOB_STATES)}")
        if name is not None and not 0 < len(name) <= MAX_NAME_GLOB:
            raise InvalidRequest(f"name: must be a glob of 1-{MAX_NAME_GLOB} characters (sweep-*)")
        filters = {"state": state, "name": name, "since": wire.query_float(req, "since", None, 0.0, MAX_TIME),
                   "user": req.get_param("user"), "project": req.get_param("project"),
                   "all": req.get_param_as_bool("all", default=False)}
        limit, before = paging.params(req, "/v1/jobs")
        found, more = self.store.read(views.listing, req.context.principal, filters, limit, before)
        resp.media = paging.answer("jobs", [self.sched.estimates.apply(job) for job in found], more, "id")

    def on_post_estimate(self, req, resp):
        """What-if: when a job of this body (as POST /v1/jobs takes it) would start if the caller submitted it
        now; nothing is submitted. The same 4xx as a submit."""
        body = wire.read_json(req)
        project = body.pop("project", None)
        targets.parse_mailbox(body.pop("mail", None), smtp=bool(self.deps.config.smtp_url))  # checked as submit does
        found = self.sched.estimate(body, req.context.principal, project)
        resp.media = {"estimated_start_at": found.at, "estimate_reason": found.reason, "workers": list(found.workers),
                      "runnable": not found.never, "now": self.deps.clock()}

def with_ingress_url(req, job: dict) -> dict:
    """`job` with its `ingress_url`: where the control plane proxies to the service (`service.ingress`), on the
    address the caller used; null for a job without one (docs/access.md, "Ingress")."""
    service = (job.get("spec") or {}).get("service") or {}
    job["ingress_url"] = f"{req.prefix}/ingress/{job['id']}" if service.get("ingress") else None
    return job


class Job(Resource):
    """/v1/jobs/{id} and its actions: each checks the caller's right to the job first (404, 403), then reads."""

    def on_get(self, req, resp, job_id):
        try:
            index = wire.query_int(req, "index", None, 0, MAX_INDEX)
        except InvalidRequest:  # a job the caller may not see is 404, whatever its query (ids do not leak)
            self.store.read(teams.check_job, req.context.principal, job_id, "see")
            raise
        resp.media = self.shown(req, self.store.read(views.job, req.context.principal, job_id, index))

    @falcon.before(_job_access, "manage", "cancel it")
    def on_post_cancel(self, req, resp, job_id):
        index = wire.cancel_index(wire.read_json(req, allow_empty=True))
        self.sched.cancel(job_id, index)
        resp.media = self.shown(req, self.store.read(views.job, req.context.principal, job_id, index))

    @falcon.before(_job_access, "manage", "change it")
    def on_patch(self, req, resp, job_id):
        changes = wire.job_update(wire.read_json(req))
        self.sched.update_job(req.context.principal, job_id, changes)
        resp.media = self.sched.estimates.apply(self.store.read(views.job, req.context.principal, job_id))

    @falcon.before(_job_access, "manage", "hold it")
    def on_post_hold(self, req, resp, job_id):
        wire.empty_body(wire.read_json(req, allow_empty=True), "hold")
        self.sched.hold(job_id)
        resp.media = self.sched.estimates.apply(self.store.read(views.job, req.context.principal, job_id))

    @falcon.before(_job_access, "manage", "release it")
    def on_post_release(self, req, resp, job_id):
        wire.empty_body(wire.read_json(req, allow_empty=True), "release")
        self.sched.release(job_id)
        resp.media = self.sched.estimates.apply(self.store.read(views.job, req.context.principal, job_id))

    @falcon.before(_job_access, "manage", "requeue it")
    def on_post_requeue(self, req, resp, job_id):
        index, hold = wire.requeue(wire.read_json(req, allow_empty=True))
        self.sched.requeue(job_id, index, hold)
        resp.media = self.sched.estimates.apply(self.store.read(views.job, req.context.principal, job_id))

    @falcon.before(_job_access, "read")
    def on_get_logs(self, req, resp, job_id):
        limit, after = paging.params(req, "/v1/jobs/{job_id}/logs")
        wait_s = wire.query_float(req, "wait_s", 0.0, 0.0, 30.0)
        index = wire.query_int(req, "index", None, 0, MAX_INDEX)
        lines, ended, waited = self.sched.wait_for_logs(job_id, after, limit, wait_s, index,  # 404: no element
                                                        _still_allowed(req, self, job_id, "read"))
        resp.media = {"lines": lines, "next": lines[-1]["seq"] if lines else after, "ended": ended}
        if not waited:  # too many followers parked: this one polls again after a pause
            resp.media["retry_after_s"] = LOG_RETRY_AFTER_S

    @falcon.before(_job_access, "see")
    def on_get_events(self, req, resp, job_id):
        limit, after = paging.params(req, "/v1/jobs/{job_id}/events")
        found, more = self.store.read(views.events_seen, req.context.principal, job_id, after, limit,
                                      req.context.job_meta["level"])
        resp.media = paging.answer("events", found, more, "seq")

    @falcon.before(_job_access, "read")
    def on_get_endpoints(self, req, resp, job_id):
        resp.media = self.store.read(views.endpoints, job_id)

    @falcon.before(_job_access, "read")
    def on_get_outputs(self, req, resp, job_id):
        index = wire.query_int(req, "index", None, 0, MAX_INDEX)
        resp.media = self.store.read(views.outputs, job_id, index)  # 404 for no such element

    @falcon.before(_job_access, "read")
    def on_get_gpus(self, req, resp, job_id):
        """Its running tasks' GPUs with their newest utilization and memory (Slurm's sstat; gpu_samples.py)."""
        resp.media = self.sched.job_gpus(job_id, wire.query_int(req, "index", None, 0, MAX_INDEX))


class JobCheckpoints(Resource):
    """GET /v1/jobs/{id}/checkpoints (a page of them, oldest first) and /v1/jobs/{id}/checkpoints/{cid} (one,
    with its files): the `read` level, as outputs."""

    @falcon.before(_job_access, "read")
    def on_get(self, req, resp, job_id):
        limit, after = paging.params(req, "/v1/jobs/{job_id}/checkpoints")
        index = wire.query_int(req, "index", None, 0, MAX_INDEX)
        found, more = paging.cut(self.store.read(checkpoints.listing, job_id, index, after, limit + 1), limit)
        resp.media = paging.answer("checkpoints", found, more, "id")

    @falcon.before(_job_access, "read")
    def on_get_one(self, req, resp, job_id, checkpoint_id):
        resp.media = self.store.read(checkpoints.get, job_id, None, None, checkpoint_id)


class Workers(Resource):
    def on_get(self, req, resp):
        include_gone = req.get_param_as_bool("all", default=False)
        limit, after = paging.params(req, "/v1/workers")
        found, more = paging.cut(self.store.read(workers.listing, include_gone, after, limit + 1), limit)
        resp.media = paging.answer("workers", found, more, "id")


class WorkerControl(Resource):
    """POST /v1/workers/{worker}/{cordon,drain,uncordon} and .../gpus/{index}/reset: `worker` is an id or a name.

    Admins only (AuthMiddleware reads `admin_only`).
    """

    admin_only = True

    def on_post_cordon(self, req, resp, worker):
        body = wire.cordon(wire.read_json(req), drain=False)
        resp.media = self.sched.cordon(worker, body["reason"])

    def on_post_drain(self, req, resp, worker):
        body = wire.cordon(wire.read_json(req), drain=True)
        resp.media = self.sched.cordon(worker, body["reason"], drain=True, timeout_s=body["timeout_s"])

    def on_post_uncordon(self, req, resp, worker):
        wire.read_json(req, allow_empty=True)
        resp.media = self.sched.uncordon(worker)

    def on_post_gpu_reset(self, req, resp, worker, index):
        wire.read_json(req, allow_empty=True)
        resp.media = self.sched.gpu_reset(worker, index)


class Provisioners(Resource):
    """Provisioning (Slurm, Kubernetes): the configured provisioners and their recent requests."""

    def on_get(self, req, resp):
        limit, before = paging.params(req, "/v1/provisioners")
        found, more = paging.cut(self.store.read(provisioner.requests_listing, limit + 1, before), limit)
        resp.media = paging.answer("requests", found, more, "id",
                                   provisioners=provisioners_json.describe(self.deps.provisioners))


class Tokens(Resource):
    """Join and metrics tokens: admins. A client token: an admin for any user, a user for itself."""

    def on_post(self, req, resp):
        body = wire.token_request(wire.read_json(req))
        me = req.context.principal
        if body["kind"] == "client":
            body["user"] = body["user"] or me.user
            body["name"] = body["name"] or body["user"] or "client"  # no name given: the user's
            if body["user"] != me.user:
                teams.require_admin(me, "create a client token for another user")
        else:
            teams.require_admin(me, f"create {body['kind']} tokens")
        resp.status = falcon.HTTP_201
        resp.media = self.sched.mint_token(**body)

    def on_get(self, req, resp):
        me = req.context.principal  # an admin lists every token, a user its own client tokens
        limit, after = paging.params(req, "/v1/tokens")
        found, more = paging.cut(self.store.read(tokens.listing, None if me.admin else me.user_id, after, limit + 1),
                                 limit)
        resp.media = paging.answer("tokens", found, more, "n")
        for token in found:
            del token["n"]  # the page's cursor (its place in minting order), `next` alone on the wire


class Token(Resource):
    def on_post_revoke(self, req, resp, jti):
        me = req.context.principal
        if not me.admin:  # a user revokes its own client tokens; other tokens do not exist for it
            found = self.store.read(tokens.get, jti)
            if found is None or found.get("user_id") != me.user_id:
                raise NotFound(f"no token with jti {jti!r}")
        resp.media = self.sched.revoke_token(jti)


class Secrets(Resource):
    """A project's secrets (`?project=`, else the caller's only project or default): its members list them."""

    def on_get(self, req, resp):
        project_id = self.store.read(teams.secret_project, req.context.principal, req.get_param("project"), False)
        limit, after = paging.params(req, "/v1/secrets")
        found, more = paging.cut(self.store.read(secrets.listing, project_id, after, limit + 1), limit)
        resp.media = paging.answer("secrets", found, more, "name")


class Secret(Resource):
    """Set or delete a project's secret: its managers and admins."""

    def on_put(self, req, resp, name):
        body = wire.read_json(req)
        unknown = set(body) - {"value", "labels"}
        if unknown:
            raise InvalidRequest(f"unknown field {sorted(unknown)[0]}")
        project_id = self.store.read(teams.secret_project, req.context.principal, req.get_param("project"), True)
        resp.media = self.sched.set_secret(name, body.get("value"), body.get("labels"), project_id)

    def on_delete(self, req, resp, name):
        project_id = self.store.read(teams.secret_project, req.context.principal, req.get_param("project"), True)
        self.sched.delete_secret(name, project_id)
        resp.media = {"ok": True}


# -- teams -------------------------------------------------------------------

class WhoAmI(Resource):
    def on_get(self, req, resp):
        resp.media = self.store.read(teams.whoami, req.context.principal)


class Usage(Resource):
    """The usage ledger summed (`gpulayer usage`): an admin reads everyone's; a user their own runs and
    those of the projects they manage."""

    def on_get(self, req, resp):
        limit, after = paging.params(req, "/v1/usage")
        found = self.sched.usage(req.context.principal, req.get_param("by") or "user", req.get_param("since"),
                                 offset=after, limit=limit + 1)
        found["rows"], more = paging.cut(found["rows"], limit)
        found["next"] = after + limit if more else None  # the rows are sums: a page is where it starts
        resp.media = found


class Users(Resource):
    """Admins add and list users; adding one answers its first client token, once."""

    def on_get(self, req, resp):
        teams.require_admin(req.context.principal, "list users")
        limit, after = paging.params(req, "/v1/users")
        found, more = paging.cut(self.store.read(teams.list_users, after, limit + 1), limit)
        resp.media = paging.answer("users", found, more, "name")

    def on_post(self, req, resp):
        teams.require_admin(req.context.principal, "add users")
        body = wire.user_request(wire.read_json(req))
        self.sched.change_teams(functools.partial(teams.add_user, reclaim=body["reclaim"]), body["name"],
                                body["admin"], body["projects"], body["max_running_jobs"])
        token = self.sched.mint_token(name=body["name"], labels={}, expires_in_s=None, kind="client",
                                      user=body["name"])
        resp.status = falcon.HTTP_201
        resp.media = {**self.store.read(teams.get_user, body["name"]), "token": token["token"], "jti": token["jti"]}


class User(Resource):
    def on_get(self, req, resp, name):
        teams.require_admin(req.context.principal, "read users")
        resp.media = self.store.read(teams.get_user, name)

    def on_patch(self, req, resp, name):
        teams.require_admin(req.context.principal, "change users")
        self.sched.change_teams(teams.set_user, name, wire.user_update(wire.read_json(req)))
        resp.media = self.store.read(teams.get_user, name)

    def on_delete(self, req, resp, name):
        teams.require_admin(req.context.principal, "remove users")
        revoked = self.sched.change_teams(teams.remove_user, name)
        resp.media = {"ok": True, "tokens_revoked": revoked}


class Projects(Resource):
    """Everyone lists the projects it is in (admins: all); admins add them."""

    def on_get(self, req, resp):
        limit, after = paging.params(req, "/v1/projects")
        found, more = paging.cut(self.store.read(teams.list_projects, req.context.principal, after, limit + 1), limit)
        resp.media = paging.answer("projects", found, more, "name")

    def on_post(self, req, resp):
        teams.require_admin(req.context.principal, "add projects")
        body = wire.project_request(wire.read_json(req), create=True)
        self.sched.change_teams(teams.add_project, body)
        resp.status = falcon.HTTP_201
        resp.media = self.store.read(teams.get_project, req.context.principal, body["name"])


class Project(Resource):
    def on_get(self, req, resp, name):
        resp.media = self.store.read(teams.get_project, req.context.principal, name)

    def on_patch(self, req, resp, name):
        changes = wire.project_request(wire.read_json(req), create=False)
        self.store.read(teams.may_change_project, req.context.principal, name, changes)
        self.sched.change_teams(teams.set_project, name, changes)
        resp.media = self.store.read(teams.get_project, req.context.principal, name)

    def on_delete(self, req, resp, name):
        teams.require_admin(req.context.principal, "remove projects")
        self.sched.change_teams(teams.remove_project, name)
        resp.media = {"ok": True}


class Member(Resource):
    """A project's members: its managers and admins add, change and remove them."""

    def on_put(self, req, resp, name, user):
        role = wire.membership_request(wire.read_json(req, allow_empty=True))
        self.sched.change_teams(teams.put_member, req.context.principal, name, user, role)
        resp.media = self.store.read(teams.get_project, req.context.principal, name)

    def on_delete(self, req, resp, name, user):
        self.sched.change_teams(teams.remove_member, req.context.principal, name, user)
        resp.media = {"ok": True}


# -- artifacts ---------------------------------------------------------------

class Artifact(Resource):
    auth = ("client", "worker")

    def on_put(self, req, resp, digest):
        check_digest(digest)
        # Without Content-Length (Transfer-Encoding: chunked) the server's input stream ends
        # with the last chunk; falcon's bounded stream would read nothing at all.
        stream = req.bounded_stream if req.content_length is not None else req.stream
        size = self.sched.put_artifact(req.context.principal, digest, stream, req.content_length)
        resp.status = falcon.HTTP_201
        resp.media = {"digest": digest, "size": size}

    def on_get(self, req, resp, digest):
        check_digest(digest)
        self.sched.check_artifact_read(req.context.principal, digest)
        try:
            fh, size = self.deps.artifacts.open(digest)  # the size of what is open, even if swept meanwhile
        except FileNotFoundError:
            raise NotFound(f"no artifact {digest}") from None
        resp.content_type = "application/octet-stream"
        resp.content_length = size
        resp.stream = fh

    def on_head(self, req, resp, digest):
        check_digest(digest)
        # 404 also for what the caller may not read: it uploads the bytes rather than name them (access.py).
        readable = self.sched.check_artifact_probe(req.context.principal, digest)
        size = self.deps.artifacts.size(digest) if readable else None
        if size is None:
            resp.status = falcon.HTTP_404
            return
        resp.content_type = "application/octet-stream"
        resp.content_length = size

