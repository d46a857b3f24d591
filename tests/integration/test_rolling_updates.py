"""Rolling updates end to end (issue 39): a real HTTP service on real workers (separate processes) behind the
real control plane's ingress, under a steady load from a real client the whole time.

`gpulayer service update --wait` rolls the replica to a new revision with no request failed; a revision whose
health path never answers 2xx is rolled back within its health check's failures x interval, the old replica
serving throughout (no request failed either); a control plane SIGKILLed right after an update was
accepted finishes the rollout after its restart, nothing left half-done; a canary's share through the
ingress and its promote over plain HTTP; and a worker lost (SIGKILL) with the new replica before it was
ready: the old replica serves on (no request failed), the rollout waits to place it again, and
`service rollback` ends it. One plane and two workers for the
module (the surge needs a second worker: a service's replicas never share one).
"""

from __future__ import annotations

import sys
import threading
import time

import pytest
import requests

from gpulayer.testing import ControlPlaneProcess, wait_for

pytest.importorskip("granian")
pytestmark = [pytest.mark.timeout(240)]

REPLICA = r"""
import http.server, os, time
REV, BROKEN = os.environ.get("REV", "?").encode(), bool(os.environ.get("BROKEN"))
READY_AT = time.monotonic() + float(os.environ.get("READY_AFTER", "0"))

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        unready = BROKEN or time.monotonic() < READY_AT
        status, body = (500, b"broken") if self.path == "/healthz" and unready else (200, REV)
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

Server(("0.0.0.0", int(os.environ["PORT"])), H).serve_forever()
"""
HEALTH = {"http_path": "/healthz", "interval_s": 0.5, "failures": 2}


class Load:
    """GETs through the ingress one after another on a thread: what each answered (or how it failed)."""

    def __init__(self, url: str, token: str, verify):
        self.url, self.verify = url, verify
        self.headers = {"Authorization": f"Bearer {token}"}
        self.answers: list[str] = []
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with requests.Session() as session:
            while not self._stop.is_set():
                try:
                    r = session.get(self.url, headers=self.headers, verify=self.verify, timeout=30)
                except requests.RequestException as exc:
                    self.failed.append(type(exc).__name__)
                    continue
                (self.failed if r.status_code >= 500 else self.answers).append(f"{r.status_code} {r.text[:20]}")

    def __enter__(self) -> "Load":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    with ControlPlaneProcess(tmp_path_factory.mktemp("rollout"), heartbeat_interval=0.5, lease_ttl=5,
                             args=["--http", "granian"]).start(timeout=120) as plane:
        for name in ("ra", "rb"):
            plane.start_worker(name, timeout=120)
        yield plane


@pytest.fixture(scope="module")
def service(plane) -> int:
    job_id = plane.submit({"command": [sys.executable, "-c", REPLICA], "env": {"REV": "r1"},
                           "service": {"replicas": 1, "ingress": {}, "health": HEALTH}})
    url = f"{plane.url}/ingress/{job_id}/"
    wait_for(lambda: requests.get(url, headers=plane.headers(), timeout=5).text == "r1", 60, "the service to serve")
    return job_id


def _revision(plane, job_id: int) -> dict:
    return plane.get_json(f"/v1/jobs/{job_id}/service")


def test_a_rolling_update_under_load_fails_no_request(plane, service):
    with Load(f"{plane.url}/ingress/{service}/", plane.client_token, plane.verify) as load:
        wait_for(lambda: len(load.answers) >= 20, 30, "the load to run")
        done = plane.cli("service", "update", str(service), "--env", "REV=r2", "--drain", "5", "--wait", "90",
                         timeout=120)
        assert done.returncode == 0, done.stderr + plane.logs()
        assert "revision 2 finished" in done.stdout, done.stdout
        seen = len(load.answers)
        wait_for(lambda: len(load.answers) >= seen + 20, 30, "answers after the update")
    assert load.failed == [], load.failed[:10]
    assert "200 r1" in load.answers and load.answers[-1] == "200 r2"
    assert _revision(plane, service)["revision"] == 2
    wait_for(lambda: _revision(plane, service)["replicas"] == [{"revision": 2, "replicas": 1, "ready": 1, "draining": 0}],
             30, "the old replica to drain and stop")
    kinds = [e["kind"] for e in plane.events(service)]
    for kind in ("service_update_started", "replica_surged", "replica_draining", "replica_drained",
                 "service_update_finished"):
        assert kind in kinds, kind


