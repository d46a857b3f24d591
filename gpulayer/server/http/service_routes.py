"""/v1/jobs/{id}/service: a service's revisions and rolling updates (issue 39; scheduler/rollout.py,
docs/services.md "Rolling updates"): parse, call the Scheduler, render."""
from __future__ import annotations

import falcon

from gpulayer.server.errors import InvalidRequest
from gpulayer.server.http import wire
from gpulayer.server.http.resources import Resource, _job_access
from gpulayer.server.scheduler import rollout
from gpulayer.server.validators import integer, mapping, number, string

UPDATE_FIELDS = rollout.SPEC_CHANGES + rollout.ROLL_FIELDS


def parse_update(body: dict) -> rollout.Update:
    """PATCH /v1/jobs/{id}/service's body: the spec's changes (`image`, `env`: names to set, null removes one,
    `command`), checked whole as a submit's by rollout.new_spec, and the rollout's settings; InvalidRequest
    naming the field."""
    unknown = sorted(set(body) - set(UPDATE_FIELDS))
    if unknown:
        raise InvalidRequest(f"unknown field {unknown[0]} (known: {', '.join(UPDATE_FIELDS)})")
    changes: dict = {}
    if "image" in body:
        changes["image"] = mapping(body["image"], "image")   # checked whole by the new spec's validation
    if "env" in body:
        env = mapping(body["env"], "env")   # names and values checked by the new spec's validation
        changes["env"] = {k: None if v is None else string(v, f"env.{k}") for k, v in env.items()}
    if "command" in body:
        changes["command"] = body["command"]
    if not changes:
        raise InvalidRequest("give at least one of image, env, command (what the new revision changes)")
    canary = body.get("canary")
    return rollout.Update(
        changes=changes,
        max_surge=integer(body.get("max_surge", 1), "max_surge", 0, 1000),
        max_unavailable=integer(body.get("max_unavailable", 0), "max_unavailable", 0, 1000),
        canary=None if canary is None else integer(canary, "canary", 1, 99),
        ready_timeout_s=number(body.get("ready_timeout_s"), "ready_timeout_s", 0.1, 86400.0, allow_none=True),
        drain_s=number(body.get("drain_s", rollout.DEFAULT_DRAIN_S), "drain_s", 0.0, 3600.0))


class Service(Resource):
    """A service's revisions (GET), a rolling update (PATCH), and its canary's promote and rollback (POST)."""

    @falcon.before(_job_access, "see")
    def on_get(self, req, resp, job_id):
        resp.media = self.sched.service_revisions(job_id)

    @falcon.before(_job_access, "manage", "update it")
    def on_patch(self, req, resp, job_id):
        self.sched.update_service(job_id, parse_update(wire.read_json(req)))
        resp.media = self.sched.service_revisions(job_id)

    @falcon.before(_job_access, "manage", "promote it")
    def on_post_promote(self, req, resp, job_id):
        wire.empty_body(wire.read_json(req, allow_empty=True), "promote")
        self.sched.promote_service(job_id)
        resp.media = self.sched.service_revisions(job_id)

    @falcon.before(_job_access, "manage", "roll it back")
    def on_post_rollback(self, req, resp, job_id):
        wire.empty_body(wire.read_json(req, allow_empty=True), "rollback")
        self.sched.rollback_service(job_id)
        resp.media = self.sched.service_revisions(job_id)
