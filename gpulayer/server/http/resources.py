"""Falcon resources for /v1: parse, call the scheduler, render. No SQL, no scheduling rules.

Each resource names who may call it in `auth` (token kinds); the auth
middleware in app.py enforces it before any responder runs.
"""
from __future__ import annotations

import falcon

from gpulayer.server.config import PROTOCOL
from gpulayer.server.errors import InvalidRequest, NotFound
from gpulayer.server.http import wire
from gpulayer.server.provisioning import loop as provisioner
from gpulayer.server.scheduler import jobs, secrets, tokens, workers
from gpulayer.server.scheduler.artifacts import check_digest

LOG_RETRY_AFTER_S = 1.0
JOB_STATES = ("queued", "running", "succeeded", "failed", "cancelled", "lost")


class Resource:
    """Base: holds the injected dependencies."""

    auth: tuple[str, ...] = ("client",)

    def __init__(self, deps):
        self.deps = deps
        self.sched = deps.scheduler
        self.store = deps.store


class Health(Resource):
    auth = ()

    def on_get(self, req, resp):
        """200 `ok: true` while writes can succeed; else 503 `ok: false` with the writer's and the disk's state."""
        health = self.deps.store.health()
        if health["ok"]:
            resp.media = {"ok": True, "protocol": PROTOCOL}
            return
        resp.status = falcon.HTTP_503
        resp.media = {"protocol": PROTOCOL, **health}


class CACert(Resource):
    """The control plane's CA certificate (public), for `join --ca-fingerprint` pinning."""

    auth = ()

    def on_get(self, req, resp):
        if not self.deps.ca_file:
            raise NotFound("this control plane has no CA of its own (it serves plain HTTP or an outside certificate)")
        resp.content_type = "application/x-pem-file"
        resp.text = self.deps.ca_file.read_text()


# -- workers -----------------------------------------------------------------

class Register(Resource):
    auth = ("join",)

    def on_post(self, req, resp):
        body = wire.register(wire.read_json(req))
        result = self.sched.join(body=body, token=req.context.principal, peer_address=req.remote_addr)
        resp.media = {"worker_id": result["worker_id"], "session_token": result["session_token"],
                      "name": result["name"],
                      "labels": result["labels"], "advertise_address": result["advertise_address"],
                      "heartbeat_interval_s": self.deps.config.heartbeat_interval_s,
                      "lease_ttl_s": self.deps.config.lease_ttl_s}


class WorkerResource(Resource):
    auth = ("worker",)

    def worker_id(self, req) -> int:
        return req.context.principal.worker_id


class Heartbeat(WorkerResource):
    allow_gone = True  # a revoked worker must still hear `revoked: true`

    def on_post(self, req, resp):
        reported = wire.heartbeat(wire.read_json(req, allow_empty=True))
        resp.media = self.sched.heartbeat(self.worker_id(req), reported)


class Acquire(WorkerResource):
    def on_post(self, req, resp):
        body = wire.read_json(req, allow_empty=True)
        wait_s, max_tasks = wire.wait_seconds(body), wire.max_tasks(body)
        resp.media = assignments(self.sched.acquire_many(self.worker_id(req), wait_s, max_tasks or 1), max_tasks)


def assignments(found: list[dict], max_tasks: int | None) -> dict:
    """`task` (the first Assignment or null), plus `more` (the rest) when the request named `max_tasks`."""
    answer: dict = {"task": found[0] if found else None}
    if max_tasks is not None:
        answer["more"] = found[1:]
    return answer


class Deregister(WorkerResource):
    def on_post(self, req, resp):
        left = self.sched.deregister(self.worker_id(req))
        resp.media = {"ok": True, "tasks_left": left}


class WorkerTask(WorkerResource):
    """POST /v1/worker/tasks/{task_id}/{start,logs,rendezvous,finish}."""

    def on_post_start(self, req, resp, task_id):
        self.sched.start(self.worker_id(req), task_id, wire.start(wire.read_json(req, allow_empty=True)))
        resp.media = {"ok": True}

    def on_post_logs(self, req, resp, task_id):
        lines = wire.log_lines(wire.read_json(req, limit=8 * 1024 * 1024))
        accepted = self.sched.logs(self.worker_id(req), task_id, lines)
        resp.media = {"ok": True, "accepted": accepted}

    def on_post_rendezvous(self, req, resp, task_id):
        address, port = wire.rendezvous(wire.read_json(req))
        resp.media = self.sched.rendezvous(self.worker_id(req), task_id, address, port)

    def on_post_finish(self, req, resp, task_id):
        body = wire.finish(wire.read_json(req))
        want_next, max_tasks = body.pop("next"), body.pop("max_tasks")
        answer = {"accepted": self.sched.finish(self.worker_id(req), task_id, **body)}
        if want_next:  # the freed slot's next task(s) in the same round trip, as acquire with wait_s 0
            answer.update(assignments(self.sched.acquire_many(self.worker_id(req), 0, max_tasks or 1), max_tasks))
        resp.media = answer


