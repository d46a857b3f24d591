"""`gpulayer server start` as its own process over TLS, driven with plain `requests`.

Covers: a worker's whole cycle and a client over HTTPS verified against a CA
made here; leases expiring on the server's own schedule; plain HTTP on a
non-loopback address refused; SIGKILL during submits keeps every acknowledged
job; SIGTERM exits 0.
"""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from gpulayer.server.security import certs
from gpulayer.server.security.auth import init_home
from gpulayer.testing import wait_for

PROTO = {"X-GpuLayer-Protocol": "1"}
START_TIMEOUT_S = 20


class Server:
    """One `gpulayer server start` child process; its output is collected line by line."""

    def __init__(self, home, *args):
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpulayer.cli", "server", "start", "--home", str(home),
             "--heartbeat-interval", "0.5", "--lease-ttl", "3", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines: queue.Queue = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        self.url = None

    def _pump(self):
        for line in self.proc.stdout:
            self.output.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def wait_listening(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            if "listening on" in line:
                self.url = line.rsplit(" ", 1)[1].strip()
                return self.url
        raise AssertionError("server did not start:\n" + "".join(self.output))

    def wait_exit(self, timeout=15) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def servers():
    started: list[Server] = []

    def start(home, *args, wait=True) -> Server:
        s = Server(home, *args)
        started.append(s)
        if wait:
            s.wait_listening()
        return s
    yield start
    for s in started:
        s.stop()


@pytest.fixture
def tls(tmp_path):
    d = tmp_path / "tls"
    d.mkdir()
    ca, ca_key = certs.make_ca(d)
    cert, key = certs.make_server_cert(d, ca, ca_key, ["localhost"], ["127.0.0.1"])
    return {"ca": str(ca), "cert": str(cert), "key": str(key)}


@pytest.fixture
def server_home(tmp_path):
    home = tmp_path / "home"
    return home, init_home(home)


def test_worker_and_client_over_tls(servers, server_home, tls):
    home, tokens = server_home
    server = servers(home, "--host", "127.0.0.1", "--port", "0", "--tls-cert", tls["cert"], "--tls-key", tls["key"])
    base = server.url
    assert base.startswith("https://")
    s = requests.Session()
    s.trust_env = False  # else REQUESTS_CA_BUNDLE from the environment overrides s.verify
    s.verify = tls["ca"]
    assert s.get(f"{base}/v1/health", timeout=5).json() == {"ok": True, "protocol": 1}
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"{base}/v1/health", timeout=5)  # not trusted without the CA
    client = {"Authorization": f"Bearer {tokens['client_token']}"}
    join = {"Authorization": f"Bearer {tokens['join_token']}", **PROTO}

    def register(name):
        r = s.post(f"{base}/v1/workers/register", headers=join, timeout=5, json={
            "name": name, "labels": {}, "version": "test", "slots": 1,
            "resources": {"cpus": 4, "gpus": 1, "memory_mb": 1000, "gpu_models": ["H100"]}})
        assert r.status_code == 200, r.text
        body = r.json()
        assert 0.5 <= body["heartbeat_interval_s"] <= 0.6 and body["lease_ttl_s"] == 3  # jittered up to 20%
        return {"Authorization": f"Bearer {body['session_token']}", **PROTO}, body["worker_id"]

    # A worker that takes a task and goes silent: the server expires it on its own schedule.
    silent_h, silent_id = register("silent")
    doomed = s.post(f"{base}/v1/jobs", headers=client, json={"command": ["sleep", "100"]}, timeout=5).json()["id"]
    task = s.post(f"{base}/v1/worker/acquire", headers=silent_h, json={}, timeout=5).json()["task"]
    assert task["job_id"] == doomed
    assert s.post(f"{base}/v1/worker/tasks/{task['task_id']}/start", headers=silent_h, json={},
                  timeout=5).status_code == 200
    silent_since = time.monotonic()

    # The worker played by requests: register, heartbeat, acquire (long-poll woken by a submit), start, logs, finish.
    wh, wid = register("gpu-box")
    hb = s.post(f"{base}/v1/worker/heartbeat", headers=wh, json={"tasks": []}, timeout=5).json()
    assert hb["cancel_task_ids"] == [] and hb["revoked"] is False
    got: dict = {}
    poller = threading.Thread(target=lambda: got.update(s.post(f"{base}/v1/worker/acquire", headers=wh,
                                                               json={"wait_s": 10}, timeout=15).json()))
    poller.start()

    def parked() -> float:
        text = s.get(f"{base}/metrics", headers=client, timeout=5).text
        return next(m.samples[0].value for m in text_string_to_metric_families(text)
                    if m.name == "gpulayer_parked_acquires")
    wait_for(lambda: parked() == 1, 10, "the acquire to park (gpulayer_parked_acquires)")
    submitted = time.monotonic()
    r = s.post(f"{base}/v1/jobs", headers=client, timeout=5,
               json={"command": ["echo", "hello"], "name": "hello", "accelerator": "cuda"})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    poller.join(15)
    assert not poller.is_alive(), "the parked acquire was never answered"
    assert time.monotonic() - submitted < 5, "a parked acquire was not woken by the submit"
    a = got["task"]
    assert a["job_id"] == job_id and a["gpus"] == [0] and a["command"] == ["echo", "hello"]
    tid = a["task_id"]
    assert s.post(f"{base}/v1/worker/tasks/{tid}/start", headers=wh, json={"pid": 4242},
                  timeout=5).json() == {"ok": True}
    hb = s.post(f"{base}/v1/worker/heartbeat", headers=wh, timeout=5,
                json={"tasks": [{"task_id": tid, "state": "running", "endpoint": None, "restarts": 0}]}).json()
    assert hb["cancel_task_ids"] == []
    lines = [{"n": 0, "stream": "stdout", "text": "hello", "at": time.time()},
             {"n": 1, "stream": "stderr", "text": "done", "at": time.time()}]
    assert s.post(f"{base}/v1/worker/tasks/{tid}/logs", headers=wh, json={"lines": lines},
                  timeout=5).json()["accepted"] == 2
    r = s.post(f"{base}/v1/worker/tasks/{tid}/finish", headers=wh, json={"exit_code": 0, "outcome": "succeeded"},
               timeout=5)
    assert r.json() == {"accepted": True}

    # The client: status and logs.
    job = s.get(f"{base}/v1/jobs/{job_id}", headers=client, timeout=5).json()
    assert job["state"] == "succeeded" and job["tasks"][0]["worker_id"] == wid and job["exit_code"] == 0
    logs = s.get(f"{base}/v1/jobs/{job_id}/logs", headers=client, timeout=5).json()
    assert [(x["stream"], x["text"]) for x in logs["lines"]] == [("stdout", "hello"), ("stderr", "done")]
    assert s.get(f"{base}/v1/jobs", headers=client, timeout=5).json()["jobs"][0]["id"] == job_id

    # Meanwhile the silent worker's lease ran out with no request to prompt it.
    def doomed_state():
        return s.get(f"{base}/v1/jobs/{doomed}", headers=client, timeout=5).json()["state"] == "lost"
    wait_for(doomed_state, 10, "the silent worker's task to be expired (lost)")
    assert time.monotonic() - silent_since >= 3.0
    workers = {w["id"]: w["state"] for w in s.get(f"{base}/v1/workers", headers=client, timeout=5).json()["workers"]}
    assert workers[silent_id] == "offline"
    back = s.post(f"{base}/v1/worker/heartbeat", headers=silent_h, timeout=5,
                  json={"tasks": [{"task_id": task["task_id"], "state": "running", "endpoint": None,
                                   "restarts": 0}]}).json()
    assert back["cancel_task_ids"] == [task["task_id"]]
    workers = {w["id"]: w["state"] for w in s.get(f"{base}/v1/workers", headers=client, timeout=5).json()["workers"]}
    assert workers[silent_id] == "online"

    # SIGTERM: a clean exit, 0.
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait_exit() == 0, "".join(server.output)


