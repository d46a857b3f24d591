"""A task whose process ends within QUICK_EXIT_S sends no start: its finish carries it (`pid`).

Against a real control plane process: the server's own request counter (/metrics) says how many
start calls arrived; its events and the task's row say the start was recorded all the same.
"""
from __future__ import annotations

import re
import sys

import pytest
from agenthelpers import RunningWorker

from agent.worker import WorkerConfig
from gpulayer.protocol.assignment import Assignment
from gpulayer.testing import ControlPlaneProcess, wait_for

pytestmark = pytest.mark.timeout(120)

PY = sys.executable


@pytest.fixture(scope="module")
def real_plane(tmp_path_factory):
    with ControlPlaneProcess(tmp_path_factory.mktemp("quick-start"), heartbeat_interval=0.2, lease_ttl=10) as plane:
        yield plane


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """A host dir every task sees (--sandbox-bind), writable by the user a root agent's tasks run as."""
    path = tmp_path_factory.mktemp("shared")
    path.chmod(0o1777)
    return path


@pytest.fixture(scope="module")
def quick_window():
    """QUICK_EXIT_S widened for this file (the worker runs in this process): `true` in a fresh bwrap takes
    longer than 30 ms on a loaded 2-core machine, and these tests check what a quick exit does, not how
    quick the sandbox is. The longer task below sleeps past it."""
    import agent.run.runner as tasks

    before, tasks.QUICK_EXIT_S = tasks.QUICK_EXIT_S, 0.5
    yield
    tasks.QUICK_EXIT_S = before


@pytest.fixture(scope="module")
def worker(real_plane, tmp_path_factory, shared, quick_window):
    state = tmp_path_factory.mktemp("worker")
    running = RunningWorker(WorkerConfig(url=real_plane.url, join_token=real_plane.join_token, name="quick",
                                         state_dir=str(state / "state"), artifact_cache=str(state / "cache"),
                                         kill_grace_s=1.0, acquire_wait_s=0.5, gpu_probe=list, cpus=2,
                                         ram_mb=1024, sandbox_binds=[str(shared)]))
    wait_for(lambda: real_plane.online_worker("quick") is not None, 20, "the worker to register")
    yield running
    assert running.stop() == 0


def start_calls(plane) -> int:
    """POST .../start requests the server answered 200, from its latency histogram's count."""
    text = plane.request("GET", "/metrics").text
    found = re.findall(r'gpulayer_request_seconds_count\{[^}]*route="[^"]*/start"[^}]*status="200"[^}]*\} (\S+)',
                       text)
    return int(sum(float(n) for n in found))


def run_job(plane, command) -> dict:
    return run_job_with(plane, {"command": command})


def run_job_with(plane, spec) -> dict:
    job_id = plane.submit(spec)
    job = plane.wait_job(job_id, timeout=30)
    assert job["state"] == "succeeded", job
    return job


def test_a_quick_task_sends_no_start_and_is_recorded_started(real_plane, worker):
    before = start_calls(real_plane)
    job = run_job(real_plane, ["true"])
    assert start_calls(real_plane) == before
    task = job["tasks"][0]
    assert task["started_at"] is not None and task["finished_at"] >= task["started_at"]
    kinds = [e["kind"] for e in real_plane.events(job["id"])]
    assert kinds.index("task_started") < kinds.index("task_finished")


def test_a_longer_task_still_sends_its_start(real_plane, worker):
    before = start_calls(real_plane)
    job_id = real_plane.submit({"command": [PY, "-c", "import time; print('up', flush=True); time.sleep(1)"]})
    wait_for(lambda: real_plane.job(job_id)["tasks"][0]["state"] == "running", 20, "the task to run")
    assert start_calls(real_plane) == before + 1  # running before its finish: its own start
    assert real_plane.wait_job(job_id, timeout=30)["state"] == "succeeded"
    assert start_calls(real_plane) == before + 1


def test_a_quick_task_with_outputs_sends_its_start_before_the_uploads(real_plane, worker):
    before = start_calls(real_plane)
    job = run_job_with(real_plane, {"command": ["sh", "-c", "mkdir -p out && echo hi > out/a.txt"],
                                    "outputs": ["out/"]})
    assert start_calls(real_plane) == before + 1
    assert list(real_plane.get_json(f"/v1/jobs/{job['id']}/outputs")["outputs"]) == ["out/a.txt"]


def test_quick_tasks_in_a_row_each_run_once(real_plane, worker, shared):
    """Stale assignments (an acquire answered before a finish that carried the start) are not run again."""
    marks = shared / "runs"
    marks.mkdir(mode=0o777)
    marks.chmod(0o1777)
    ids = [real_plane.submit({"command": ["sh", "-c", f'echo x >> "{marks}/$GPULAYER_TASK_ID"']})
           for _ in range(20)]
    for job_id in ids:
        assert real_plane.wait_job(job_id, timeout=30)["state"] == "succeeded"
    runs = {path.name: path.read_text().count("x") for path in marks.iterdir()}
    assert len(runs) == 20 and set(runs.values()) == {1}


def test_an_assignment_asked_for_before_its_task_ended_is_not_launched(launch_only_worker):
    """Only an answer to a request sent after the runner ended may bring the task back (a requeue)."""
    worker = launch_only_worker
    worker.ended[7] = 10.0  # task 7's runner ended at 10 s
    stale = worker._launch(Assignment(task_id=7, job_id=107, command=["true"]), 9.0)
    assert stale.start_sent.is_set() and 7 not in worker.handles  # the acquire loop does not wait on it
    worker._launch(Assignment(task_id=8, job_id=108, command=["true"]), 9.0)
    worker._launch(Assignment(task_id=7, job_id=107, command=["true"]), 11.0)
    worker.join_launched()
    assert sorted(worker.launched) == [7, 8]


def test_an_assignment_of_a_task_whose_finish_waits_unanswered_is_not_launched(launch_only_worker):
    """A finish waiting in the batch (agent/run/chunks.py) leaves the task assigned on the server: an acquire
    answered meanwhile carries it again, however late that acquire was sent."""
    worker = launch_only_worker
    worker.ended[9] = 10.0
    worker.unanswered.add(9)
    stale = worker._launch(Assignment(task_id=9, job_id=109, command=["true"]), 11.0)
    assert stale.start_sent.is_set() and 9 not in worker.handles
    worker._finishes_answered({9})
    assert 9 not in worker.unanswered and worker.ended[9] > 11.0
    worker._launch(Assignment(task_id=9, job_id=109, command=["true"]), worker.ended[9] + 1)
    worker.join_launched()
    assert worker.launched == [9]
