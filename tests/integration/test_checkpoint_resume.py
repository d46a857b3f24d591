"""Checkpoints that follow a job (issue 27 part 2, docs/training.md), end to end.

A real control plane (TLS), a worker on the host and a second one in a network namespace behind a NAT
(it dials the control plane, nothing reaches it), and a training-like loop in pure Python: a step
counter whose state file is written every step to GPULAYER_CHECKPOINT_DIR with a temporary name and
a rename. The loop is stopped on its first worker (preempted by a higher-priority job, the worker
stopped: SIGTERM, then SIGKILLed without warning), resumed on the second, ends with its step count complete and loses at most the steps
since its last checkpoint. A gang's two ranks each get their own directory back; `job checkpoints`
and `job outputs --checkpoint` read them.
"""

from __future__ import annotations

import json
import sys

import pytest

from gpulayer.testing import ControlPlaneProcess, wait_for
from netns import nat_namespace, netns_exec

pytestmark = [pytest.mark.timeout(300), pytest.mark.netns]

TRAIN = r"""
import json, os, signal, sys, time
total, pause = int(sys.argv[1]), float(sys.argv[2])
folder = os.environ["GPULAYER_CHECKPOINT_DIR"]
rank = os.environ.get("RANK", "0")
state = os.path.join(folder, f"state-{rank}.json")
step = json.load(open(state))["step"] if os.path.exists(state) else 0
print(f"resumed step={step} from={os.environ.get('GPULAYER_RESTORED_FROM_ATTEMPT')} "
      f"others={sorted(os.listdir(folder))}", flush=True)
def stop(*_):  # as a training script does on its warning: save where it is, say so, exit
    with open(state + ".sig", "w") as out:  # not .tmp: the loop may be halfway through writing that one
        json.dump({"step": step}, out)
    os.replace(state + ".sig", state)
    if os.path.exists(state + ".tmp"):
        os.remove(state + ".tmp")
    print(f"stopped at step={step}", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
while step < total:
    step += 1
    with open(state + ".tmp", "w") as out:
        json.dump({"step": step}, out)
    os.replace(state + ".tmp", state)
    print(f"step={step}", flush=True)
    time.sleep(pause)
print(f"done step={step}", flush=True)
"""


@pytest.fixture(scope="module")
def nat():
    yield from nat_namespace("ckpt")


@pytest.fixture(scope="module")
def plane(nat, tmp_path_factory):
    with ControlPlaneProcess(tmp_path_factory.mktemp("checkpoints"), host=nat.host_ip, tls=True,
                             heartbeat_interval=0.5, lease_ttl=4, args=["--checkpoint-keep", "100"]) as plane:
        plane.start_worker("inside", prefix=netns_exec(nat.name), gpus=1, timeout=120)
        yield plane


def _lines(plane, job_id: int) -> list[str]:
    return [line["text"] for line in plane.get_json(f"/v1/jobs/{job_id}/logs?limit=10000")["lines"]]


def _wait_line(plane, job_id: int, text: str, timeout: float = 120) -> None:
    wait_for(lambda: any(text in line for line in _lines(plane, job_id)), timeout, f"{text!r} in job {job_id}'s logs",
             details=plane.logs)


def _cordon(plane, name: str, on: bool) -> None:
    action = "cordon" if on else "uncordon"
    r = plane.request("POST", f"/v1/workers/{name}/{action}", json={"reason": "test"} if on else {})
    assert r.status_code == 200, r.text


def _train(plane, total: int, pause: float, **spec) -> int:
    return plane.submit({"command": [sys.executable, "-c", TRAIN, str(total), str(pause)],
                         "retry": {"max_attempts": 3, "retry_on": ["worker_lost", "failed"]}, **spec})


def _ended(plane, job_id: int) -> dict:
    return wait_for(lambda: (j := plane.job(job_id))["state"] in ("succeeded", "failed", "cancelled", "lost") and j,
                    180, f"job {job_id} to end", details=plane.logs)


def _steps_after_resume(lines: list[str]) -> tuple[int, int]:
    """(the step the second attempt resumed from, the step the first attempt reached)."""
    resumed = [line for line in lines if line.startswith("resumed")]
    assert len(resumed) == 2, lines
    start = int(resumed[1].split()[1].split("=")[1])
    # The step the first attempt reached: its last `step=N`, or the `stopped at step=N` its SIGTERM handler
    # printed (and saved), one further when the signal came between a step's checkpoint and its line.
    before = lines[:lines.index(resumed[1])]
    reached = max(int(line.rsplit("=", 1)[1]) for line in before if line.startswith(("step=", "stopped at step=")))
    return start, reached


def test_a_stopped_worker_leaves_its_checkpoint_to_a_worker_in_another_namespace(plane):
    _cordon(plane, "inside", True)
    first = plane.start_worker("first")
    job_id = _train(plane, 40, 0.05)
    _wait_line(plane, job_id, "step=10")
    _cordon(plane, "inside", False)
    first.stop()  # SIGTERM: the task gets it, saves, exits; the agent uploads the folder before its finish
    job = _ended(plane, job_id)
    lines = _lines(plane, job_id)
    assert job["state"] == "succeeded", (job, lines)
    start, reached = _steps_after_resume(lines)
    assert start == reached >= 10, lines  # stopped with warning: nothing lost
    assert "done step=40" in lines
    assert "from=1" in next(line for line in lines if line.startswith("resumed") and "from=None" not in line)
    workers = [t["worker_name"] for t in job["tasks"]]  # newest attempt first
    assert workers[0] == "inside" and "first" in workers, job["tasks"]
    listed = plane.get_json(f"/v1/jobs/{job_id}/checkpoints")["checkpoints"]
    assert [(c["attempt"], c["kind"]) for c in listed] == [(1, "final")]


