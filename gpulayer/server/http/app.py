"""The /v1 Falcon WSGI app: routes, the protocol header, auth, one error shape."""
from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import falcon

from gpulayer.protocol import PROTOCOL_HEADER
from gpulayer.server.config import PROTOCOL, ControlPlaneConfig
from gpulayer.server.errors import BodyIncomplete, Forbidden, GpulayerError, ProtocolMismatch, Unauthorized, peer_gone
from gpulayer.server.http import notify_routes, relay_routes, resources, service_routes, wire, worker_routes
from gpulayer.server import upkeep as upkeep_
from gpulayer.server.http.metrics import Metrics, MetricsResource, ReplicationCollector, UpkeepCollector
from gpulayer.server.store.artifacts import ArtifactStore
from gpulayer.server.scheduler import events
from gpulayer.server.scheduler.core import Scheduler
from gpulayer.server.security import auth
from gpulayer.server.store.db import Store, domain_error
from gpulayer.server.store.queries import QUERIES

log = logging.getLogger("gpulayer.server.process")
HEADER = PROTOCOL_HEADER
INT64_MAX = (1 << 63) - 1


@dataclass
class Deps:
    """What resources need, wired once: no domain work here (that is the scheduler's)."""

    config: ControlPlaneConfig
    store: Store
    scheduler: Scheduler
    auth: auth.Authenticator
    artifacts: ArtifactStore
    ca_file: Path | None = None
    clock: Callable[[], float] = time.time
    provisioners: list = field(default_factory=list)  # provisioning.loop.Provisioner, from provisioners.json
    replication: Callable[[], dict] | None = None   # the Replicator's status, when `--replicate` is on
    upkeep: upkeep_.Stats = field(default_factory=upkeep_.Stats)   # each upkeep job's runs (server/upkeep.py)


class ProtocolMiddleware:
    """Every answer says `X-GpuLayer-Protocol: 1`; another version is refused with 426."""

    def __init__(self, deps: Deps):
        self.deps = deps

    def process_request(self, req, resp):
        resp.set_header(HEADER, str(PROTOCOL))
        sent = req.get_header(HEADER)
        worker_route = req.path.startswith("/v1/worker/") or req.path == "/v1/workers/register"
        if sent is None and not worker_route:
            return
        if sent != str(PROTOCOL):
            if req.path == "/v1/workers/register":
                self._note_needs_upgrade(req, sent)
            raise ProtocolMismatch(
                f"this control plane speaks protocol {PROTOCOL}, the request "
                + (f"speaks {sent}" if sent is not None else f"sent no {HEADER} header")
                + ": upgrade the control plane first, then the workers",
                protocol=PROTOCOL, client_protocol=sent)

    def _note_needs_upgrade(self, req, sent) -> None:
        """List a worker with a valid join token as needs_upgrade (best effort, never fails the 426)."""
        try:
            principal = self.deps.auth.authenticate(_bearer(req), self.deps.clock())
            if principal.kind != "join":
                return
            body = wire.read_json(req, allow_empty=True)
            name = str(body.get("name") or "unknown")[:256] if isinstance(body, dict) else "unknown"
            version = str(body.get("version"))[:64] if isinstance(body, dict) and body.get("version") else None
            self.deps.scheduler.needs_upgrade(name=name, version=version, protocol=sent, token_jti=principal.jti)
        except Exception:  # noqa: BLE001 - the 426 matters, the listing is a courtesy
            log.debug("needs_upgrade_not_recorded", exc_info=True)


def _bearer(req) -> str | None:
    header = req.get_header("Authorization")
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


class AuthMiddleware:
    """Checks the bearer token against the resource's `auth` kinds: 401 unknown, 403 wrong kind (or not an
    admin where the resource is `admin_only`). Names the caller as the actor of the events it causes."""

    def __init__(self, deps: Deps):
        self.deps = deps

    def process_request(self, req, resp):
        events.ACTOR.set("system")  # a pooled thread served someone else before

    def process_resource(self, req, resp, resource, params):
        kinds = getattr(resource, "auth", ("client",))
        if resource is None or not kinds:
            return
        req.context.principal = self._authorize(req, resource, kinds)
        events.ACTOR.set(req.context.principal.actor)
        # A parked request (log follow, acquire) calls this after each wake-up: 401 once its caller was
        # removed or revoked while it waited (auth.invalidate() wakes it).
        req.context.recheck = functools.partial(self._authorize, req, resource, kinds)

    def _authorize(self, req, resource, kinds):
        principal = self.deps.auth.authenticate(_bearer(req), self.deps.clock())
        if principal.kind == "worker" and principal.worker_state == "gone" \
                and not getattr(resource, "allow_gone", False):
            raise Unauthorized("this worker session has ended (deregistered or revoked)")
        if principal.kind not in kinds:
            raise Forbidden(f"a {principal.kind} token cannot call {req.method} {req.path}")
        if getattr(resource, "admin_only", False) and not principal.admin:
            raise Forbidden(f"only an admin may call {req.method} {req.path}")
        return principal


