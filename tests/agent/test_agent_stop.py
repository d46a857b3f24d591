"""A worker that stops gracefully (SIGTERM) loses no work: real control plane, real worker processes.

- a task cut short because its worker stopped ends `lost` (reason `worker_stopped`), which the retry
  policy judges as `worker_lost`: `--retry 3` runs it again elsewhere; a service replica is placed again;
- `--drain-timeout S`: a stopping worker takes no new task and lets its running ones finish.
"""
from __future__ import annotations

import signal

import pytest

from gpulayer.testing import ControlPlaneProcess, task_dirs, wait_for

pytestmark = pytest.mark.timeout(90)

#: Attempt 1 waits (for ever, or until $GO exists); a later attempt ends at once.
FIRST_ATTEMPT_WAITS = ('if [ "$GPULAYER_ATTEMPT" = 1 ]; then while [ ! -e "$GO" ]; do sleep 0.05; done; fi; '
                       'echo "attempt $GPULAYER_ATTEMPT done"')


@pytest.fixture
def plane(tmp_path):
    with ControlPlaneProcess(tmp_path, heartbeat_interval=0.5, lease_ttl=3) as p:
        yield p


def running_on(plane, job_id: int, worker_name: str) -> dict | None:
    worker = plane.online_worker(worker_name)
    job = plane.job(job_id)
    return next((t for t in job["tasks"] if t["state"] == "running" and worker
                 and t["worker_id"] == worker["id"]), None)


def test_a_sigtermed_workers_task_is_retried_on_another_worker(plane, tmp_path):
    plane.start_worker("leaving")
    job_id = plane.submit({"command": ["sh", "-c", FIRST_ATTEMPT_WAITS], "env": {"GO": str(tmp_path / "never")},
                           "retry": {"max_attempts": 3}})
    wait_for(lambda: running_on(plane, job_id, "leaving"), 30, "the task running on the leaving worker")

    assert plane.workers.pop("leaving").stop() == 0
    after = plane.job(job_id)
    assert after["state"] == "queued" and after["attempt"] == 2, after
    first = next(t for t in after["tasks"] if t["attempt"] == 1)
    assert first["state"] == "lost" and first["reason"] == "worker_stopped", first

    plane.start_worker("staying")
    done = plane.wait_job(job_id, timeout=30)
    assert done["state"] == "succeeded", (done, plane.logs())
    second = next(t for t in done["tasks"] if t["attempt"] == 2)
    assert second["worker_id"] == plane.online_worker("staying")["id"]


def test_without_retry_a_stopped_workers_job_ends_lost_saying_so(plane, tmp_path):
    plane.start_worker("leaving")
    job_id = plane.submit({"command": ["sh", "-c", FIRST_ATTEMPT_WAITS], "env": {"GO": str(tmp_path / "never")}})
    wait_for(lambda: running_on(plane, job_id, "leaving"), 30, "the task running")
    assert plane.workers.pop("leaving").stop() == 0
    info = plane.job(job_id)
    assert info["state"] == "lost" and info["reason"] == "worker_stopped", info


def test_a_service_replica_of_a_stopped_worker_is_placed_again(plane):
    plane.start_worker("a")
    plane.start_worker("b")
    job_id = plane.submit({"command": ["sh", "-c", "exec sleep 300"],
                           "service": {"replicas": 2, "port": False}})
    wait_for(lambda: running_on(plane, job_id, "a") and running_on(plane, job_id, "b"), 30, "both replicas running")
    lost, healthy = running_on(plane, job_id, "a"), running_on(plane, job_id, "b")
    assert plane.workers.pop("a").stop() == 0
    info = plane.job(job_id)
    assert info["state"] == "running" and info["attempt"] == 1, info
    plane.start_worker("c")
    replaced = wait_for(lambda: running_on(plane, job_id, "c"), 30, "the lost replica placed on c")
    assert replaced["index"] == lost["index"] and replaced["task_id"] != lost["task_id"]
    # The healthy replica was never stopped: the same task, still running on b.
    assert running_on(plane, job_id, "b")["task_id"] == healthy["task_id"]
    kinds = [e["kind"] for e in plane.get_json(f"/v1/jobs/{job_id}/events")["events"]]
    assert "replica_replaced" in kinds and "job_retried" not in kinds, kinds
    plane.request("POST", f"/v1/jobs/{job_id}/cancel")


def test_drain_timeout_lets_running_tasks_finish_and_takes_no_new_one(plane):
    worker = plane.start_worker("draining", args=["--drain-timeout", "60"])
    # GO in the task's working dir (relative): the one place a sandboxed task shares with the host.
    running = plane.submit({"command": ["sh", "-c", FIRST_ATTEMPT_WAITS], "env": {"GO": "go"}})
    wait_for(lambda: running_on(plane, running, "draining"), 30, "the task running")
    go = task_dirs(worker.state_dir)[0] / "go"  # its only task's working dir
    waiting = plane.submit({"command": ["echo", "should not run here"]})

    worker.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "worker_draining" in worker.log(), 15, "the worker to drain", details=worker.log)
    go.touch()
    assert worker.wait(30) == 0, worker.log()
    plane.workers.pop("draining")

    done = plane.job(running)
    assert done["state"] == "succeeded", done
    left = plane.job(waiting)
    assert left["state"] == "queued" and left["attempt"] == 1, left


def test_drain_timeout_runs_out_then_the_task_is_stopped_and_retried(plane, tmp_path):
    worker = plane.start_worker("draining", args=["--drain-timeout", "0.5"])
    job_id = plane.submit({"command": ["sh", "-c", FIRST_ATTEMPT_WAITS], "env": {"GO": str(tmp_path / "never")},
                           "retry": {"max_attempts": 2}})
    wait_for(lambda: running_on(plane, job_id, "draining"), 30, "the task running")
    assert plane.workers.pop("draining").stop() == 0
    assert "worker_draining" in worker.log()
    info = plane.job(job_id)
    assert info["state"] == "queued" and info["attempt"] == 2, info


def test_drain_timeout_must_be_a_non_negative_number(plane):
    rc, _out, err = plane.cli("worker", "start", "--drain-timeout", "-1", GPULAYER_JOIN_TOKEN=plane.join_token)
    assert rc == 2 and "--drain-timeout" in err and "Traceback" not in err


def test_python_m_agent_refuses_a_negative_drain_timeout(capsys):
    from agent.__main__ import build_parser
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(["--drain-timeout", "-1"])
    assert stopped.value.code == 2 and "--drain-timeout" in capsys.readouterr().err
    assert build_parser().parse_args(["--drain-timeout", "2.5"]).drain_timeout == 2.5


def test_a_second_sigterm_stops_the_agent_whatever_its_task_threads_wait_for(plane, tmp_path):
    worker = plane.start_worker("stuck")
    job_id = plane.submit({"command": ["sh", "-c", FIRST_ATTEMPT_WAITS], "env": {"GO": str(tmp_path / "never")}})
    wait_for(lambda: running_on(plane, job_id, "stuck"), 30, "the task running")
    plane.pause()  # the task's finish, the heartbeat and deregister now wait on a control plane that never answers
    try:
        worker.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "task_started" in worker.log() and "worker_stopping" in worker.log(), 15,
                 "the worker to start stopping", details=worker.log)
        worker.proc.send_signal(signal.SIGTERM)
        # It stops though the plane never answers: the finishes still unsent get 2 s once hurried, even when
        # the flush was already waiting (it once waited out a 30 s POST). 25 s: room for a loaded machine.
        assert worker.wait(25) == 0, worker.log()
    finally:
        plane.resume()
    plane.workers.pop("stuck")
