"""The agent's key scenarios against the fake control plane AND the real one: the fake's contract.

The other agent tests run against fake_control_plane.py (quick, with switches
the real server lacks). Here each scenario runs once against the fake and once
against a real `gpulayer server start` process (gpulayer.testing), the agent
in a thread of this process either way, through one small adapter per side. A
change to the real protocol that the fake does not follow (or the reverse)
fails here. The real plane is shared by the module; each scenario's worker and
jobs carry their own label, so no worker takes another scenario's job.
"""
from __future__ import annotations

import hashlib
import itertools
import sys
import uuid
from pathlib import Path

import pytest
from agenthelpers import RunningWorker
from fake_control_plane import JOIN, FakeControlPlane, assignment

from agent.worker import WorkerConfig
from gpulayer.testing import ControlPlaneProcess, host_pids, pid_alive, wait_for

pytestmark = pytest.mark.timeout(120)

PY = sys.executable
WAIT_S = 20  # every wait is bounded by this


class FakeSide:
    """The fake control plane, seen through the adapter the scenarios use."""

    #: A task the worker stopped on its own: the outcome the agent reports.
    stopped_outcome = "cancelled"

    def __init__(self, fake: FakeControlPlane):
        self.fake, self.url, self.join_token = fake, fake.url, JOIN
        self._ids = itertools.count(1)

    def submit(self, command, *, labels, inputs=None, outputs=()) -> int:
        task_id = next(self._ids)
        self.fake.submit(assignment(task_id, command, inputs=dict(inputs or {}), outputs=list(outputs)))
        return task_id

    def put_artifact(self, data: bytes) -> str:
        return self.fake.put_artifact(data)

    def artifact(self, digest: str) -> bytes:
        return self.fake.artifacts[digest]

    def finish(self, task_id: int) -> dict:
        """{outcome, exit_code, outputs} as the agent reported them."""
        body = self.fake.wait_finish(task_id, timeout=WAIT_S)
        return {"outcome": body["outcome"], "exit_code": body["exit_code"], "outputs": body.get("outputs") or {}}

    def log_texts(self, task_id: int, stream: str | None = None) -> list[str]:
        return self.fake.log_texts(task_id, stream)

    def running(self, task_id: int) -> bool:
        return any(e["task_id"] == task_id and e["state"] == "running"
                   for hb in list(self.fake.heartbeats) for e in hb["tasks"])

    def cancel(self, task_id: int) -> None:
        self.fake.cancel.add(task_id)

    def registered(self, name: str) -> bool:
        return any(r["name"] == name for r in self.fake.registrations)

    def deregistered(self, name: str) -> bool:
        return self.fake.deregistered

    def go_down(self) -> None:
        self.fake.down = True  # 503 unavailable to every call

    def come_up(self) -> None:
        self.fake.down = False