def _error_handler(req, resp, ex, params):
    resp.status = ex.status
    resp.media = ex.to_dict()
    resp.set_header(HEADER, str(PROTOCOL))


def _http_error_serializer(req, resp, exc: falcon.HTTPError):
    code = (exc.title or "error").lower().replace(" ", "_")
    resp.content_type = falcon.MEDIA_JSON
    resp.media = {"error": {"code": code, "message": exc.description or exc.title or "error"}}
    resp.set_header(HEADER, str(PROTOCOL))


def _unexpected(req, resp, ex, params):
    if isinstance(ex, falcon.HTTPError):
        raise ex
    if peer_gone(ex):  # the client went away mid-request: nobody reads the answer, no traceback
        log.debug("request_peer_gone method=%s path=%s error=%r", req.method, req.path, ex)
        return _error_handler(req, resp, BodyIncomplete(f"the connection failed: {ex}"), params)
    mapped = domain_error(ex)  # a full disk: 507; out of file descriptors, writer busy: 503
    if mapped is not None:
        log.warning("request_refused method=%s path=%s code=%s error=%r", req.method, req.path, mapped.code, ex)
        return _error_handler(req, resp, mapped, params)
    log.exception("request_failed method=%s path=%s", req.method, req.path)
    resp.status = falcon.HTTP_500
    resp.media = {"error": {"code": "internal_error", "message": "the control plane hit an unexpected error; "
                                                                  "see its log"}}
    resp.set_header(HEADER, str(PROTOCOL))


ROUTES = [
    ("/v1/health", resources.Health, None),
    ("/v1/ca.pem", resources.CACert, None),
    ("/v1/ssh-host-ca.pub", resources.SshHostCA, None),
    ("/v1/workers/register", worker_routes.Register, None),
    ("/v1/worker/heartbeat", worker_routes.Heartbeat, None),
    ("/v1/worker/acquire", worker_routes.Acquire, None),
    ("/v1/worker/deregister", worker_routes.Deregister, None),
    ("/v1/worker/relay", relay_routes.AgentRelay, None),
    ("/v1/worker/tasks/{task_id:int}/start", worker_routes.WorkerTask, "start"),
    ("/v1/worker/tasks/{task_id:int}/logs", worker_routes.WorkerTask, "logs"),
    ("/v1/worker/tasks/{task_id:int}/rendezvous", worker_routes.WorkerTask, "rendezvous"),
    ("/v1/worker/tasks/{task_id:int}/finish", worker_routes.WorkerTask, "finish"),
    ("/v1/worker/finish-many", worker_routes.FinishMany, None),
    ("/v1/worker/checkpoint", worker_routes.WorkerCheckpoint, None),
    ("/v1/jobs", resources.Jobs, None),
    ("/v1/jobs/estimate", resources.Jobs, "estimate"),
    ("/v1/jobs/{job_id:int}", resources.Job, None),
    ("/v1/jobs/{job_id:int}/relay", relay_routes.JobRelay, None),
    ("/v1/jobs/{job_id:int}/cancel", resources.Job, "cancel"),
    ("/v1/jobs/{job_id:int}/hold", resources.Job, "hold"),
    ("/v1/jobs/{job_id:int}/release", resources.Job, "release"),
    ("/v1/jobs/{job_id:int}/requeue", resources.Job, "requeue"),
    ("/v1/jobs/{job_id:int}/logs", resources.Job, "logs"),
    ("/v1/jobs/{job_id:int}/events", resources.Job, "events"),
    ("/v1/jobs/{job_id:int}/endpoints", resources.Job, "endpoints"),
    ("/v1/jobs/{job_id:int}/outputs", resources.Job, "outputs"),
    ("/v1/jobs/{job_id:int}/gpus", resources.Job, "gpus"),
    ("/v1/jobs/{job_id:int}/service", service_routes.Service, None),
    ("/v1/jobs/{job_id:int}/service/promote", service_routes.Service, "promote"),
    ("/v1/jobs/{job_id:int}/service/rollback", service_routes.Service, "rollback"),
    ("/v1/jobs/{job_id:int}/checkpoints", resources.JobCheckpoints, None),
    ("/v1/jobs/{job_id:int}/checkpoints/{checkpoint_id:int}", resources.JobCheckpoints, "one"),
    ("/v1/workers", resources.Workers, None),
    ("/v1/workers/{worker}/cordon", resources.WorkerControl, "cordon"),
    ("/v1/workers/{worker}/drain", resources.WorkerControl, "drain"),
    ("/v1/workers/{worker}/uncordon", resources.WorkerControl, "uncordon"),
    ("/v1/workers/{worker}/gpus/{index:int}/reset", resources.WorkerControl, "gpu_reset"),
    ("/v1/provisioners", resources.Provisioners, None),
    ("/v1/whoami", resources.WhoAmI, None),
    ("/v1/usage", resources.Usage, None),
    ("/v1/users", resources.Users, None),
    ("/v1/users/{name}", resources.User, None),
    ("/v1/projects", resources.Projects, None),
    ("/v1/projects/{name}", resources.Project, None),
    ("/v1/projects/{name}/members/{user}", resources.Member, None),
    ("/v1/tokens", resources.Tokens, None),
    ("/v1/tokens/{jti}/revoke", resources.Token, "revoke"),
    ("/v1/secrets", resources.Secrets, None),
    ("/v1/secrets/{name}", resources.Secret, None),
    ("/v1/artifacts/{digest}", resources.Artifact, None),
    ("/v1/webhooks", notify_routes.Webhooks, None),
    ("/v1/webhooks/{webhook_id:int}", notify_routes.Webhook, None),
    ("/v1/webhooks/{webhook_id:int}/test", notify_routes.Webhook, "test"),
    ("/v1/alerts", notify_routes.Alerts, None),
    ("/v1/alerts/{name}", notify_routes.Alert, None),
]


