"""Falcon resources for what workers call on /v1 (register, heartbeat, acquire, their tasks' reports): parse,
call the scheduler, render. No SQL, no scheduling rules. The client-facing resources are in resources.py.
"""
from __future__ import annotations

from gpulayer.server.http import wire
from gpulayer.server.http.resources import Resource

class Register(Resource):
    auth = ("join",)

    def on_post(self, req, resp):
        body = wire.register(wire.read_json(req))
        result = self.sched.join(body=body, token=req.context.principal, peer_address=req.remote_addr)
        resp.media = {"worker_id": result["worker_id"], "session_token": result["session_token"],
                      "name": result["name"],
                      "labels": result["labels"], "advertise_address": result["advertise_address"],
                      "lease_ttl_s": self.deps.config.lease_ttl_s, **self.sched.heartbeat_terms(result["worker_id"])}
        if result.get("warnings"):
            resp.media["warnings"] = result["warnings"]


class WorkerResource(Resource):
    auth = ("worker",)

    def worker_id(self, req) -> int:
        return req.context.principal.worker_id


class Heartbeat(WorkerResource):
    allow_gone = True  # a revoked worker must still hear `revoked: true`

    def on_post(self, req, resp):
        body = wire.read_json(req, allow_empty=True)
        reported = wire.heartbeat(body)
        answer = self.sched.heartbeat(self.worker_id(req), reported, wire.gpu_health(body), wire.gpu_samples(body))
        if answer["lease_expires_at"] is not None:  # the interval wanted, and that any request renews
            answer.update(self.sched.heartbeat_terms(self.worker_id(req)))
        if self.sched.relay.wanted(self.worker_id(req)):  # a client waits for this worker's relay link
            answer["relay"] = True
        resp.media = answer


class Acquire(WorkerResource):
    def on_post(self, req, resp):
        body = wire.read_json(req, allow_empty=True)
        wait_s, max_tasks = wire.wait_seconds(body), wire.max_tasks(body)
        prefetch, held = wire.lease_ahead(body)
        ahead: list[dict] | None = [] if prefetch else None
        resp.media = assignments(self.sched.acquire_many(self.worker_id(req), wait_s, max_tasks or 1,
                                                         req.context.recheck, ahead, held), max_tasks)
        if ahead is not None:  # elements leased ahead, to start as slots free (docs/protocol.md)
            resp.media["ahead"] = ahead
        if self.sched.relay.wanted(self.worker_id(req)):  # answered early for it: connect the relay link now
            resp.media["relay"] = True


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
        if not want_next:
            resp.media = {"accepted": self.sched.finish(self.worker_id(req), task_id, **body)}
            return
        # the freed slot's next task(s) in the same round trip (and write), as acquire with wait_s 0
        accepted, found = self.sched.finish_next(self.worker_id(req), task_id, max_tasks or 1, **body)
        resp.media = {"accepted": accepted, **assignments(found, max_tasks)}


class FinishMany(WorkerResource):
    """POST /v1/worker/finish-many: several finishes in one transaction, each fenced by its attempt."""

    def on_post(self, req, resp):
        body = wire.finish_many(wire.read_json(req, limit=16 * 1024 * 1024))
        max_tasks = body["max_tasks"]
        ahead: list[dict] | None = [] if body["prefetch"] else None
        done = self.sched.finish_many(self.worker_id(req), body["finishes"], next_tasks=body["next"],
                                      max_tasks=max_tasks or 1, ahead=ahead, held=body["held"],
                                      release=body["release"])
        answer = {"results": done["results"], **assignments(done["found"], 0),
                  "dropped": done["dropped"]}
        if ahead is not None:
            answer["ahead"] = ahead
        resp.media = answer


class WorkerCheckpoint(WorkerResource):
    """POST /v1/worker/checkpoint: a periodic checkpoint of a task this worker holds, once its files are stored."""

    def on_post(self, req, resp):
        body = wire.checkpoint(wire.read_json(req, limit=16 * 1024 * 1024))
        resp.media = self.sched.record_checkpoint(self.worker_id(req), body["task_id"], body["attempt"], body["files"])
