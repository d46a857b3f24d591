"""GET /v1/openapi.json: the OpenAPI 3 document, built from the app's own route table.

Paths and methods come from the routes and the responders the resources
define, so the document cannot drift from what is served (a test checks it).
"""
from __future__ import annotations

import re

from gpulayer.server.config import PROTOCOL

ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["code", "message"],
    "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}}}
STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
DIGEST = {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"}
NUM = {"type": "number", "minimum": 0}
INT = {"type": "integer", "minimum": 0}

JOB_SPEC = {
    "type": "object", "required": ["command"], "additionalProperties": False,
    "properties": {
        "command": {"type": "array", "minItems": 1, "items": {"type": "string"}},
        "name": {"type": ["string", "null"]}, "env": STR_MAP, "labels": STR_MAP,
        "accelerator": {"enum": ["cuda", None]}, "gpus": INT, "cpus": NUM, "memory_mb": INT,
        "retry": {"type": "object", "properties": {"max_attempts": {"type": "integer", "minimum": 1},
                                                   "retry_on": {"type": "array", "items": {"type": "string"}}}},
        "timeout_seconds": {"type": ["number", "null"]}, "silence_timeout_seconds": {"type": ["number", "null"]},
        "source": {"type": ["string", "null"]}, "inputs": STR_MAP,
        "outputs": {"type": "array", "items": {"type": "string"}},
        "nodes": {"type": "integer", "minimum": 1}, "priority": {"type": "integer"},
        "secrets": {"type": "array", "items": {"type": "string"}},
        "service": {"type": ["object", "null"]},
    },
}
# acquire, and finish with `next`: `task` as in protocol v1; `more` only when the request named max_tasks
MAX_TASKS = {"type": "integer", "minimum": 1, "maximum": 1024,
             "description": "assignments one answer may carry (capped by the worker's free slots and 16)"}
ASSIGNMENT = {"type": "object", "required": ["task_id", "job_id", "attempt", "command", "env", "gpus"], "properties": {
    "task_id": {"type": "integer"}, "job_id": {"type": "integer"}, "attempt": {"type": "integer", "minimum": 1},
    "index": INT, "command": {"type": "array", "items": {"type": "string"}}, "env": STR_MAP,
    "source": {"type": ["string", "null"]}, "inputs": STR_MAP, "outputs": {"type": "array", "items": {"type": "string"}},
    "gpus": {"type": "array", "items": INT}, "cpus": NUM, "memory_mb": INT, "service": {"type": ["object", "null"]},
    "rank": INT, "world_size": {"type": "integer", "minimum": 1},
    "timeout_seconds": {"type": ["number", "null"]}, "silence_timeout_seconds": {"type": ["number", "null"]}}}
ASSIGNMENTS = {"task": {"oneOf": [ASSIGNMENT, {"type": "null"}]}, "more": {"type": "array", "items": ASSIGNMENT}}
JOB = {"type": "object", "required": ["id", "state", "created_at", "spec", "tasks"], "properties": {
    "id": {"type": "integer"}, "name": {"type": ["string", "null"]}, "state": {"type": "string"},
    "created_at": {"type": "number"}, "spec": {"type": "object"}, "tasks": {"type": "array"}}}

REQUEST_BODIES = {
    ("/v1/jobs", "post"): JOB_SPEC,
    ("/v1/workers/register", "post"): {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string"}, "labels": STR_MAP, "version": {"type": "string"},
        "advertise_address": {"type": ["string", "null"]}, "slots": {"type": "integer", "minimum": 1},
        "resources": {"type": "object", "properties": {"cpus": NUM, "gpus": INT, "memory_mb": INT,
                                                       "gpu_models": {"type": "array", "items": {"type": "string"}}}}}},
    ("/v1/worker/heartbeat", "post"): {"type": "object", "properties": {"tasks": {"type": "array", "items": {
        "type": "object", "required": ["task_id"], "properties": {
            "task_id": {"type": "integer"}, "state": {"type": "string"},
            "endpoint": {"type": ["string", "null"]}, "restarts": INT}}}}},
    ("/v1/worker/acquire", "post"): {"type": "object", "properties": {"wait_s": {"type": "number", "minimum": 0,
                                                                                "maximum": 1},
                                                                     "max_tasks": MAX_TASKS}},
    ("/v1/worker/tasks/{task_id}/start", "post"): {"type": "object", "properties": {"pid": INT}},
    ("/v1/worker/tasks/{task_id}/logs", "post"): {"type": "object", "required": ["lines"], "properties": {
        "lines": {"type": "array", "items": {"type": "object", "required": ["text"], "properties": {
            "n": INT, "stream": {"enum": ["stdout", "stderr", "system"]}, "text": {"type": "string"},
            "at": NUM}}}}},
    ("/v1/worker/tasks/{task_id}/rendezvous", "post"): {"type": "object", "required": ["address", "port"],
                                                        "properties": {"address": {"type": "string"},
                                                                       "port": {"type": "integer"}}},
    ("/v1/worker/tasks/{task_id}/finish", "post"): {"type": "object", "required": ["outcome"], "properties": {
        "exit_code": {"type": ["integer", "null"]},
        "outcome": {"enum": ["succeeded", "failed", "cancelled", "timed_out"]},
        "outputs": STR_MAP, "reason": {"type": ["string", "null"]}, "next": {"type": "boolean"},
        "max_tasks": MAX_TASKS,
        "lines": {"type": "array", "items": {"type": "object", "required": ["text"], "properties": {
            "n": INT, "stream": {"enum": ["stdout", "stderr", "system"]}, "text": {"type": "string"},
            "at": NUM}}}}},
    ("/v1/tokens", "post"): {"type": "object", "required": ["name"], "additionalProperties": False, "properties": {
        "name": {"type": "string"}, "labels": STR_MAP, "expires_in_s": {"type": ["number", "null"]},
        "kind": {"enum": ["join", "metrics"]}}},
    ("/v1/secrets/{name}", "put"): {"type": "object", "required": ["value"], "properties": {
        "value": {"type": "string"}, "labels": STR_MAP}},
}
RESPONSES = {
    ("/v1/jobs", "post"): ("201", JOB),
    ("/v1/jobs/{job_id}", "get"): ("200", JOB),
    ("/v1/jobs", "get"): ("200", {"type": "object", "required": ["jobs"],
                                  "properties": {"jobs": {"type": "array", "items": JOB}}}),
    ("/v1/health", "get"): ("200", {"type": "object", "required": ["ok", "protocol"]}),
    ("/v1/tokens", "post"): ("201", {"type": "object", "required": ["token", "jti", "name", "kind"]}),
    ("/v1/artifacts/{digest}", "put"): ("201", {"type": "object", "required": ["digest", "size"]}),
    ("/v1/worker/acquire", "post"): ("200", {"type": "object", "required": ["task"], "properties": ASSIGNMENTS}),
    ("/v1/worker/tasks/{task_id}/finish", "post"): ("200", {"type": "object", "required": ["accepted"], "properties": {
        "accepted": {"type": "boolean"}, **ASSIGNMENTS}}),
    ("/v1/provisioners", "get"): ("200", {"type": "object", "required": ["provisioners", "requests"], "properties": {
        "provisioners": {"type": "array", "items": {"type": "object"}},
        "requests": {"type": "array", "items": {"type": "object", "required": ["id", "provisioner", "profile",
                                                                               "state", "slurm_job_id", "last_error"]}}}}),
}
QUERY_PARAMS: dict[tuple[str, str], list[tuple[str, dict]]] = {
    ("/v1/jobs", "get"): [("state", {"type": "string"}), ("limit", {"type": "integer"}),
                          ("before", {"type": "integer"})],
    ("/v1/jobs/{job_id}/logs", "get"): [("after", {"type": "integer"}), ("limit", {"type": "integer"}),
                                        ("wait_s", {"type": "number", "minimum": 0, "maximum": 1})],
    ("/v1/workers", "get"): [("all", {"type": "boolean"})],
    ("/v1/provisioners", "get"): [("limit", {"type": "integer", "minimum": 1, "maximum": 1000})],
}
METHODS = ("get", "post", "put", "delete", "head")
_PARAM = re.compile(r"\{(\w+)(?::(\w+))?\}")