class RowIdConverter(falcon.routing.IntConverter):
    """`{x:int}` in a route: a non-negative integer that fits SQLite's int64; anything else is no route (404)."""

    def __init__(self, num_digits=None, min=0, max=INT64_MAX):  # noqa: A002 - falcon's keyword names
        super().__init__(num_digits, min, max)


def create_app(deps: Deps) -> falcon.App:
    """The WSGI app over injected dependencies."""
    metrics = Metrics(deps.scheduler)
    metrics.registry.register(UpkeepCollector(deps.upkeep))
    if deps.replication is not None:
        metrics.registry.register(ReplicationCollector(deps.replication))
    deps.scheduler.observe_acquire = metrics.acquire.observe
    metrics.parked.set_function(lambda: deps.scheduler.parked_acquires)
    metrics.parked_log_polls.set_function(lambda: deps.scheduler.parked_log_polls)
    app = falcon.App(middleware=[metrics, ProtocolMiddleware(deps), AuthMiddleware(deps)])  # type: ignore[arg-type]  # falcon types middleware as protocols
    app.req_options.strip_url_path_trailing_slash = True
    app.resp_options.secure_cookies_by_default = False
    # Every id in a path is a row key: one larger than int64 would fail in SQLite as a 500.
    app.router_options.converters["int"] = RowIdConverter
    # ASCII-escaped JSON renders any str, so no stored text can make a read fail after its write.
    app.resp_options.media_handlers[falcon.MEDIA_JSON] = falcon.media.JSONHandler(
        dumps=functools.partial(json.dumps, ensure_ascii=True))
    app.add_error_handler(Exception, _unexpected)
    app.add_error_handler(GpulayerError, _error_handler)
    app.set_error_serializer(_http_error_serializer)
    instances: dict[type, object] = {}
    for path, cls, suffix in ROUTES:
        instance = instances.setdefault(cls, cls(deps))
        if suffix:
            app.add_route(path, instance, suffix=suffix)
        else:
            app.add_route(path, instance)
    from gpulayer.server.http.openapi import OpenAPI
    app.add_route("/v1/openapi.json", OpenAPI(deps, ROUTES))
    app.add_route("/metrics", MetricsResource(metrics))
    # /ingress/...: a service's own HTTP, which granian hands to the ingress before this app; a sink, not a
    # route (no /v1 resource, no auth here): it answers only under cheroot, with a 501.
    app.add_sink(relay_routes.IngressUnavailable(deps), relay_routes.INGRESS_PATHS)
    return app


def with_explorer(app, deps: Deps, *, secure_cookies: bool):
    """Serve the read-only explorer at /explorer/ beside /v1, behind the client token."""
    import explorer

    def is_client(token: str) -> bool:
        """Admins only: SQL over the whole file cannot be narrowed to what a member may see (docs/explorer.md)."""
        try:
            principal = deps.auth.authenticate(token, deps.clock())
        except GpulayerError:
            return False
        return principal.kind == "client" and principal.admin

    browse = explorer.create_app(str(deps.config.layout.state), auth=is_client, secure_cookies=secure_cookies,
                                 base_path="/explorer")

    def dispatch(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path == "/explorer" or path.startswith("/explorer/"):
            return browse(environ, start_response)
        return app(environ, start_response)

    return dispatch


def new_deps(config: ControlPlaneConfig, *, clock=time.time, ca_file: Path | None = None) -> Deps:
    """Open the home's state file and build every dependency of the app."""
    layout = config.layout
    store = Store(layout.state, synchronous=config.synchronous, read_timeout_s=config.read_timeout_s,
                  autocheckpoint=not config.replicate)
    authn = auth.Authenticator(layout, store, QUERIES)
    artifacts = ArtifactStore(layout.artifacts)
    scheduler = Scheduler(store, config, clock, auth=authn, artifacts=artifacts)
    return Deps(config=config, store=store, scheduler=scheduler, auth=authn, artifacts=artifacts,
                ca_file=ca_file, clock=clock)

