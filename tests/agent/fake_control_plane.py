"""A tiny in-memory control plane speaking protocol v1, for the agent's own tests.

Stdlib only. It checks the protocol header and the session token on every
worker call, hands out queued assignments, stores log lines once per
(task, n), keeps artifacts by digest and runs rendezvous. Switches let a test
take it "down" (503), make it speak another protocol, revoke the worker or
cancel a task.
"""

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SESSION = "glw_session"
JOIN = "glj_join"


def assignment(task_id, command, **fields):
    """An Assignment with protocol defaults."""
    base = {"task_id": task_id, "job_id": 100 + task_id, "attempt": 1, "index": 0, "command": command, "env": {},
            "source": None, "inputs": {}, "outputs": [], "gpus": [], "cpus": 0, "memory_mb": 0, "service": None,
            "rank": 0, "world_size": 1, "timeout_seconds": None, "silence_timeout_seconds": None}
    base.update(fields)
    return base


class FakeControlPlane:
    """State and switches; ``url`` once started."""

    def __init__(self, heartbeat_interval_s=0.2):
        self.heartbeat_interval_s = heartbeat_interval_s
        self.cond = threading.Condition()
        self.queue, self.assigned = [], {}
        self.starts, self.finishes, self.logs = {}, {}, {}
        self.heartbeats, self.registrations = [], []
        self.artifacts, self.rendezvous = {}, {}
        self.put_bytes = 0  # the bytes of every artifact PUT (a checkpoint's unchanged files are not sent again)
        self.cancel, self.log_posts = set(), 0
        self.down = False
        self.protocol = 1
        self.revoked = False
        self.deregistered = False
        self.missing_header = []
        self.acquires = []  # each acquire's body
        self.heartbeat_terms = {}  # added to register and heartbeat answers (a newer server's fields)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self):
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()  # shutdown() waits out one poll
        return self

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def submit(self, task):
        with self.cond:
            self.queue.append(task)
            self.cond.notify_all()

    def put_artifact(self, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self.artifacts[digest] = data
        return digest

    def wait_finish(self, task_id, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if task_id in self.finishes:
                return self.finishes[task_id]
            time.sleep(0.02)
        raise AssertionError(f"task {task_id} did not finish; starts={self.starts} logs={self.log_texts(task_id)}")

    def log_texts(self, task_id, stream=None):
        lines = self.logs.get(task_id, {})
        return [lines[n]["text"] for n in sorted(lines) if stream is None or lines[n]["stream"] == stream]

    # -- routes ------------------------------------------------------------
    def route(self, method, path, body, token):
        if path == "/v1/workers/register":
            if token != JOIN:
                return 401, {"error": {"code": "unauthorized", "message": "bad token"}}
            self.registrations.append(body)
            return 200, {"worker_id": 1, "session_token": SESSION, "heartbeat_interval_s": self.heartbeat_interval_s,
                         "lease_ttl_s": 5, "advertise_address": body.get("advertise_address") or "127.0.0.1",
                         **self.heartbeat_terms}
        if token != SESSION:
            return 401, {"error": {"code": "unauthorized", "message": "bad token"}}
        if path == "/v1/worker/heartbeat":
            self.heartbeats.append(body)
            return 200, {"cancel_task_ids": sorted(self.cancel), "revoked": self.revoked, "lease_expires_at": time.time() + 5,
                         **self.heartbeat_terms}
        if path == "/v1/worker/acquire":
            self.acquires.append(body)
            return 200, self._answer(self._acquire(float(body.get("wait_s") or 0), body.get("max_tasks") or 1),
                                     body)
        if path == "/v1/worker/deregister":
            self.deregistered = True
            return 200, {"ok": True}
        if path.startswith("/v1/worker/tasks/"):
            _, _, _, _, task_id, action = path.split("/")
            return self._task_call(int(task_id), action, body)
        return 404, {"error": {"code": "not_found", "message": path}}

    def _acquire(self, wait_s, max_tasks=1):
        with self.cond:
            self.cond.wait_for(lambda: self.queue, timeout=wait_s)
            taken, self.queue = self.queue[:max_tasks], self.queue[max_tasks:]
            for task in taken:
                self.assigned[task["task_id"]] = task
            return taken

    @staticmethod
    def _answer(taken, body):
        """`task`, and `more` when the request named `max_tasks` (as the real server answers)."""
        answer = {"task": taken[0] if taken else None}
        if body.get("max_tasks") is not None:
            answer["more"] = taken[1:]
        return answer

    def _task_call(self, task_id, action, body):
        if task_id not in self.assigned:
            return 409, {"error": {"code": "task_not_assigned", "message": "not yours"}}
        if action == "start":
            self.starts[task_id] = body
        elif action == "logs":
            self.log_posts += 1
            for line in body["lines"]:
                self.logs.setdefault(task_id, {}).setdefault(line["n"], line)
            return 200, {"ok": True, "accepted": len(body["lines"])}
        elif action == "finish":
            for line in body.get("lines") or []:  # the last lines ride along, as the real server stores them
                self.logs.setdefault(task_id, {}).setdefault(line["n"], line)
            self.finishes[task_id] = body
            if body.get("next"):
                return 200, {"accepted": True, **self._answer(self._acquire(0, body.get("max_tasks") or 1), body)}
            return 200, {"accepted": True}
        elif action == "rendezvous":
            return 200, self._rendezvous(self.assigned[task_id], body)
        return 200, {"ok": True}

    def _rendezvous(self, task, body):
        ranks = self.rendezvous.setdefault(task["job_id"], {})
        ranks[task["rank"]] = f"{body['address']}:{body['port']}"
        if len(ranks) < task["world_size"]:
            return {"ready": False}
        peers = [ranks[r] for r in range(task["world_size"])]
        master_addr, master_port = peers[0].rsplit(":", 1)
        return {"ready": True, "rank": task["rank"], "world_size": task["world_size"], "master_addr": master_addr,
                "master_port": int(master_port), "peers": peers}

    def _handler(self):
        plane = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _reply(self, status, payload=None, raw=None):
                data = raw if raw is not None else (json.dumps(payload).encode() if payload is not None else b"")
                self.send_response(status)
                self.send_header("X-GpuLayer-Protocol", str(plane.protocol))
                self.send_header("Content-Type", "application/json" if raw is None else "application/octet-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _body(self):
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _common(self):
                raw = self._body()
                if self.headers.get("X-GpuLayer-Protocol") != "1":
                    plane.missing_header.append(self.path)
                if plane.down:
                    self._reply(503, {"error": {"code": "unavailable", "message": "down"}})
                    return None
                if plane.protocol != 1:
                    self._reply(426, {"error": {"code": "protocol_mismatch", "message": "no"}, "protocol": plane.protocol, "client_protocol": 1})
                    return None
                token = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
                return raw, token

            def do_POST(self):
                common = self._common()
                if common is None:
                    return
                raw, token = common
                status, payload = plane.route("POST", self.path, json.loads(raw or b"{}"), token)
                self._reply(status, payload)

            def do_GET(self):
                if self._common() is None:
                    return
                digest = self.path.rsplit("/", 1)[-1]
                if digest not in plane.artifacts:
                    return self._reply(404, {"error": {"code": "not_found", "message": digest}})
                self._reply(200, raw=plane.artifacts[digest])

            def do_HEAD(self):
                if self._common() is None:
                    return
                self._reply(200 if self.path.rsplit("/", 1)[-1] in plane.artifacts else 404)

            def do_PUT(self):
                common = self._common()
                if common is None:
                    return
                raw, _ = common
                digest = self.path.rsplit("/", 1)[-1]
                if "sha256:" + hashlib.sha256(raw).hexdigest() != digest:
                    return self._reply(400, {"error": {"code": "digest_mismatch", "message": digest}})
                plane.artifacts[digest] = raw
                plane.put_bytes += len(raw)
                self._reply(201, {"digest": digest})

        return Handler
