"""Service specifics: HTTP health checks, weights, the restart decision."""

import os
import shutil
import sys
import time

import pytest

from agent.run.services import should_restart
from fake_control_plane import assignment

PY = sys.executable

UNHEALTHY_AFTER_3 = """
import http.server, os, time
port = int(os.environ["PORT"])
count = {"n": 0}
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        count["n"] += 1
        self.send_response(200 if count["n"] <= 3 else 500); self.end_headers()
    def log_message(self, *a): pass
print("serving", flush=True)
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def test_failing_health_check_restarts_the_replica(plane, start_worker):
    health = {"http_path": "/health", "interval_s": 0.2, "failures": 2}
    service = {"replicas": 1, "port": True, "restart": "always", "max_restarts": 1, "health": health, "weights": None}
    plane.submit(assignment(50, [PY, "-c", UNHEALTHY_AFTER_3], service=service))
    start_worker()
    finish = plane.wait_finish(50, timeout=40)
    system = plane.log_texts(50, "system")
    assert any(t.startswith("restart 1: health check failed 2 times in a row (GET /health: 500)") for t in system), system
    assert finish["outcome"] == "failed" and "health check failed" in finish["reason"]


def test_weights_are_a_local_path_in_argv_and_env(plane, start_worker):
    weights = plane.put_artifact(b"W" * 1000)
    code = "import os, sys; print(open(sys.argv[1], 'rb').read() == open(os.environ['GPULAYER_WEIGHTS'], 'rb').read() == b'W' * 1000)"
    service = {"replicas": 1, "port": False, "restart": "on_failure", "max_restarts": None, "health": None, "weights": weights}
    plane.submit(assignment(51, [PY, "-c", code, "{weights}"], service=service))
    start_worker()
    finish = plane.wait_finish(51)
    assert finish["outcome"] == "succeeded", plane.log_texts(51)
    assert plane.log_texts(51, "stdout") == ["True"]
    assert any("service ended" in t for t in plane.log_texts(51, "system"))


def test_cancelled_service_while_waiting_to_restart(plane, start_worker):
    service = {"replicas": 1, "port": True, "restart": "always", "max_restarts": None, "health": None, "weights": None}
    plane.submit(assignment(52, [PY, "-c", "print('bye')"], service=service))
    start_worker()
    deadline = time.time() + 15
    while not any(e["state"] == "restarting" for hb in plane.heartbeats for e in hb["tasks"]) and time.time() < deadline:
        time.sleep(0.05)
    plane.cancel.add(52)
    assert plane.wait_finish(52)["outcome"] == "cancelled"


def test_restart_policy():
    assert should_restart("always", 0, False)
    assert not should_restart("on_failure", 0, False)
    assert should_restart("on_failure", 1, False)
    assert should_restart("on_failure", 0, True)


SERVE = "import http.server, os; http.server.HTTPServer(('127.0.0.1', int(os.environ['PORT'])), http.server.BaseHTTPRequestHandler).serve_forever()"


def test_endpoint_reported_at_once_not_a_heartbeat_later(plane, start_worker):
    plane.heartbeat_interval_s = 30.0  # only the endpoint change can cause a second heartbeat
    service = {"replicas": 1, "port": True, "restart": "always", "max_restarts": None, "health": None, "weights": None}
    plane.submit(assignment(53, [PY, "-c", SERVE], service=service))
    worker = start_worker()
    deadline = time.time() + 10
    while not any(e["endpoint"] for hb in plane.heartbeats for e in hb["tasks"]) and time.time() < deadline:
        time.sleep(0.05)
    assert any(e["endpoint"] and e["endpoint"].startswith("127.0.0.1:") for hb in plane.heartbeats for e in hb["tasks"])
    assert worker.stop() == 0  # a stopping worker ends its replica (cancel comes by heartbeat, 30 s away)
    assert plane.wait_finish(53, timeout=5)["outcome"] == "cancelled"


@pytest.mark.parametrize("sandbox", ["auto", "none"])
def test_weights_are_linked_only_for_a_task_user_that_cannot_write_the_cached_file(plane, start_worker, tmp_path, sandbox):
    """A task that runs as the agent's own user (no sandbox here; a non-root agent, a root task) owns the cached
    file's inode: it gets a copy, so it cannot change the bytes the next job's weights come from (issue 36, 8)."""
    weights = plane.put_artifact(b"V" * 1000)
    service = {"replicas": 1, "port": False, "restart": "on_failure", "max_restarts": None, "health": None, "weights": weights}
    plane.submit(assignment(52, [PY, "-c", "print('ok')"], service=service))
    start_worker(sandbox=sandbox)
    assert plane.wait_finish(52)["outcome"] == "succeeded", plane.log_texts(52)
    cached = os.stat(tmp_path / "cache" / weights.split(":")[1])
    given = os.stat(next((tmp_path / "state" / "tasks").rglob(".gpulayer-weights")))
    dropped = sandbox == "auto" and os.geteuid() == 0 and shutil.which("bwrap") is not None  # to gpulayer-task
    assert (given.st_ino == cached.st_ino) is dropped and (cached.st_mode & 0o777) == 0o444, sandbox
