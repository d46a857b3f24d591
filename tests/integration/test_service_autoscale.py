"""Autoscaling and draining end to end (issue 39, points 1 and 5), against real processes: a real `server start`
(granian), two real workers, a service behind a `public` ingress (REPLICA: a threaded HTTP server on $PORT whose
GET /slow answers after 0.2 s), and load from threads in this process through the ingress. Three clients at
once (three requests in flight, target 1) scale it from 1 to 2 replicas (max) after `up_after_s`; one client
(one in flight) scales it back to 1 after `down_after_s`: the newest replica leaves the ingress's set, finishes
what it holds, and stops. Not one request of the whole run fails (a connection error or a 5xx), the service
runs on, and `job status` shows its replicas over time.

Scale to zero (point 2), on the same plane: a service with `min` 0 releases its replica once idle; the next
request through the ingress is held while a replica is placed and started, then answered. One whose replica
takes longer to start than its `cold_start_timeout_s` answers 503 `cold_start_timeout`, and a request past its
`max_held` 503 `cold_start_queue_full` at once; once the replica is up, requests are answered.
"""
from __future__ import annotations

import sys
import threading

import pytest
import requests

from gpulayer.client.specs import service
from gpulayer.testing import ControlPlaneProcess, wait_for

pytest.importorskip("granian")
pytestmark = pytest.mark.timeout(240)

REPLICA = r"""
import http.server, os, time
time.sleep(float(os.environ.get("START_DELAY", "0")))

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        if self.path.startswith("/slow"):
            time.sleep(0.2)
        body = os.environ["GPULAYER_TASK_ID"].encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

Server(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
"""


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    with ControlPlaneProcess(tmp_path_factory.mktemp("autoscale"), heartbeat_interval=0.3, lease_ttl=5,
                             args=["--http", "granian"]) as plane:
        plane.start_worker("as-1", timeout=60)
        plane.start_worker("as-2", timeout=60)
        yield plane


class Load:
    """`n` clients, each sending GET /slow through the ingress one after another; every answer counted."""

    def __init__(self, url: str):
        self.url, self.ok, self.failed, self.by_task = url, 0, [], {}
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def clients(self, n: int) -> None:
        while len(self.threads) > n:   # fewer: the last ones stop after their request in flight
            self.threads.pop().stop_me.set()
        while len(self.threads) < n:
            stop = threading.Event()
            thread = threading.Thread(target=self._run, args=(stop,), daemon=True)
            thread.stop_me = stop
            thread.start()
            self.threads.append(thread)

    def _run(self, stop: threading.Event) -> None:
        with requests.Session() as session:
            while not stop.is_set() and not self.stop.is_set():
                try:
                    answer = session.get(self.url + "slow", timeout=30)
                except requests.RequestException as exc:
                    self.failed.append(repr(exc))
                    continue
                if answer.status_code >= 500:
                    self.failed.append(f"{answer.status_code} {answer.text[:200]}")
                else:
                    self.ok += 1
                    self.by_task[answer.text] = self.by_task.get(answer.text, 0) + 1


def _scaling(plane, job_id):
    return plane.job(job_id)["scaling"]


def test_replicas_follow_the_load_and_the_one_removed_drops_nothing(plane):
    spec = service([sys.executable, "-c", REPLICA], ingress="public",
                   autoscale={"min": 1, "max": 2, "target_concurrency": 1, "up_after_s": 1, "down_after_s": 3})
    job_id = plane.submit(spec)
    url = f"{plane.url}/ingress/{job_id}/"
    wait_for(lambda: _scaling(plane, job_id)["ready"] == 1, 60, "the first replica to be ready", details=plane.logs)
    load = Load(url)
    try:
        load.clients(3)
        two = wait_for(lambda: (s := _scaling(plane, job_id))["ready"] == 2 and s, 60, "a second replica, ready",
                       details=plane.logs)
        assert [(h["from_replicas"], h["to_replicas"], h["why"]) for h in two["history"]] == [(1, 2, "up")]
        wait_for(lambda: len(load.by_task) == 2, 20, "both replicas to answer")
        load.clients(1)
        wait_for(lambda: (s := _scaling(plane, job_id))["replicas"] == 1 and s["draining"] == 0 and s, 60,
                 "the scale-down to one replica, its drain done", details=plane.logs)
        served = load.ok
        wait_for(lambda: load.ok > served + 3, 20, "requests after the drain")
    finally:
        load.stop.set()
        for thread in load.threads:
            thread.join(timeout=30)
    assert load.failed == [], load.failed[:5]
    job = plane.job(job_id)
    assert job["state"] == "running"
    kinds = [e["kind"] for e in plane.events(job_id)]
    assert kinds.count("service_scaled") == 2 and "replica_draining" in kinds and "replica_drained" in kinds
    drained = next(e for e in plane.events(job_id) if e["kind"] == "replica_drained")
    assert [t["state"] for t in job["tasks"] if t["task_id"] == drained["task_id"]] in (["cancelled"], ["succeeded"])
    status = plane.cli("job", "status", str(job_id))
    assert status.returncode == 0, status.stderr
    assert "replicas 1 -> 2" in status.stdout and "replicas 2 -> 1" in status.stdout and "(down: " in status.stdout
    assert plane.cli("job", "cancel", str(job_id)).returncode == 0