def test_plain_http_on_non_loopback_refused(servers, server_home):
    home, _ = server_home
    server = servers(home, "--host", "0.0.0.0", "--port", "0", wait=False)
    code = server.wait_exit(30)
    while server.lines.get(timeout=5) is not None:  # all of its output
        pass
    out = "".join(server.output)
    assert code != 0
    assert "--allow-insecure-remote" in out, out
    assert "listening" not in out and not (home / "state.db").exists()


def test_sigkill_during_submits_keeps_acknowledged_jobs(servers, server_home):
    home, tokens = server_home
    server = servers(home, "--host", "127.0.0.1", "--port", "0")
    base = server.url
    client = {"Authorization": f"Bearer {tokens['client_token']}"}
    acked: dict[int, str] = {}
    stop = threading.Event()
    errors: list = []

    def submit_loop(n):
        s = requests.Session()
        i = 0
        while not stop.is_set():
            name = f"t{n}-{i}"
            i += 1
            try:
                r = s.post(f"{base}/v1/jobs", headers=client, json={"command": ["echo", name], "name": name},
                           timeout=5)
            except requests.RequestException:
                return  # the server died mid-request: not acknowledged
            if r.status_code == 201:
                acked[r.json()["id"]] = name
            else:
                errors.append(r.text)

    threads = [threading.Thread(target=submit_loop, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    wait_for(lambda: len(acked) >= 150, 20, "150 acknowledged submits", details=lambda: f"only {len(acked)}")
    server.proc.send_signal(signal.SIGKILL)
    server.wait_exit(10)
    stop.set()
    for t in threads:
        t.join(10)
        assert not t.is_alive(), "a submit loop hung after the server died"
    assert errors == []
    assert server.proc.returncode == -signal.SIGKILL

    again = servers(home, "--host", "127.0.0.1", "--port", "0")
    s = requests.Session()
    found: dict[int, str] = {}
    before = None
    while True:
        params = {"limit": 1000, **({"before": before} if before else {})}
        page = s.get(f"{again.url}/v1/jobs", headers=client, params=params, timeout=10).json()["jobs"]
        if not page:
            break
        found.update({j["id"]: j["name"] for j in page})
        before = page[-1]["id"]
    missing = {i: n for i, n in acked.items() if found.get(i) != n}
    assert missing == {}, f"{len(missing)} acknowledged jobs lost after SIGKILL"
    again.proc.send_signal(signal.SIGTERM)
    assert again.wait_exit() == 0, "".join(again.output)