def test_a_preempted_loop_resumes_on_a_worker_in_another_namespace(plane):
    """Issue 27's first test: preempted by a higher-priority job (its signal, its grace, its checkpoint
    uploaded), then resumed on the worker behind the NAT while the preemptor runs on the first."""
    _cordon(plane, "inside", True)
    first = plane.start_worker("gpu-first", gpus=1)
    try:
        job_id = _train(plane, 80, 0.05, gpus=1, priority="low", preemptible=True, grace_seconds=10)
        _wait_line(plane, job_id, "step=10")
        high = plane.submit({"command": ["sleep", "3"], "gpus": 1, "priority": "high"})
        wait_for(lambda: any(e["kind"] == "task_preempted" for e in plane.get_json(f"/v1/jobs/{job_id}/events")["events"]),
                 120, "the loop to be preempted", details=plane.logs)
        _cordon(plane, "inside", False)  # the preemptor holds the first worker's GPU: the loop goes behind the NAT
        job = _ended(plane, job_id)
        lines = _lines(plane, job_id)
        assert job["state"] == "succeeded", (job, lines)
        start, reached = _steps_after_resume(lines)
        assert start == reached >= 10, lines  # warned (SIGTERM, its grace), saved, uploaded: no step lost
        assert "done step=80" in lines and any(line.startswith("stopped at step=") for line in lines), lines
        # a preemption requeues the same attempt (it was not the job's fault): one task row, assigned twice
        names = {w["id"]: w["name"] for w in plane.get_json("/v1/workers")["workers"]}
        events = plane.get_json(f"/v1/jobs/{job_id}/events")["events"]
        assigned = [names.get(e.get("worker_id", (e.get("data") or {}).get("worker_id"))) for e in events if e["kind"] == "task_assigned"]
        assert assigned == ["gpu-first", "inside"], events
        assert _ended(plane, high)["state"] == "succeeded"
        high_workers = [t["worker_name"] for t in plane.job(high)["tasks"]]
        assert high_workers == ["gpu-first"], high_workers
        kinds = [c["kind"] for c in plane.get_json(f"/v1/jobs/{job_id}/checkpoints")["checkpoints"]]
        assert "final" in kinds, kinds
    finally:
        first.stop()


def test_checkpoint_every_and_a_sigkilled_worker_lose_only_the_steps_since_the_last(plane, tmp_path):
    _cordon(plane, "inside", True)
    first = plane.start_worker("first-again")
    job_id = _train(plane, 60, 0.1, checkpoint_every_seconds=1)
    wait_for(lambda: len(plane.get_json(f"/v1/jobs/{job_id}/checkpoints")["checkpoints"]) >= 2, 120,
             "two periodic checkpoints", details=plane.logs)
    _cordon(plane, "inside", False)
    first.kill()  # SIGKILL, as power loss: no finish, no last upload; the lease runs out
    job = _ended(plane, job_id)
    lines = _lines(plane, job_id)
    assert job["state"] == "succeeded", (job, lines)
    start, reached = _steps_after_resume(lines)
    periodic = [c for c in plane.get_json(f"/v1/jobs/{job_id}/checkpoints")["checkpoints"] if c["attempt"] == 1]
    assert periodic and all(c["kind"] == "periodic" for c in periodic)
    rc, out, err = plane.cli("job", "outputs", str(job_id), "--checkpoint", "--attempt", "1", "--dest",
                             str(tmp_path / "c1"))
    assert rc == 0, err
    saved = json.loads((tmp_path / "c1" / "state-0.json").read_text())["step"]
    # Resumed from the newest checkpoint of attempt 1: only the steps after it were lost (the log lines of the
    # last steps may be lost with the agent, so `reached` is a lower bound of where it was).
    assert start == saved > 0 and "done step=60" in lines, (start, saved, reached)
    rc, out, err = plane.cli("job", "checkpoints", str(job_id), "--json")
    assert rc == 0 and {c["attempt"] for c in json.loads(out)} >= {1}, err
    rc, out, err = plane.cli("job", "outputs", str(job_id), "--attempt", "1")
    assert rc == 2 and "--attempt" in err
    rc, out, err = plane.cli("job", "outputs", str(job_id), "--checkpoint", "--dest", str(tmp_path / "newest"))
    assert rc == 0 and (tmp_path / "newest" / "state-0.json").exists(), err


def test_a_gangs_two_ranks_each_get_their_own_directory_back(plane):
    other = plane.start_worker("rank-peer")
    try:
        job_id = _train(plane, 30, 0.1, nodes=2, checkpoint_every_seconds=1)
        _wait_line(plane, job_id, "step=8")
        wait_for(lambda: {c["index"] for c in plane.get_json(f"/v1/jobs/{job_id}/checkpoints")["checkpoints"]}
                 == {0, 1}, 60, "a checkpoint of each rank", details=plane.logs)
        other.stop()  # one rank's worker stops: the attempt is retried whole, each rank from its own folder
        plane.start_worker("rank-peer-2")
        job = _ended(plane, job_id)
        lines = _lines(plane, job_id)
        assert job["state"] == "succeeded", (job, lines)
        resumed = [line for line in lines if line.startswith("resumed") and "from=None" not in line]
        assert len(resumed) == 2, lines
        # Each rank's folder holds its own state file only: rank 0's has state-0.json, rank 1's state-1.json.
        assert sorted(line.split("others=")[1] for line in resumed) == ["['state-0.json']", "['state-1.json']"]
    finally:
        for name in ("rank-peer", "rank-peer-2"):
            if name in plane.workers:
                plane.workers[name].stop()