def _ready_once(plane, job_id):
    """The first replica was ready: now, or it was and the service went to zero already (a second idle
    is down_after_s here, shorter than a poll of the job under load)."""
    def ready() -> bool:
        scaling = _scaling(plane, job_id)
        return scaling["ready"] >= 1 or any(h["why"] == "zero" for h in scaling["history"])
    wait_for(ready, 60, "the first replica to be ready", details=lambda: f"{plane.job(job_id)} {plane.events(job_id)}")


def _at_zero(plane, job_id):
    """The job once scaled to zero: no live task left (its GPUs released), the drain done."""
    def zero():
        job = plane.job(job_id)
        live = [t for t in job["tasks"] if t["state"] in ("queued", "assigned", "running")]
        return job if job["scaling"]["replicas"] == 0 and not live else None
    return wait_for(zero, 60, f"job {job_id} to scale to zero", details=plane.logs)


def test_scaled_to_zero_the_next_request_is_held_then_served(plane):
    spec = service([sys.executable, "-c", REPLICA], ingress="public",
                   autoscale={"min": 0, "max": 1, "down_after_s": 1, "cold_start_timeout_s": 60})
    job_id = plane.submit(spec)
    url = f"{plane.url}/ingress/{job_id}/"
    _ready_once(plane, job_id)
    job = _at_zero(plane, job_id)
    assert job["state"] == "running"
    answer = requests.get(url + "hello", timeout=90)
    assert answer.status_code == 200, answer.text
    job = plane.job(job_id)
    assert [h["why"] for h in job["scaling"]["history"]] == ["zero", "wake"]
    assert answer.text == str(next(t["task_id"] for t in job["tasks"] if t["state"] == "running"))
    assert plane.cli("job", "cancel", str(job_id)).returncode == 0


def test_a_slow_cold_start_answers_503_with_a_clear_body_and_a_bounded_queue(plane):
    spec = service([sys.executable, "-c", REPLICA], ingress="public", env={"START_DELAY": "4"},
                   autoscale={"min": 0, "max": 1, "down_after_s": 1, "cold_start_timeout_s": 1.5, "max_held": 1})
    job_id = plane.submit(spec)
    url = f"{plane.url}/ingress/{job_id}/"
    _ready_once(plane, job_id)
    _at_zero(plane, job_id)
    answers: list[requests.Response] = []
    first = threading.Thread(target=lambda: answers.append(requests.get(url + "a", timeout=30)))
    first.start()
    wait_for(lambda: any(e["kind"] == "service_scaled" and e["data"]["why"] == "wake" for e in plane.events(job_id)),
             20, "the wake-up")
    full = requests.get(url + "b", timeout=30)
    assert full.status_code == 503 and full.json()["error"]["code"] == "cold_start_queue_full", full.text
    assert "max_held" in full.json()["error"]["message"] and full.headers["retry-after"] == "1"
    first.join(timeout=30)
    [late] = answers
    assert late.status_code == 503 and late.json()["error"]["code"] == "cold_start_timeout", late.text
    assert "cold_start_timeout_s" in late.json()["error"]["message"]
    metrics = requests.get(f"{plane.url}/metrics", headers={"Authorization": f"Bearer {plane.client_token}"},
                           timeout=30).text   # both refusals counted by code; nothing held any more
    for code in ("cold_start_queue_full", "cold_start_timeout"):
        assert f'gpulayer_ingress_cold_start_refused_total{{code="{code}",job_id="{job_id}"}} 1.0' in metrics, metrics
    assert f'gpulayer_ingress_held{{job_id="{job_id}"}}' not in metrics
    served = wait_for(lambda: (r := requests.get(url + "c", timeout=30)).status_code == 200 and r, 60,
                      "the replica woken to answer", details=plane.logs)
    assert served.text.isdigit()
    assert plane.cli("job", "cancel", str(job_id)).returncode == 0