def test_a_revision_never_healthy_rolls_back_and_the_old_replica_serves_throughout(plane, service):
    with Load(f"{plane.url}/ingress/{service}/", plane.client_token, plane.verify) as load:
        wait_for(lambda: len(load.answers) >= 20, 30, "the load to run")
        started = time.time()
        done = plane.cli("service", "update", str(service), "--env", "BROKEN=1", "--wait", "90", timeout=120)
        assert done.returncode == 1, done.stdout + done.stderr
        assert "rolled back (not_ready" in done.stdout or "rolled back (crash_loop" in done.stdout, done.stdout
    assert load.failed == [], load.failed[:10]
    assert set(load.answers) == {"200 r2"}
    update = _revision(plane, service)["updates"][0]
    assert update["state"] == "rolled_back" and update["finished_at"] - started < 30
    rolled = next(e for e in plane.events(service) if e["kind"] == "service_update_rolling_back")
    surged = [e for e in plane.events(service) if e["kind"] == "task_started"][-1]
    # within the health check's failures x interval (1 s) of the new replica's start, and an upkeep tick
    assert rolled["at"] - surged["at"] < HEALTH["failures"] * HEALTH["interval_s"] + 2.0, (rolled, surged)
    assert _revision(plane, service)["revision"] == 2


def test_a_control_plane_killed_mid_rollout_finishes_it_after_its_restart(plane, service):
    job = plane.client().get_job(service)
    shown = job.update(env={"REV": "r3"}, drain_s=2)
    assert shown["rollout"]["revision"] == 4   # 3 was the rolled-back one
    plane.kill()                               # SIGKILL: no shutdown of any kind
    plane.start(timeout=120)
    wait_for(lambda: _revision(plane, service)["revision"] == 4, 90, "the rollout to finish after the restart")
    assert _revision(plane, service)["rollout"] is None
    wait_for(lambda: _revision(plane, service)["replicas"] == [{"revision": 4, "replicas": 1, "ready": 1, "draining": 0}],
             30, "the old replica to drain and stop")
    url = f"{plane.url}/ingress/{service}/"
    wait_for(lambda: requests.get(url, headers=plane.headers(), timeout=5).text == "r3", 30, "revision 4 serving")


def test_a_canary_gets_its_share_of_the_ingress_until_promoted_over_plain_http(plane, service):
    answer = plane.request("PATCH", f"/v1/jobs/{service}/service", json={"env": {"REV": "r5"}, "canary": 50})
    assert answer.status_code == 200, answer.text
    assert answer.json()["rollout"]["canary"] == 50
    url = f"{plane.url}/ingress/{service}/"
    wait_for(lambda: {"revision": 5, "replicas": 1, "ready": 1, "draining": 0} in _revision(plane, service)["replicas"],
             60, "the canary to be ready")
    # the proxy reads the replicas again after its cache (1 s): then half the requests go to the canary
    wait_for(lambda: requests.get(url, headers=plane.headers(), timeout=10).text == "r5", 30, "the canary's share")
    seen = [requests.get(url, headers=plane.headers(), timeout=10).text for _ in range(40)]
    assert set(seen) == {"r3", "r5"}, seen            # 50%: 40 draws miss one side once in 10^12
    promoted = plane.request("POST", f"/v1/jobs/{service}/service/promote")
    assert promoted.status_code == 200, promoted.text
    wait_for(lambda: _revision(plane, service)["revision"] == 5, 60, "the promoted rollout to finish")
    wait_for(lambda: requests.get(url, headers=plane.headers(), timeout=5).text == "r5", 30, "revision 5 alone")


def test_a_worker_lost_with_the_new_replica_leaves_the_old_one_serving(plane, service):
    job = plane.client().get_job(service)
    with Load(f"{plane.url}/ingress/{service}/", plane.client_token, plane.verify) as load:
        job.update(env={"REV": "r6", "READY_AFTER": "600"}, ready_timeout_s=900)
        def new_replica():
            found = [t for t in plane.job(service)["tasks"] if t.get("revision") == 6 and t["state"] == "running"]
            return found[0] if found else None
        surged = wait_for(new_replica, 60, "the new replica to start")
        plane.workers[surged["worker_name"]].kill()         # SIGKILL: its worker is lost with it
        wait_for(lambda: any(t["task_id"] == surged["task_id"] and t["state"] == "lost"
                             for t in plane.job(service)["tasks"]), 60, "the new replica to be lost")
        assert plane.job(service)["attempt"] == 1           # the attempt goes on: no retry stops the old replica
        wait_for(lambda: {"revision": 6, "replicas": 1, "ready": 0, "draining": 0} in _revision(plane, service)["replicas"],
                 30, "the rollout to surge the new replica again")
        done = plane.cli("service", "rollback", str(service), "--wait", "60", timeout=90)
        assert done.returncode == 0 and "rolled back (requested)" in done.stdout, done.stdout + done.stderr
    assert load.failed == [], load.failed[:10]
    assert set(load.answers) == {"200 r5"}