# -- clients -----------------------------------------------------------------

class Jobs(Resource):
    def on_post(self, req, resp):
        job_id = self.sched.submit(wire.read_json(req))
        resp.status = falcon.HTTP_201
        resp.location = f"/v1/jobs/{job_id}"
        resp.media = self.store.read(jobs.render, job_id)

    def on_get(self, req, resp):
        state = req.get_param("state")
        if state is not None and state not in JOB_STATES:
            raise InvalidRequest(f"state: must be one of {', '.join(JOB_STATES)}")
        limit = wire.query_int(req, "limit", 100, 1, 1000)
        before = wire.query_int(req, "before", None, 1, 1 << 62)
        resp.media = {"jobs": self.store.read(jobs.listing, state, limit, before)}


class Job(Resource):
    def on_get(self, req, resp, job_id):
        resp.media = self.store.read(jobs.render, job_id)

    def on_post_cancel(self, req, resp, job_id):
        self.sched.cancel(job_id)
        resp.media = self.store.read(jobs.render, job_id)

    def on_get_logs(self, req, resp, job_id):
        after = wire.query_int(req, "after", 0, 0, 1 << 62)
        limit = wire.query_int(req, "limit", 1000, 1, 10_000)
        wait_s = wire.query_float(req, "wait_s", 0.0, 0.0, 30.0)
        self.store.read(jobs.render, job_id)  # 404 for no such job
        lines, waited = self.sched.wait_for_logs(job_id, after, limit, wait_s)
        resp.media = {"lines": lines, "next": lines[-1]["seq"] if lines else after}
        if not waited:  # too many followers parked: this one polls again after a pause
            resp.media["retry_after_s"] = LOG_RETRY_AFTER_S

    def on_get_events(self, req, resp, job_id):
        resp.media = {"events": self.store.read(jobs.events_of, job_id)}

    def on_get_endpoints(self, req, resp, job_id):
        resp.media = self.store.read(jobs.endpoints, job_id)

    def on_get_outputs(self, req, resp, job_id):
        self.store.read(jobs.render, job_id)
        resp.media = {"outputs": self.store.read(jobs.outputs, job_id)}


class Workers(Resource):
    def on_get(self, req, resp):
        include_gone = req.get_param_as_bool("all", default=False)
        resp.media = {"workers": self.store.read(workers.listing, include_gone)}


class Provisioners(Resource):
    """Slurm provisioning: the configured provisioners and their recent requests."""

    def on_get(self, req, resp):
        limit = req.get_param_as_int("limit", min_value=1, max_value=1000, default=100)
        resp.media = {"provisioners": provisioner.describe(self.deps.provisioners),
                      "requests": self.store.read(provisioner.requests_listing, limit)}


class Tokens(Resource):
    def on_post(self, req, resp):
        body = wire.token_request(wire.read_json(req))
        resp.status = falcon.HTTP_201
        resp.media = self.sched.mint_token(**body)

    def on_get(self, req, resp):
        resp.media = {"tokens": self.store.read(tokens.listing)}


class Token(Resource):
    def on_post_revoke(self, req, resp, jti):
        resp.media = self.sched.revoke_token(jti)


class Secrets(Resource):
    def on_get(self, req, resp):
        resp.media = {"secrets": self.store.read(secrets.listing)}


class Secret(Resource):
    def on_put(self, req, resp, name):
        body = wire.read_json(req)
        unknown = set(body) - {"value", "labels"}
        if unknown:
            raise InvalidRequest(f"unknown field {sorted(unknown)[0]}")
        resp.media = self.sched.set_secret(name, body.get("value"), body.get("labels"))

    def on_delete(self, req, resp, name):
        self.sched.delete_secret(name)
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
        self.sched.check_artifact_probe(req.context.principal, digest)
        size = self.deps.artifacts.size(digest)
        if size is None:
            resp.status = falcon.HTTP_404
            return
        resp.content_type = "application/octet-stream"
        resp.content_length = size

