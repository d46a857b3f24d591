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
import sys
import time

import pytest

from faultlib import check_state
from netns import VethNamespace, netns_exec, veth_namespace

from gpulayer.testing import ControlPlaneProcess, wait_for

pytestmark = [pytest.mark.netns, pytest.mark.timeout(120)]

TTL_S = 3.0


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
        self.net = net
        self.srv = ControlPlaneProcess(root, host=net.host_ip, tls=True, heartbeat_interval=0.5,
                                       lease_ttl=TTL_S).start()

    def worker(self, name: str, *, in_netns: bool) -> int:
        """Start `gpulayer worker start` (inside the namespace or not); its worker id once online."""
        proc = self.srv.start_worker(name, wait=False, prefix=netns_exec(self.net.name) if in_netns else [],
                                     parallel=None, cpus=2, gpus=0)
        return self.srv.wait_worker_online(name, process=proc)["id"]

    def submit(self, seconds: float, retry_seconds: float | None = None) -> int:
        """A job that sleeps `seconds` (its retry, `retry_seconds` if given) and prints done."""
        later = seconds if retry_seconds is None else retry_seconds
        code = f"import os, time; time.sleep({seconds} if os.environ['GPULAYER_ATTEMPT'] == '1' else {later}); print('done')"
        return self.srv.submit({"command": [sys.executable, "-c", code],
                                "retry": {"max_attempts": 2, "retry_on": ["worker_lost"]}})

    def job(self, job_id: int) -> dict:
        return self.srv.job(job_id)

    def events(self, job_id: int) -> list[dict]:
        return self.srv.events(job_id)

    def running_on(self, job_id: int, worker_id: int) -> dict | None:
        return next((t for t in self.job(job_id)["tasks"]
                     if t["state"] == "running" and t["worker_id"] == worker_id), None)

    def link(self, up: bool) -> None:
        self.net.link(up)

    def logs(self) -> str:
        return self.srv.logs()

    def close(self) -> None:
        self.srv.close()


@pytest.fixture
def part(tmp_path, netns):
    p = Partition(tmp_path, netns)
    yield p
    p.close()


def _kinds(events: list[dict]) -> list[str]:
    return [e["kind"] for e in events]


def test_cut_longer_than_the_ttl_loses_the_task_retries_it_elsewhere_and_the_late_finish_is_only_an_event(part):
    a = part.worker("wa", in_netns=True)
    # The first copy outlasts anything a loaded machine may add to the cut (worker B's start, the
    # retry's placement), so only the control plane's word can end it; the retry is short.
    job = part.submit(120, retry_seconds=1)
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
    time.sleep(TTL_S / 3)  # 1 s down, 2 s to spare: a saturated CI machine needs the margin
    part.link(up=True)
    done = wait_for(lambda: part.job(job)["state"] in ("succeeded", "failed", "lost") and part.job(job), 30,
                    "the job to end")
    assert done["state"] == "succeeded", done
    assert len(done["tasks"]) == 1 and done["tasks"][0]["worker_id"] == a
    kinds = _kinds(part.events(job))
    assert not {"task_lost", "job_retried", "late_finish"} & set(kinds), kinds
    worker_events = part.srv.get_json("/v1/workers")["workers"]
    assert {w["name"]: w["state"] for w in worker_events}["wa"] == "online"
    assert check_state(part.srv.state) == []

