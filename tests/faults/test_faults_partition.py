"""Partition: a real worker in its own network namespace loses its link to the control plane.

The test (as root) makes a namespace and a veth pair with their own addresses;
the control plane listens over TLS on the host side's address with a short
lease (heartbeat 0.5 s, TTL 3 s); worker A runs inside the namespace, worker B
on the host. `ip link set down` on the host end cuts A off.

- Longer than the TTL: A's task is lost and retried on B; when the link comes
  back, A kills its copy and its late finish only adds a `late_finish` event.
- Shorter than the TTL: nothing is lost or retried.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import requests

from faultlib import CLI, ServerProc, check_state, clean_env, wait_for
from netns import VethNamespace, veth_namespace

pytestmark = [pytest.mark.netns, pytest.mark.timeout(120)]

TTL_S = 3.0
SERVER_ARGS = ["--heartbeat-interval", "0.5", "--lease-ttl", str(TTL_S)]


@pytest.fixture
def netns():
    """A namespace and a veth pair with their own addresses (tests/netns.py); removed afterwards."""
    tag = os.getpid() % 100_000
    net = veth_namespace(VethNamespace(f"glpart{tag}", f"glh{tag}", f"gln{tag}",
                                       f"10.231.{tag % 250}.1", f"10.231.{tag % 250}.2"))
    try:
        yield net
    finally:
        net.delete()


class Partition:
    """A TLS control plane on the host end of the veth, workers on either side."""

    def __init__(self, root, net):
        from gpulayer.certs import make_ca, make_server_cert
        self.root, self.net = root, net
        ca, ca_key = make_ca(root / "tls")
        cert, key = make_server_cert(root / "tls", ca, ca_key, [], [net.host_ip])
        self.srv = ServerProc(root / "home", host=net.host_ip, args=SERVER_ARGS,
                              tls={"cert": cert, "key": key, "ca": ca}).start()
        self.http = requests.Session()
        self.http.verify = str(ca)
        self.http.trust_env = False  # $REQUESTS_CA_BUNDLE would override verify
        self.http.headers["Authorization"] = f"Bearer {self.srv.tokens['client_token']}"
        self.workers: dict[str, subprocess.Popen] = {}

    def worker(self, name: str, *, in_netns: bool) -> int:
        """Start `gpulayer worker start` (inside the namespace or not); its worker id once online."""
        argv = [*CLI, "--url", self.srv.url, "--ca-file", str(self.srv.tls["ca"]), "worker", "start",
                "--name", name, "--state-dir", str(self.root / name), "--cpus", "2", "--gpus", "0"]
        if in_netns:
            argv = ["ip", "netns", "exec", self.net.name, *argv]
        log = open(self.root / f"{name}.log", "w")
        env = clean_env(GPULAYER_JOIN_TOKEN=self.srv.tokens["join_token"],
                        GPULAYER_ARTIFACT_CACHE=str(self.root / f"{name}-cache"))
        self.workers[name] = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        return wait_for(lambda: self._online(name), 30, f"worker {name} online")

    def _online(self, name: str) -> int | None:
        for proc_name, proc in self.workers.items():
            if proc.poll() is not None:
                raise AssertionError(f"worker {proc_name} exited:\n{self.logs()}")
        for w in self.http.get(f"{self.srv.url}/v1/workers", timeout=5).json()["workers"]:
            if w["name"] == name and w["state"] == "online":
                return w["id"]
        return None

    def submit(self, seconds: float) -> int:
        spec = {"command": [sys.executable, "-c", f"import time; time.sleep({seconds}); print('done')"],
                "retry": {"max_attempts": 2, "retry_on": ["worker_lost"]}}
        r = self.http.post(f"{self.srv.url}/v1/jobs", json=spec, timeout=10)
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def job(self, job_id: int) -> dict:
        return self.http.get(f"{self.srv.url}/v1/jobs/{job_id}", timeout=10).json()

    def events(self, job_id: int) -> list[dict]:
        return self.http.get(f"{self.srv.url}/v1/jobs/{job_id}/events", timeout=10).json()["events"]

    def running_on(self, job_id: int, worker_id: int) -> dict | None:
        return next((t for t in self.job(job_id)["tasks"]
                     if t["state"] == "running" and t["worker_id"] == worker_id), None)

    def link(self, up: bool) -> None:
        self.net.link(up)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.root.glob("*.log")))

    def close(self) -> None:
        for proc in self.workers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.workers.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.srv.stop()


@pytest.fixture
def part(tmp_path, netns):
    p = Partition(tmp_path, netns)
    yield p
    p.close()


def _kinds(events: list[dict]) -> list[str]:
    return [e["kind"] for e in events]


def test_cut_longer_than_the_ttl_loses_the_task_retries_it_elsewhere_and_the_late_finish_is_only_an_event(part):
    a = part.worker("wa", in_netns=True)
    job = part.submit(6)
    first = wait_for(lambda: part.running_on(job, a), 30, "the task running on worker A (in the namespace)")
    b = part.worker("wb", in_netns=False)
    part.link(up=False)
    cut_at = time.monotonic()
    try:
        second = wait_for(lambda: part.running_on(job, b), 30, "the retry running on worker B (on the host)")
        time.sleep(max(0.0, cut_at + TTL_S + 1.0 - time.monotonic()))  # the cut outlasts the TTL
    finally:
        part.link(up=True)
    down_s = time.monotonic() - cut_at
    late = wait_for(lambda: [e for e in part.events(job) if e["kind"] == "late_finish"], 30,
                    f"worker A's late finish after the link returned\n{part.logs()}")
    assert late[0]["task_id"] == first["task_id"] and late[0]["worker_id"] == a
    assert late[0]["data"]["outcome"] == "cancelled", "worker A should kill its copy, not run it to the end"
    done = wait_for(lambda: part.job(job)["state"] in ("succeeded", "failed", "lost") and part.job(job), 30,
                    "the job to end")
    assert done["state"] == "succeeded", done
    tasks = {t["task_id"]: t for t in done["tasks"]}
    assert len(tasks) == 2
    assert tasks[first["task_id"]]["state"] == "lost", "the late finish must not change the lost task"
    assert tasks[second["task_id"]]["state"] == "succeeded" and tasks[second["task_id"]]["worker_id"] == b
    kinds = _kinds(part.events(job))
    assert kinds.count("task_lost") == 1 and kinds.count("job_retried") == 1 and kinds.count("late_finish") == 1
    finished = [e for e in part.events(job) if e["kind"] == "task_finished"]
    assert [e["task_id"] for e in finished] == [second["task_id"]]
    assert check_state(part.srv.state) == []
    print(f"\npartition: link down {down_s:.1f} s > TTL {TTL_S} s: lost, retried on B, A's copy killed, late finish recorded")


def test_cut_shorter_than_the_ttl_loses_nothing(part):
    a = part.worker("wa", in_netns=True)
    job = part.submit(4)
    wait_for(lambda: part.running_on(job, a), 30, "the task running on worker A (in the namespace)")
    part.worker("wb", in_netns=False)
    part.link(up=False)
    time.sleep(TTL_S / 2)
    part.link(up=True)
    done = wait_for(lambda: part.job(job)["state"] in ("succeeded", "failed", "lost") and part.job(job), 30,
                    "the job to end")
    assert done["state"] == "succeeded", done
    assert len(done["tasks"]) == 1 and done["tasks"][0]["worker_id"] == a
    kinds = _kinds(part.events(job))
    assert not {"task_lost", "job_retried", "late_finish"} & set(kinds), kinds
    worker_events = part.http.get(f"{part.srv.url}/v1/workers", timeout=5).json()["workers"]
    assert {w["name"]: w["state"] for w in worker_events}["wa"] == "online"
    assert check_state(part.srv.state) == []