class RealSide:
    """A real control plane process, seen through the same adapter: what the server recorded."""

    #: The agent's `cancelled` finish that nobody asked for: recorded `lost` (worker_stopped), docs/protocol.md.
    stopped_outcome = "lost"

    def __init__(self, plane: ControlPlaneProcess):
        self.plane, self.url, self.join_token = plane, plane.url, plane.join_token

    def submit(self, command, *, labels, inputs=None, outputs=()) -> int:
        return self.plane.submit({"command": command, "labels": labels, "inputs": dict(inputs or {}),
                                  "outputs": list(outputs)})

    def put_artifact(self, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        answer = self.plane.request("PUT", f"/v1/artifacts/{digest}", data=data)
        assert answer.status_code in (200, 201), answer.text
        return digest

    def artifact(self, digest: str) -> bytes:
        answer = self.plane.request("GET", f"/v1/artifacts/{digest}")
        answer.raise_for_status()
        return answer.content

    def _task(self, job_id: int) -> dict:
        return self.plane.job(job_id)["tasks"][0]

    def finish(self, job_id: int) -> dict:
        """{outcome, exit_code, outputs} as the server recorded the agent's finish."""
        task = wait_for(lambda: (t := self._task(job_id))["finished_at"] and t, WAIT_S,
                        f"job {job_id}'s task to finish", details=self.plane.logs)
        outputs = self.plane.get_json(f"/v1/jobs/{job_id}/outputs")["outputs"]
        return {"outcome": task["state"], "exit_code": task["exit_code"], "outputs": outputs}

    def log_texts(self, job_id: int, stream: str | None = None) -> list[str]:
        texts, after = [], 0
        while True:
            page = self.plane.get_json(f"/v1/jobs/{job_id}/logs", params={"after": after, "limit": 1000})
            if not page["lines"]:
                return texts
            texts += [line["text"] for line in page["lines"] if stream is None or line["stream"] == stream]
            after = page["next"]

    def running(self, job_id: int) -> bool:
        return self._task(job_id)["state"] == "running"

    def cancel(self, job_id: int) -> None:
        self.plane.request("POST", f"/v1/jobs/{job_id}/cancel").raise_for_status()

    def registered(self, name: str) -> bool:
        return self.plane.online_worker(name) is not None

    def deregistered(self, name: str) -> bool:
        listed = self.plane.get_json("/v1/workers", params={"all": "true"})["workers"]
        return any(w["name"] == name and w["state"] == "gone" and w["gone_reason"] == "deregistered" for w in listed)

    def go_down(self) -> None:
        self.plane.stop()  # nothing listens: connection refused

    def come_up(self) -> None:
        self.plane.start()


@pytest.fixture(scope="module")
def real_plane(tmp_path_factory):
    with ControlPlaneProcess(tmp_path_factory.mktemp("real-plane"), heartbeat_interval=0.2, lease_ttl=10) as plane:
        yield plane


@pytest.fixture(params=["fake", "real"])
def side(request):
    if request.param == "fake":
        fake = FakeControlPlane().start()
        yield FakeSide(fake)
        fake.stop()
    else:
        plane = request.getfixturevalue("real_plane")
        if not plane.running:
            plane.start()  # a scenario that failed while the plane was down
        yield RealSide(plane)


@pytest.fixture
def agent(side, tmp_path, request):
    """start() an agent worker (in a thread) for this scenario; its jobs carry `labels`. Stopped after the test."""
    name = f"contract-{request.node.name.split('[')[0].removeprefix('test_')}-{request.node.callspec.id}"
    labels = {"contract": name}
    workers = []

    def start(**overrides) -> RunningWorker:
        settings = dict(url=side.url, join_token=side.join_token, name=name, labels=labels,
                        state_dir=str(tmp_path / "state"), artifact_cache=str(tmp_path / "cache"), kill_grace_s=1.0,
                        acquire_wait_s=0.5, gpu_probe=list, cpus=2, ram_mb=1024)
        settings.update(overrides)
        worker = RunningWorker(WorkerConfig(**settings))
        workers.append(worker)
        return worker

    start.name, start.labels = name, labels
    yield start
    for worker in workers:
        worker.stop()


def test_register_run_logs_finish_and_deregister(side, agent):
    worker = agent()
    wait_for(lambda: side.registered(agent.name), WAIT_S, f"{agent.name} to register")
    ok = side.submit([PY, "-c", "import sys\nfor i in range(50): print('line', i)\nprint('err', file=sys.stderr)"],
                     labels=agent.labels)
    failing = side.submit([PY, "-c", "import sys; sys.exit(3)"], labels=agent.labels)
    assert side.finish(ok) == {"outcome": "succeeded", "exit_code": 0, "outputs": {}}
    assert side.log_texts(ok, "stdout") == [f"line {i}" for i in range(50)]
    assert side.log_texts(ok, "stderr") == ["err"]
    done = side.finish(failing)
    assert (done["outcome"], done["exit_code"]) == ("failed", 3)
    assert worker.stop() == 0
    wait_for(lambda: side.deregistered(agent.name), WAIT_S, f"{agent.name} to deregister")


def test_inputs_in_outputs_uploaded(side, agent):
    data = side.put_artifact(b"contract input")
    code = ("import os, pathlib; os.makedirs('out', exist_ok=True);"
            " pathlib.Path('out/result.txt').write_text(pathlib.Path('data/in.txt').read_text().upper())")
    job = side.submit([PY, "-c", code], labels=agent.labels, inputs={"data/in.txt": data}, outputs=["out/"])
    agent()
    done = side.finish(job)
    assert done["outcome"] == "succeeded" and set(done["outputs"]) == {"out/result.txt"}, done
    assert side.artifact(done["outputs"]["out/result.txt"]) == b"CONTRACT INPUT"


def test_heartbeat_driven_cancel_kills_the_process(side, agent):
    marker = f"contract-cancel-{uuid.uuid4().hex}"  # its pids are found from outside: a sandboxed task has its own
    code = f"import time; print('ready', flush=True); time.sleep(600)  # {marker}"
    job = side.submit([PY, "-c", code], labels=agent.labels)
    agent()
    wait_for(lambda: "ready" in side.log_texts(job, "stdout"), WAIT_S, "the task to print ready")
    wait_for(lambda: side.running(job), WAIT_S, "the task to be running")
    pids = host_pids(marker)
    assert pids, "the task's processes, seen from the host"
    side.cancel(job)
    assert side.finish(job)["outcome"] == "cancelled"
    wait_for(lambda: not any(pid_alive(pid) for pid in pids), WAIT_S, f"the cancelled task's processes {pids} to end")


def test_stop_cancels_the_running_task(side, agent):
    job = side.submit([PY, "-c", "import time; print('up', flush=True); time.sleep(600)"], labels=agent.labels)
    worker = agent()
    wait_for(lambda: "up" in side.log_texts(job, "stdout"), WAIT_S, "the task to print up")
    assert worker.stop() == 0
    assert side.finish(job)["outcome"] == side.stopped_outcome


def agent_events(caplog, event: str, contains: str = "") -> list[str]:
    """The agent's log lines of `event` (that contain `contains`)."""
    return [r.getMessage() for r in caplog.records
            if r.getMessage().startswith(event) and contains in r.getMessage()]


def test_register_retries_until_the_plane_is_reachable(side, agent, caplog):
    caplog.set_level("INFO", logger="gpulayer.agent")
    side.go_down()
    try:
        agent()
        wait_for(lambda: agent_events(caplog, "register_retry"), WAIT_S, "the agent to find the plane down")
    finally:
        side.come_up()
    wait_for(lambda: side.registered(agent.name), WAIT_S, f"{agent.name} to register once the plane is back")
    job = side.submit([PY, "-c", "print('after')"], labels=agent.labels)
    assert side.finish(job)["outcome"] == "succeeded"


def test_outage_mid_task_keeps_the_task_and_loses_no_line(side, agent, caplog):
    caplog.set_level("INFO", logger="gpulayer.agent")
    # The gate and the end mark are in the task's working dir: what a sandboxed task shares with the host.
    code = ("import os, pathlib, time\nprint('before', os.getcwd(), flush=True)\n"
            "while not os.path.exists('gate'): time.sleep(0.02)\n"
            "for i in range(30): print(i, flush=True)\n"
            "pathlib.Path('ended').write_text('')")
    job = side.submit([PY, "-c", code], labels=agent.labels)
    agent(keep_task_dirs=True)
    first = wait_for(lambda: side.log_texts(job, "stdout"), WAIT_S, "the task to print before")
    workdir = Path(first[0].removeprefix("before "))
    side.go_down()
    try:
        (workdir / "gate").write_text("")
        wait_for((workdir / "ended").exists, WAIT_S, "the task to end while the plane is down")
        wait_for(lambda: agent_events(caplog, "control_plane_unreachable", "/finish"), WAIT_S,
                 "the agent's finish to find the plane down", details=lambda: caplog.text[-2000:])
    finally:
        side.come_up()
    assert side.finish(job) == {"outcome": "succeeded", "exit_code": 0, "outputs": {}}
    assert side.log_texts(job, "stdout") == [f"before {workdir}", *map(str, range(30))]