def _operation(path: str, method: str, auth: tuple) -> dict:
    op: dict = {"operationId": f"{method}_{re.sub(r'[^a-z0-9]+', '_', path.lower()).strip('_')}",
                "responses": {"default": {"description": "error", "content": {"application/json": {"schema": ERROR}}}}}
    status, schema = RESPONSES.get((path, method), ("200", {"type": "object"}))
    if method == "head":
        op["responses"]["200"] = {"description": "present"}
    elif path.startswith("/v1/artifacts") and method == "get":
        op["responses"]["200"] = {"description": "the bytes",
                                  "content": {"application/octet-stream": {"schema": {"type": "string",
                                                                                      "format": "binary"}}}}
    elif path == "/v1/ca.pem":
        op["responses"]["200"] = {"description": "the CA certificate",
                                  "content": {"application/x-pem-file": {"schema": {"type": "string"}}}}
    else:
        op["responses"][status] = {"description": "ok", "content": {"application/json": {"schema": schema}}}
    if auth:
        op["security"] = [{"bearer": []}]
        op["x-token-kinds"] = list(auth)
    body = REQUEST_BODIES.get((path, method))
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    elif path.startswith("/v1/artifacts") and method == "put":
        op["requestBody"] = {"required": True, "content": {"application/octet-stream": {
            "schema": {"type": "string", "format": "binary"}}}}
    params = [{"name": n, "in": "path", "required": True,
               "schema": {"type": "integer", "minimum": 1} if kind == "int" else
               (DIGEST if n == "digest" else {"type": "string"})}
              for n, kind in _PARAM.findall(path)]
    params += [{"name": n, "in": "query", "required": False, "schema": s} for n, s in QUERY_PARAMS.get((path, method), [])]
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
