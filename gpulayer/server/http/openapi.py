"""GET /v1/openapi.json: the OpenAPI 3 document, built from the app's own route table.

Paths and methods come from the routes and the responders the resources
define, so the document cannot drift from what is served (a test checks it).
"""
from __future__ import annotations

import re
from typing import Any

from gpulayer.protocol.assignment import Assignment
from gpulayer.protocol.fields import json_schema
from gpulayer.protocol.finish import CheckpointFile, Finish, FinishMany
from gpulayer.protocol.heartbeat import Heartbeat
from gpulayer.protocol.jobspec import JobSpec
from gpulayer.protocol.registration import GpuReport, Register
from gpulayer.server.config import PROTOCOL
from gpulayer.server.http import paging
from gpulayer.server.notify.names import EVENTS

ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["code", "message"],
    "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}}}
STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
DIGEST = {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"}
NUM = {"type": "number", "minimum": 0}
INT = {"type": "integer", "minimum": 0}

JOB_SPEC: dict[str, Any] = json_schema(JobSpec)  # the declaration's (gpulayer/protocol/jobspec.py)
# acquire, and finish with `next`: `task` as in protocol v1; `more` only when the request named max_tasks
MAX_TASKS = {"type": "integer", "minimum": 1, "maximum": 1024,
             "description": "assignments one answer may carry (capped by the worker's free slots and 16)"}
ASSIGNMENT = json_schema(Assignment, closed=False)  # the declaration's (gpulayer/protocol/assignment.py)
ASSIGNMENTS = {"task": {"oneOf": [ASSIGNMENT, {"type": "null"}]}, "more": {"type": "array", "items": ASSIGNMENT}}
# acquire and finish-many: elements leased ahead (docs/protocol.md "Elements leased ahead")
LEASE_AHEAD = {"prefetch": {"type": "boolean", "description": "the worker takes elements leased ahead (`ahead`)"},
               "held": {"type": "array", "maxItems": 1024, "items": {"type": "integer"},
                        "description": "task ids the worker holds (queued, running, finishes not yet answered)"}}
AHEAD = {"ahead": {"type": "array", "items": ASSIGNMENT, "description": "elements leased ahead (with prefetch)"}}
# issue 38: a waiting job's start-time estimate (docs/scheduling-time.md), in the Job and the what-if's answer
ESTIMATE = {
    "estimated_start_at": {"type": ["number", "null"], "description": "when the job is expected to start (Unix "
                                                                      "seconds), from the latest forecast; null with "
                                                                      "estimate_reason when that cannot be known"},
    "estimate_reason": {"type": ["string", "null"], "description": "why estimated_start_at is null (held, after a job "
                                                                   "that has not ended, no worker could ever run it, "
                                                                   "beyond the horizon, not estimated yet)"}}
WHAT_IF = {"type": "object", "required": ["estimated_start_at", "estimate_reason", "workers", "runnable", "now"],
           "properties": {**ESTIMATE, "workers": {"type": "array", "items": {"type": "string"},
                                                  "description": "the workers it would start on"},
                          "runnable": {"type": "boolean", "description": "false when no worker could ever run it"},
                          "now": NUM}}
JOB = {"type": "object", "required": ["id", "state", "created_at", "spec", "tasks"], "properties": {
    "id": {"type": "integer"}, "name": {"type": ["string", "null"]}, "state": {"type": "string"},
    "created_at": {"type": "number"}, "spec": {"type": "object"}, "tasks": {"type": "array"},
    "revision": {"type": "integer", "description": "the revision a service serves (each task's own: `revision`)"},
    "array": {"type": ["object", "null"], "description": "an array's progress: indices, size, max_running, "
                                                         "counts {state: elements}, done, failed_indices, cancelled_indices"},
    "after": {"type": "array", "items": {"type": "object", "properties": {
        "job": {"type": "integer"}, "condition": {"enum": ["ok", "notok", "any"]}, "state": {"type": ["string", "null"]},
        "name": {"type": ["string", "null"]}}}},
    "owner": {"type": ["string", "null"], "description": "the user that submitted it"},
    "project": {"type": ["string", "null"], "description": "the project it counts against"},
    "redacted": {"type": "boolean", "description": "true when the caller may only see that it exists: no env, "
                                                   "command or outputs"},
    "ingress_url": {"type": ["string", "null"], "description": "a service's ingress on the control plane "
                                                               "(`service.ingress`; docs/access.md), else null"},
    "scaling": {"type": ["object", "null"], "description": "a service that autoscales (`service.autoscale`, "
                                                           "docs/services.md): its replicas now, ready, draining, and "
                                                           "its latest decisions, oldest first (`history`: at, "
                                                           "from_replicas, to_replicas, why, load, in_flight, ready); "
                                                           "else null (`GET /v1/jobs/{id}` only)"},
    "reservation": {"type": ["object", "null"], "description": "EASY backfill: the room a waiting job holds from "
                                                               "`start_at` on `workers` (docs/scheduling-time.md), "
                                                               "else null", "properties": {
        "workers": {"type": "array", "items": {"type": "string"}}, "start_at": {"type": "number"}}},
    **ESTIMATE}}
# A checkpoint's manifest (docs/training.md): every regular file of the task's GPULAYER_CHECKPOINT_DIR.
CHECKPOINT_FILES = {"type": "array", "maxItems": 100_000, "items": json_schema(CheckpointFile)}
CHECKPOINT_BODY = {"type": "object", "required": ["files"], "properties": {"files": CHECKPOINT_FILES},
                   "description": "the task's checkpoint directory, uploaded: recorded with the finish (an attempt "
                                  "that did not succeed) when every file is stored"}
CHECKPOINT_PROPERTIES: dict = {
    "id": {"type": "integer"}, "index": {"type": "integer"}, "task_id": {"type": "integer"},
    "attempt": {"type": "integer"}, "worker_id": {"type": ["integer", "null"]},
    "kind": {"enum": ["periodic", "final"]}, "created_at": {"type": "number"},
    "files": {"type": "integer"}, "bytes": {"type": "integer"}}
CHECKPOINT = {"type": "object", "required": ["id", "index", "task_id", "attempt", "kind", "created_at", "files",
                                             "bytes"], "properties": CHECKPOINT_PROPERTIES}

# teams (docs/teams.md)
NAME = {"type": "string", "pattern": "^[a-z][a-z0-9_.-]{0,63}$"}
ROLE = {"enum": ["member", "manager"]}
MEMBERSHIPS = {"type": "array", "items": {"type": "object", "required": ["project", "role"], "properties": {
    "project": NAME, "role": ROLE}}}
USER: dict[str, Any] = {"type": "object", "required": ["name", "admin", "projects"], "properties": {
    "name": NAME, "admin": {"type": "boolean"}, "max_running_jobs": {"type": ["integer", "null"], "minimum": 0},
    "created_at": NUM, "projects": MEMBERSHIPS}}
PROJECT_SETTINGS = {
    "visibility": {"enum": ["private", "project"]},
    "gpus": {"type": ["integer", "null"], "minimum": 0, "description": "the GPU quota (nominal); null: none"},
    "borrow": {"type": "integer", "minimum": 0, "description": "GPUs it may borrow past its quota when idle"},
    "weight": {"type": ["number", "null"], "exclusiveMinimum": 0, "description": "fair share; null: the quota"},
    "max_priority": {"type": "integer", "minimum": -1_000_000, "maximum": 1_000_000,
                     "description": "the highest priority its members and managers may ask for (default 0); admins "
                                    "are not bound; its managers may set it"},
    "idle_timeout_seconds": {"type": ["number", "null"], "exclusiveMinimum": 0,
                             "description": "its idle policy's timeout (docs/teams.md, \"Idle policies\"); at least "
                                            "one heartbeat interval; null: the fleet's"},
    "idle_below_pct": {"type": ["number", "null"], "minimum": 0, "maximum": 100,
                       "description": "its idle policy's threshold, %; null: the fleet's"},
    "idle_action": {"enum": ["notify", "requeue", "cancel", None], "description": "its idle policy's action"}}
PROJECT = {"type": "object", "required": ["name", "visibility", "members"], "properties": {
    "name": NAME, **PROJECT_SETTINGS, "created_at": NUM, "members": {"type": "array", "items": {
        "type": "object", "required": ["user", "role"], "properties": {"user": NAME, "role": ROLE}}}}}

# the agent's per-GPU health (NVML), as register and heartbeat send it (gpulayer/protocol/registration.py)
GPU_HEALTH = {"type": "array", "items": json_schema(GpuReport, closed=False)}
JOB_GPUS = {"type": "object", "required": ["tasks", "truncated"], "properties": {
    "truncated": {"type": "boolean"},
    "tasks": {"type": "array", "items": {"type": "object", "required": ["task_id", "worker_id", "gpus"], "properties": {
        "task_id": {"type": "integer"}, "index": INT, "attempt": {"type": "integer"}, "worker_id": {"type": "integer"},
        "worker_name": {"type": "string"},
        "gpus": {"type": "array", "items": {"type": "object", "required": ["index"], "properties": {
            "index": INT, "uuid": {"type": ["string", "null"]}, "at": {"type": ["number", "null"]},
            "age_s": {"type": ["number", "null"], "description": "seconds since the newest sample (null: none yet)"},
            "utilization_pct": {"type": ["number", "null"]}, "memory_used_mb": {"type": ["integer", "null"]},
            "memory_total_mb": {"type": ["integer", "null"]}}}}}}}}}
REASON = {"type": "string", "minLength": 1}
CORDON = {"type": "object", "required": ["reason"], "additionalProperties": False, "properties": {"reason": REASON}}
WORKER_CORDON = {"type": "object", "required": ["id", "name", "state", "cordon"], "properties": {
    "id": {"type": "integer"}, "name": {"type": "string"}, "state": {"type": "string"},
    "cordon": {"enum": ["cordoned", "draining", "drained", None]}, "cordon_reason": {"type": ["string", "null"]},
    "cordoned_at": {"type": ["number", "null"]}, "drain_deadline": {"type": ["number", "null"]}}}

# issue 39: PATCH /v1/jobs/{id}/service's body and the revisions it answers (docs/services.md, "Rolling updates")
SERVICE_UPDATE = {"type": "object", "additionalProperties": False, "minProperties": 1, "properties": {
    "image": {"type": "object", "description": "the new revision's image, as the JobSpec's"},
    "env": {"type": "object", "additionalProperties": {"type": ["string", "null"]},
            "description": "names set (merged into the serving env), null removes one"},
    "command": {"type": "array", "items": {"type": "string"}, "minItems": 1},
    "max_surge": {"type": "integer", "minimum": 0, "description": "replicas over the count while rolling (1)"},
    "max_unavailable": {"type": "integer", "minimum": 0, "description": "replicas under it while rolling (0)"},
    "canary": {"type": ["integer", "null"], "minimum": 1, "maximum": 99,
               "description": "percent of ingress requests to one new replica until promote or rollback"},
    "ready_timeout_s": {"type": ["number", "null"], "description": "a new replica's time to be ready (default: "
                                                                   "health failures x interval, else 300)"},
    "drain_s": {"type": "number", "minimum": 0, "description": "an old replica's time to finish its requests (30)"}}}
SERVICE_REVISIONS = {"type": "object", "required": ["job_id", "revision", "rollout", "replicas", "updates"],
                     "properties": {
    "job_id": {"type": "integer"}, "revision": {"type": "integer", "description": "the revision the service serves"},
    "state": {"type": "string"},
    "rollout": {"type": ["object", "null"], "description": "the update under way (rolling, rolling_back), if any"},
    "replicas": {"type": "array", "items": {"type": "object", "required": ["revision", "replicas", "ready", "draining"]}},
    "updates": {"type": "array", "items": {"type": "object", "required": ["revision", "from_revision", "state"]}}}}

REQUEST_BODIES = {
    ("/v1/jobs", "post"): {**JOB_SPEC, "properties": {**JOB_SPEC["properties"], "project": {
        **NAME, "description": "beside the JobSpec: the project it counts against (default: the caller's only "
                               "project, else default)"},
        "mail": {"type": "object", "additionalProperties": False, "required": ["email"],
                 "description": "beside the JobSpec: a mailbox for the job (needs --smtp-url), checked before the "
                                "job is made",
                 "properties": {"email": {"type": "string"}, "mail_type": {
                     "type": "array", "items": {"enum": ["BEGIN", "END", "FAIL", "REQUEUE", "ALL"]}}}}}},
    ("/v1/users", "post"): {"type": "object", "required": ["name"], "additionalProperties": False, "properties": {
        "name": NAME, "admin": {"type": "boolean"}, "max_running_jobs": {"type": ["integer", "null"], "minimum": 0},
        "projects": MEMBERSHIPS,
        "reclaim": {"type": "boolean", "description": "a removed user's name: bring that account back (else 409)"}}},
    ("/v1/users/{name}", "patch"): {"type": "object", "additionalProperties": False, "properties": {
        "admin": {"type": "boolean"}, "max_running_jobs": {"type": ["integer", "null"], "minimum": 0}}},
    ("/v1/projects", "post"): {"type": "object", "required": ["name"], "additionalProperties": False,
                               "properties": {"name": NAME, **PROJECT_SETTINGS}},
    ("/v1/projects/{name}", "patch"): {"type": "object", "additionalProperties": False,
                                       "properties": PROJECT_SETTINGS},
    ("/v1/projects/{name}/members/{user}", "put"): {"type": "object", "additionalProperties": False,
                                                    "properties": {"role": ROLE}},
    # the worker's requests: their declarations' (gpulayer/protocol/registration.py, heartbeat.py, finish.py)
    ("/v1/workers/register", "post"): json_schema(Register, closed=False),
    ("/v1/worker/heartbeat", "post"): json_schema(Heartbeat, closed=False),
    ("/v1/workers/{worker}/cordon", "post"): CORDON,
    ("/v1/workers/{worker}/drain", "post"): {**CORDON, "properties": {
        "reason": REASON, "timeout_s": {"type": ["number", "null"], "minimum": 0}}},
    ("/v1/worker/acquire", "post"): {"type": "object", "properties": {"wait_s": {"type": "number", "minimum": 0,
                                                                                "maximum": 1},
                                                                     "max_tasks": MAX_TASKS, **LEASE_AHEAD}},
    ("/v1/worker/finish-many", "post"): json_schema(FinishMany),
    ("/v1/worker/checkpoint", "post"): {"type": "object", "additionalProperties": False,
                                        "required": ["task_id", "files"], "properties": {
        "task_id": {"type": "integer", "minimum": 1},
        "attempt": {"type": "integer", "minimum": 1, "description": "refused (409) when the task is at another"},
        "files": CHECKPOINT_FILES}},
    ("/v1/worker/tasks/{task_id}/start", "post"): {"type": "object", "properties": {"pid": INT}},
    ("/v1/worker/tasks/{task_id}/logs", "post"): {"type": "object", "required": ["lines"], "properties": {
        "lines": {"type": "array", "items": {"type": "object", "required": ["text"], "properties": {
            "n": INT, "stream": {"enum": ["stdout", "stderr", "system"]}, "text": {"type": "string"},
            "at": NUM}}}}},
    ("/v1/worker/tasks/{task_id}/rendezvous", "post"): {"type": "object", "required": ["address", "port"],
                                                        "properties": {"address": {"type": "string"},
                                                                       "port": {"type": "integer"}}},
    ("/v1/worker/tasks/{task_id}/finish", "post"): json_schema(Finish, closed=False),
    ("/v1/tokens", "post"): {"type": "object", "additionalProperties": False, "properties": {
        "name": {"type": "string", "description": "required for join and metrics tokens; a client token's "
                                                  "defaults to its user's name"},
        "labels": STR_MAP, "expires_in_s": {"type": ["number", "null"]},
        "kind": {"enum": ["join", "metrics", "client"]},
        "user": {**NAME, "description": "a client token's user (default: the caller; another: admins)"}}},
    ("/v1/secrets/{name}", "put"): {"type": "object", "required": ["value"], "properties": {
        "value": {"type": "string"}, "labels": STR_MAP}},
    ("/v1/jobs/{job_id}/cancel", "post"): {"type": "object", "additionalProperties": False, "properties": {
        "index": {**INT, "description": "cancel one element of an array (no body: the whole job)"}}},
    # issue 27: Slurm's job control (scheduler/jobcontrol.py)
    ("/v1/jobs/{job_id}/hold", "post"): {"type": "object", "additionalProperties": False, "properties": {}},
    ("/v1/jobs/{job_id}/release", "post"): {"type": "object", "additionalProperties": False, "properties": {}},
    ("/v1/jobs/{job_id}/requeue", "post"): {"type": "object", "additionalProperties": False, "properties": {
        "index": {**INT, "description": "requeue one element of an array (none: the whole job)"},
        "hold": {"type": "boolean", "description": "held once queued"}}},
    ("/v1/jobs/{job_id}", "patch"): {"type": "object", "additionalProperties": False, "minProperties": 1, "properties": {
        "name": {"type": ["string", "null"], "maxLength": 256},
        "priority": {"type": ["integer", "string"], "description": "a number, or a priority class's name"},
        "timeout_seconds": {"type": ["number", "string", "null"], "description": "seconds, or a duration's text"}}},
    # issue 39: a service's rolling update (scheduler/rollout.py)
    ("/v1/jobs/{job_id}/service", "patch"): SERVICE_UPDATE,
    ("/v1/jobs/{job_id}/service/promote", "post"): {"type": "object", "additionalProperties": False, "properties": {}},
    ("/v1/jobs/{job_id}/service/rollback", "post"): {"type": "object", "additionalProperties": False, "properties": {}},
}
# the what-if (issue 38) takes what a submit takes
REQUEST_BODIES[("/v1/jobs/estimate", "post")] = REQUEST_BODIES[("/v1/jobs", "post")]
# no body: the whole job; hold and release take none
OPTIONAL_BODIES = {("/v1/jobs/{job_id}/cancel", "post"), ("/v1/jobs/{job_id}/hold", "post"),
                   ("/v1/jobs/{job_id}/service/promote", "post"), ("/v1/jobs/{job_id}/service/rollback", "post"),
                   ("/v1/jobs/{job_id}/release", "post"), ("/v1/jobs/{job_id}/requeue", "post")}
RESPONSES: dict[tuple[str, str], tuple[str, dict]] = {
    ("/v1/jobs", "post"): ("201", JOB),
    ("/v1/jobs/estimate", "post"): ("200", WHAT_IF),
    ("/v1/jobs/{job_id}", "get"): ("200", JOB),
    ("/v1/jobs/{job_id}/gpus", "get"): ("200", JOB_GPUS),
    ("/v1/jobs/{job_id}", "patch"): ("200", JOB),
    ("/v1/jobs/{job_id}/hold", "post"): ("200", JOB),
    ("/v1/jobs/{job_id}/release", "post"): ("200", JOB),
    ("/v1/jobs/{job_id}/requeue", "post"): ("200", JOB),
    ("/v1/jobs/{job_id}/service", "get"): ("200", SERVICE_REVISIONS),
    ("/v1/jobs/{job_id}/service", "patch"): ("200", SERVICE_REVISIONS),
    ("/v1/jobs/{job_id}/service/promote", "post"): ("200", SERVICE_REVISIONS),
    ("/v1/jobs/{job_id}/service/rollback", "post"): ("200", SERVICE_REVISIONS),
    ("/v1/jobs", "get"): ("200", {"type": "object", "required": ["jobs"],
                                  "properties": {"jobs": {"type": "array", "items": JOB}}}),
    ("/v1/jobs/{job_id}/logs", "get"): ("200", {"type": "object", "required": ["lines", "next"], "properties": {
        "lines": {"type": "array", "items": {"type": "object", "required": ["seq", "task_id", "stream", "text"]}},
        "ended": {"type": "boolean", "description": "true once the job (with `index`, that element) has ended "
                                                    "and no line follows these: a follower stops"},
        "retry_after_s": {"type": "number", "description": "too many followers wait: ask again after this long"}}}),
    ("/v1/health", "get"): ("200", {"type": "object", "required": ["ok", "protocol"]}),
    ("/v1/tokens", "post"): ("201", {"type": "object", "required": ["token", "jti", "name", "kind"]}),
    ("/v1/whoami", "get"): ("200", {"type": "object", "required": ["user", "admin", "projects"], "properties": {
        "user": NAME, "admin": {"type": "boolean"}, "max_running_jobs": {"type": ["integer", "null"]},
        "projects": MEMBERSHIPS, "token": {"type": "object"}}}),
    ("/v1/users", "get"): ("200", {"type": "object", "required": ["users"],
                                   "properties": {"users": {"type": "array", "items": USER}}}),
    ("/v1/users", "post"): ("201", {**USER, "required": [*USER["required"], "token", "jti"], "properties": {
        **USER["properties"], "token": {"type": "string", "description": "its client token, shown once"},
        "jti": {"type": "string"}}}),
    ("/v1/users/{name}", "get"): ("200", USER),
    ("/v1/users/{name}", "patch"): ("200", USER),
    ("/v1/projects", "get"): ("200", {"type": "object", "required": ["projects"],
                                      "properties": {"projects": {"type": "array", "items": PROJECT}}}),
    ("/v1/projects", "post"): ("201", PROJECT),
    ("/v1/projects/{name}", "get"): ("200", PROJECT),
    ("/v1/projects/{name}", "patch"): ("200", PROJECT),
    ("/v1/projects/{name}/members/{user}", "put"): ("200", PROJECT),
    ("/v1/artifacts/{digest}", "put"): ("201", {"type": "object", "required": ["digest", "size"]}),
    ("/v1/worker/acquire", "post"): ("200", {"type": "object", "required": ["task"],
                                            "properties": {**ASSIGNMENTS, **AHEAD}}),
    ("/v1/worker/finish-many", "post"): ("200", {"type": "object", "required": ["results", "task", "more", "dropped"],
                                                "properties": {
        "results": {"type": "array", "items": {"type": "object", "required": ["task_id", "accepted"], "properties": {
            "task_id": {"type": "integer"}, "accepted": {"type": "boolean"}, "error": {"type": "object"}}}},
        "dropped": {"type": "array", "items": {"type": "integer"}}, **ASSIGNMENTS, **AHEAD}}),
    ("/v1/worker/checkpoint", "post"): ("200", {"type": "object", "required": ["checkpoint_id", "attempt", "index",
                                                                         "files", "bytes"]}),
    ("/v1/jobs/{job_id}/checkpoints", "get"): ("200", {"type": "object", "required": ["checkpoints", "next"],
                                                       "properties": {"checkpoints": {"type": "array",
                                                                                      "items": CHECKPOINT}}}),
    ("/v1/jobs/{job_id}/checkpoints/{checkpoint_id}", "get"): ("200", {**CHECKPOINT, "properties": {
        **CHECKPOINT_PROPERTIES, "manifest": CHECKPOINT_FILES}}),
    ("/v1/worker/tasks/{task_id}/finish", "post"): ("200", {"type": "object", "required": ["accepted"], "properties": {
        "accepted": {"type": "boolean"}, **ASSIGNMENTS}}),
    ("/v1/worker/heartbeat", "post"): ("200", {"type": "object", "required": ["cancel_task_ids", "revoked"],
                                              "properties": {
        "cancel_task_ids": {"type": "array", "items": {"type": "integer"}}, "revoked": {"type": "boolean"},
        "lease_expires_at": {"type": ["number", "null"]},
        "reset_gpus": {"type": "array", "items": INT,
                       "description": "GPU indices an operator reset: forget their faults (sent only when some)"},
        "preempted_task_ids": {"type": "array", "items": {"type": "integer"},
                               "description": "of cancel_task_ids, those stopped for a preemption (sent only when some)"},
        "preempt_grace_s": {"type": "number", "description": "their SIGTERM-to-SIGKILL grace"},
        "requeued_task_ids": {"type": "array", "items": {"type": "integer"},
                              "description": "of cancel_task_ids, those stopped for a requeue (sent only when some)"},
        "heartbeat_interval_s": {"type": "number", "description": "the interval the server wants from the next beat"},
        "requests_renew_lease": {"type": "boolean",
                                 "description": "any successful worker request renews the leases (docs/protocol.md)"},
        "time_limits": {"type": "array", "description": "running tasks whose job's time limit changed (sent only when some)",
                        "items": {"type": "object", "required": ["task_id", "timeout_seconds"], "properties": {
                            "task_id": INT, "timeout_seconds": {"type": ["number", "null"]}}}}}}),
    ("/v1/usage", "get"): ("200", {"type": "object", "required": ["by", "since", "until", "rows"], "properties": {
        "by": {"type": "string"}, "since": {"type": "number"}, "until": {"type": "number"},
        "rows": {"type": "array", "items": {"type": "object", "required": ["key", "gpu_hours", "cpu_hours", "runs",
                                                                           "jobs", "preempted"]}}}}),
    ("/v1/workers/{worker}/cordon", "post"): ("200", WORKER_CORDON),
    ("/v1/workers/{worker}/drain", "post"): ("200", WORKER_CORDON),
    ("/v1/workers/{worker}/uncordon", "post"): ("200", WORKER_CORDON),
    ("/v1/workers/{worker}/gpus/{index}/reset", "post"): ("200", {
        "type": "object", "required": ["worker_id", "gpus"], "properties": {
            "worker_id": {"type": "integer"}, "name": {"type": "string"}, "gpus": GPU_HEALTH}}),
    ("/v1/provisioners", "get"): ("200", {"type": "object", "required": ["provisioners", "requests"], "properties": {
        "provisioners": {"type": "array", "items": {"type": "object"}},
        "requests": {"type": "array", "items": {"type": "object", "required": ["id", "provisioner", "profile",
                                                                               "state", "slurm_job_id", "last_error"]}}}}),
}
# notifications (issue 28, docs/notifications.md)
EVENT_NAMES = {"type": "array", "minItems": 1, "items": {"enum": list(EVENTS)}, "description": "public event names"}
WEBHOOK: dict[str, Any] = {"type": "object", "required": ["id", "events", "scope", "format"], "properties": {
    "id": {"type": "integer"}, "url": {"type": ["string", "null"]}, "email": {"type": ["string", "null"]},
    "events": {"type": "array", "items": {"type": "string"}}, "format": {"enum": ["standard", "slack", "email"]},
    "scope": {"enum": ["all", "user", "project", "job", "alert"]}, "job_id": {"type": ["integer", "null"]},
    "project": {"type": ["string", "null"]}, "owner": {"type": ["string", "null"]},
    "cursor": {"type": "integer", "description": "the last event seq handled"}, "created_at": NUM}}
ALERT = {"type": "object", "required": ["id", "name", "sql", "every_s", "webhook_id"], "properties": {
    "id": {"type": "integer"}, "name": NAME, "sql": {"type": "string"}, "every_s": NUM,
    "webhook_id": {"type": "integer"}, "fired": INT, "last_error": {"type": ["string", "null"]}}}
REQUEST_BODIES.update({
    ("/v1/webhooks", "post"): {"type": "object", "additionalProperties": False, "properties": {
        "url": {"type": "string", "description": "an http(s) URL on a public address (or give `email`)"},
        "email": {"type": "string", "description": "a mail address (needs --smtp-url)"},
        "events": EVENT_NAMES,
        "mail_type": {"type": "array", "items": {"enum": ["BEGIN", "END", "FAIL", "REQUEUE", "ALL"]},
                      "description": "Slurm's names, instead of `events`"},
        "format": {"enum": ["standard", "slack"]}, "project": NAME, "job": {"type": "integer", "minimum": 1}}},
    ("/v1/alerts", "post"): {"type": "object", "required": ["name", "sql"], "additionalProperties": False,
                             "properties": {
        "name": NAME, "sql": {"type": "string", "description": "one read-only SELECT"},
        "every_s": {"type": "number", "minimum": 10, "maximum": 604800},
        "webhook": {"type": "integer", "minimum": 1}, "email": {"type": "string"}}},
    ("/v1/webhooks/{webhook_id}/test", "post"): {"type": "object"},
})
OPTIONAL_BODIES.add(("/v1/webhooks/{webhook_id}/test", "post"))
RESPONSES.update({
    ("/v1/webhooks", "post"): ("201", {**WEBHOOK, "properties": {**WEBHOOK["properties"], "secret": {
        "type": "string", "description": "the whsec_ signing secret, shown once (a url webhook's)"}}}),
    ("/v1/webhooks", "get"): ("200", {"type": "object", "required": ["webhooks"],
                                      "properties": {"webhooks": {"type": "array", "items": WEBHOOK}}}),
    ("/v1/webhooks/{webhook_id}", "get"): ("200", WEBHOOK),
    ("/v1/webhooks/{webhook_id}/test", "post"): ("200", {"type": "object", "required": ["ok", "status", "error"]}),
    ("/v1/alerts", "post"): ("201", ALERT),
    ("/v1/alerts", "get"): ("200", {"type": "object", "required": ["alerts"],
                                    "properties": {"alerts": {"type": "array", "items": ALERT}}}),
})
QUERY_PARAMS: dict[tuple[str, str], list[tuple[str, dict]]] = {
    ("/v1/jobs", "get"): [("state", {"type": "string"}),
                          ("name", {"type": "string", "maxLength": 256,
                                    "description": "only jobs named like this glob (`*`, `?`, `[...]`, `[!...]`)"}),
                          ("since", {"type": "number", "minimum": 0,
                                     "description": "only jobs created at or after this time (Unix seconds)"}),
                          ("all", {"type": "boolean", "description": "every job the caller may see, not only its own"}),
                          ("user", {"type": "string", "description": "that user's jobs (those the caller may see)"}),
                          ("project", {"type": "string", "description": "that project's jobs (those the caller may see)"})],
    ("/v1/secrets", "get"): [("project", {"type": "string", "description": "whose secrets (default: the caller's "
                                                                         "only project, else default)"})],
    ("/v1/secrets/{name}", "put"): [("project", {"type": "string"})],
    ("/v1/secrets/{name}", "delete"): [("project", {"type": "string"})],
    ("/v1/jobs/{job_id}", "get"): [("index", {"type": "integer", "minimum": 0,
                                              "description": "only that array element's (replica's, rank's) tasks"})],
    ("/v1/jobs/{job_id}/outputs", "get"): [("index", {"type": "integer", "minimum": 0,
                                                      "description": "that array element's outputs alone"})],
    ("/v1/jobs/{job_id}/gpus", "get"): [("index", {"type": "integer", "minimum": 0,
                                                   "description": "that element's (replica's, rank's) tasks alone"})],
    ("/v1/jobs/{job_id}/checkpoints", "get"): [("index", {"type": "integer", "minimum": 0,
                                                          "description": "that element's (rank's) checkpoints alone"})],
    ("/v1/jobs/{job_id}/logs", "get"): [("index", {"type": "integer", "minimum": 0,
                                                   "description": "that array element's lines alone"}),
                                        ("wait_s", {"type": "number", "minimum": 0, "maximum": 30})],
    ("/v1/workers", "get"): [("all", {"type": "boolean"})],
    ("/v1/usage", "get"): [("by", {"type": "string", "description": "user, project, job-name or label:KEY"}),
                           ("since", {"type": "string", "description": "30d, 12h, 90m or seconds (default 30d)"})],
}
METHODS = ("get", "post", "put", "patch", "delete", "head")
_PARAM = re.compile(r"\{(\w+)(?::(\w+))?\}")


def _page_params(path: str, method: str) -> list[tuple[str, dict]]:
    """`limit` and the cursor of a list route (paging.ROUTES)."""
    found = paging.ROUTES.get(path) if method == "get" else None
    if found is None:
        return []
    return [("limit", {"type": "integer", "minimum": 1, "maximum": found.maximum, "default": found.default}),
            (found.cursor, {"type": "string" if found.text else "integer",
                            "description": "the `next` of the page before (absent: the first page)"})]


def _paged(path: str, method: str, schema: dict) -> dict:
    """A list route's answer with its `next`."""
    found = paging.ROUTES.get(path) if method == "get" else None
    if found is None:
        return schema
    kind = "string" if found.text else "integer"
    cursor = {"type": kind if found.followed else [kind, "null"], "description": found.describe()}
    return {**schema, "properties": {**schema.get("properties", {}), "next": cursor}}


def _operation(path: str, method: str, auth: tuple) -> dict:
    op: dict = {"operationId": f"{method}_{re.sub(r'[^a-z0-9]+', '_', path.lower()).strip('_')}",
                "responses": {"default": {"description": "error", "content": {"application/json": {"schema": ERROR}}}}}
    status, schema = RESPONSES.get((path, method), ("200", {"type": "object"}))
    schema = _paged(path, method, schema)
    if method == "head":
        op["responses"]["200"] = {"description": "present"}
    elif path.startswith("/v1/artifacts") and method == "get":
        op["responses"]["200"] = {"description": "the bytes",
                                  "content": {"application/octet-stream": {"schema": {"type": "string",
                                                                                      "format": "binary"}}}}
    elif path == "/v1/ca.pem":
        op["responses"]["200"] = {"description": "the CA certificate",
                                  "content": {"application/x-pem-file": {"schema": {"type": "string"}}}}
    elif path == "/v1/ssh-host-ca.pub":
        op["responses"]["200"] = {"description": "the SSH host CA's public key, one known_hosts line",
                                  "content": {"text/plain": {"schema": {"type": "string"}}}}
    else:
        op["responses"][status] = {"description": "ok", "content": {"application/json": {"schema": schema}}}
    if auth:
        op["security"] = [{"bearer": []}]
        op["x-token-kinds"] = list(auth)
    body = REQUEST_BODIES.get((path, method))
    if body is not None:
        op["requestBody"] = {"required": (path, method) not in OPTIONAL_BODIES,
                             "content": {"application/json": {"schema": body}}}
    elif path.startswith("/v1/artifacts") and method == "put":
        op["requestBody"] = {"required": True, "content": {"application/octet-stream": {
            "schema": {"type": "string", "format": "binary"}}}}
    params = [{"name": n, "in": "path", "required": True,
               "schema": {"type": "integer", "minimum": 0 if n == "index" else 1} if kind == "int" else
               (DIGEST if n == "digest" else {"type": "string"})}
              for n, kind in _PARAM.findall(path)]
    params += [{"name": n, "in": "query", "required": False, "schema": s}
               for n, s in QUERY_PARAMS.get((path, method), []) + _page_params(path, method)]
    if params:
        op["parameters"] = params
    return op


def document(routes) -> dict:
    """The OpenAPI 3.1 document for `routes` [(path, resource class, suffix)]."""
    paths: dict = {}
    for template, cls, suffix in routes:
        path = _PARAM.sub(lambda m: "{" + m.group(1) + "}", template)
        for method in METHODS:
            responder = f"on_{method}" + (f"_{suffix}" if suffix else "")
            if hasattr(cls, responder):
                paths.setdefault(path, {})[method] = _operation(path, method, getattr(cls, "auth", ("client",)))
    paths["/v1/openapi.json"] = {"get": _operation("/v1/openapi.json", "get", OpenAPI.auth)}
    return {"openapi": "3.1.0",
            "info": {"title": "GPUlayer", "version": str(PROTOCOL),
                     "description": "GPUlayer protocol v1 (docs/protocol.md). Every response carries "
                                    "X-GpuLayer-Protocol: 1."},
            "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
            "paths": paths}


class OpenAPI:
    """Serves the document to anyone: it describes the API, it holds no data."""

    auth = ()

    def __init__(self, deps, routes):
        self.doc = document(routes)

    def on_get(self, req, resp):
        resp.media = self.doc
