"""Remote workers over HTTPS: the control plane and each worker are OS processes of their own.

Every worker is a `gpulayer worker start` process with its own --state-dir and
artifact cache, dialing a `gpulayer server start` over TLS (a CA and a server
certificate made here with gpulayer.server.security.certs; workers get `--ca-file`, the CLI
`GPULAYER_CA_FILE`). Heartbeat 0.5 s, lease TTL 3 s.

- an input goes in and an output comes back byte for byte; logs arrive;
- cancel kills the task's whole process group, a grandchild included;
- a SIGKILLed worker's task is lost after the TTL: retried on a second worker
  with `retry.max_attempts` 2, the job ends `lost` without; the agent restarted
  on the same --state-dir kills the copies its predecessor left running;
- a worker stopped (SIGSTOP) past the TTL and continued is told by its
  heartbeat to kill its copy; its late finish is only a `late_finish` event;
- a worker in a network namespace of its own, with its own address, that only
  dials out (as root; skipped otherwise);
- credentials of the worker's environment never reach a task; two tasks never
  share a (fake) GPU; an unsafe bundle fails the task; a wrong digest is refused.
"""
from __future__ import annotations

import hashlib
import io
import os
import signal
import sqlite3
import sys
import tarfile
import time
import uuid
from pathlib import Path

import pytest
from integration_cluster import Cluster
from netns import VethNamespace, veth_namespace

from gpulayer.testing import host_pids, pid_alive, wait_for

pytestmark = pytest.mark.timeout(60)

TTL_S = 3.0
HEARTBEAT_S = 0.5
#: In every worker's environment; none of the first two may reach a task.
WORKER_ENV = {"MY_API_KEY": "k-123", "AWS_SECRET_ACCESS_KEY": "s-456", "MY_PLAIN_SETTING": "visible"}
#: Attempt 1 writes its pid and sleeps (until killed); a later attempt says where it ran and ends.
FIRST_ATTEMPT_HANGS = ('if [ "$GPULAYER_ATTEMPT" = 1 ]; then exec sleep 300; fi; '
                       'echo "attempt $GPULAYER_ATTEMPT done"')


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    """A TLS control plane; worker `cpu` (no GPUs) and worker `gpu` (GPULAYER_WORKER_GPUS=2, label kind=gpu)."""
    c = Cluster(tmp_path_factory.mktemp("remote"), tls=True).start_server(lease_ttl=TTL_S)
    try:
        c.start_worker("cpu", parallel=2, env=WORKER_ENV, wait=False)
        c.start_worker("gpu", parallel=3, gpus=None, labels={"kind": "gpu"},
                       env={**WORKER_ENV, "GPULAYER_WORKER_GPUS": "2"}, wait=False)
        c.wait_online("cpu")
        c.wait_online("gpu")
        yield c
    finally:
        codes = c.close()
        assert set(codes.values()) <= {0}, f"unclean stops {codes}:\n{c.logs()}"


def ok(result):
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:{result.stdout}\nstderr:{result.stderr}"
    return result


def submit(cluster: Cluster, **spec) -> int:
    """POST /v1/jobs; the job id."""
    r = cluster.request("POST", "/v1/jobs", json=spec)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def running_task(cluster: Cluster, job_id: int, worker_id: int | None = None) -> dict | None:
    """The job's running task (on `worker_id`, when given), once the worker reported its start."""
    return next((t for t in cluster.job(job_id)["tasks"] if t["state"] == "running" and t["started_at"]
                 and worker_id in (None, t["worker_id"])), None)


def first_copy(job_id: int) -> list[int]:
    """The host pids of the job's first attempt (its shell, then sleep; with a sandbox, bwrap's too): a
    sandboxed task's own pids are its PID namespace's, so they are found from outside, by its environment."""
    return host_pids("sleep 300", env=[f"GPULAYER_JOB_ID={job_id}", "GPULAYER_ATTEMPT=1"])


def kill_copies(job_ids) -> None:
    """SIGKILL what is left of these jobs' first attempts (copies orphaned by a killed worker)."""
    for job_id in job_ids:
        for pid in first_copy(job_id):
            os.kill(pid, signal.SIGKILL)


def events_table(cluster: Cluster, job_id: int) -> list[tuple]:
    """(kind, task_id, worker_id, outcome) of the job's rows in the state file's events table."""
    conn = sqlite3.connect(f"file:{cluster.home / 'state.db'}?mode=ro", uri=True, timeout=10)
    try:
        return conn.execute("SELECT kind, task_id, worker_id, json_extract(data, '$.outcome') FROM events "
                            "WHERE job_id = ? ORDER BY seq", (job_id,)).fetchall()
    finally:
        conn.close()


# -- artifacts, logs, cancel ---------------------------------------------------------

TRANSFORM = ("import os; data = open('data/x.bin', 'rb').read(); os.makedirs('out', exist_ok=True); "
             "open('out/y.bin', 'wb').write(data[::-1]); print(f'read {len(data)} bytes', flush=True)")


def test_an_input_goes_in_and_the_output_comes_back_identical(remote):
    payload = os.urandom(300_000)
    (remote.root / "data").mkdir(exist_ok=True)
    (remote.root / "data" / "x.bin").write_bytes(payload)
    result = ok(remote.cli("submit", "--wait", "--input", "data/x.bin", "--output", "out/", "--",
                           sys.executable, "-c", TRANSFORM))
    job_id = result.stdout.split()[0]
    assert "read 300000 bytes" in ok(remote.cli("job", "logs", job_id)).stdout.splitlines()
    dest = remote.root / "outputs"
    ok(remote.cli("job", "outputs", job_id, "--dest", str(dest)))
    assert (dest / "out" / "y.bin").read_bytes() == payload[::-1]


def test_cancel_kills_the_process_group_grandchild_included(remote):
    marker = f"grandchild-{uuid.uuid4().hex}"  # found from outside: a sandboxed task has a PID namespace of its own
    job_id = submit(remote, command=["sh", "-c", f'sh -c "sleep 300; : {marker}" & sleep 300; : {marker}'])
    group: list[int] = []
    try:
        grandchild = f"sh\0-c\0sleep 300; : {marker}\0".encode()
        wait_for(lambda: any(Path(f"/proc/{pid}/cmdline").read_bytes() == grandchild for pid in host_pids(marker)),
                 20, "the grandchild running")
        group = host_pids(marker)  # the task's shell, its grandchild shell (and the sandbox's bwrap)
        ok(remote.cli("job", "cancel", str(job_id)))
        assert remote.wait_job(job_id, timeout=15)["state"] == "cancelled"
        wait_for(lambda: not any(pid_alive(pid) for pid in group), 10, f"the task's processes {group} to be killed")
    finally:
        for pid in group:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


# -- a worker lost ------------------------------------------------------------------------

def test_a_sigkilled_workers_task_is_lost_then_retried_only_when_its_policy_allows(remote):
    pool = {"pool": "sigkill"}
    remote.start_worker("doomed", parallel=2, labels=pool, wait=False)
    doomed_id = remote.wait_online("doomed")
    common = dict(command=["sh", "-c", FIRST_ATTEMPT_HANGS], labels=pool)
    retried = submit(remote, **common, retry={"max_attempts": 2})
    once = submit(remote, **common)
    try:
        first = wait_for(lambda: running_task(remote, retried, doomed_id), 20, "the retried job running")
        wait_for(lambda: running_task(remote, once, doomed_id), 20, "the other job running")
        copies = wait_for(lambda: (found := first_copy(retried) + first_copy(once)) and found, 10, "the copies' pids")
        sandboxed = remote.online_worker("doomed")["isolation"]["sandbox"] == "bwrap"
        remote.start_worker("spare", labels=pool, wait=False)  # online within the TTL
        remote.workers.pop("doomed").kill()
        killed_at = time.monotonic()

        lost = remote.wait_job(once, timeout=20)
        lost_after_s = time.monotonic() - killed_at
        done = remote.wait_job(retried, timeout=20)
        assert lost["state"] == "lost" and [t["reason"] for t in lost["tasks"]] == ["worker_lost"], lost
        assert lost_after_s >= TTL_S - HEARTBEAT_S - 0.2, f"lost {lost_after_s:.1f} s after the kill, before the TTL"
        assert "job_retried" not in [e["kind"] for e in remote.events(once)]

        assert done["state"] == "succeeded", (done, remote.logs())
        spare_id = remote.wait_online("spare")
        tasks = {t["attempt"]: t for t in done["tasks"]}
        assert tasks[1]["task_id"] == first["task_id"] and tasks[1]["state"] == "lost"
        assert tasks[2]["state"] == "succeeded" and tasks[2]["worker_id"] == spare_id
        assert "attempt 2 done" in remote.log_text(retried)

        # The killed agent could not stop its copies. A sandbox dies with its agent (bwrap --die-with-parent);
        # without one, the next agent on its --state-dir kills them.
        if sandboxed:
            wait_for(lambda: not any(pid_alive(pid) for pid in copies), 10, "the sandboxes to die with their agent")
        else:
            assert all(pid_alive(pid) for pid in copies)
        remote.start_worker("doomed", parallel=2, labels=pool, wait=False)
        assert remote.wait_online("doomed") != doomed_id, "a restarted agent registers anew"
        wait_for(lambda: not any(pid_alive(pid) for pid in copies), 10, "the restarted agent to kill the copies")
        assert sandboxed or "leftover_task_killed" in (remote.root / "doomed.log").read_text()
    finally:
        kill_copies([retried, once])
        for name in ("spare", "doomed"):
            if name in remote.workers:
                assert remote.workers.pop(name).stop() == 0, remote.logs()


def test_a_worker_back_after_the_ttl_kills_its_copy_and_its_late_finish_is_only_an_event(remote):
    pool = {"pool": "sigstop"}
    remote.start_worker("sleeper", labels=pool, wait=False)
    sleeper_id = remote.wait_online("sleeper")
    job_id = submit(remote, command=["sh", "-c", FIRST_ATTEMPT_HANGS], labels=pool, retry={"max_attempts": 2})
    sleeper = remote.workers["sleeper"]
    try:
        first = wait_for(lambda: running_task(remote, job_id, sleeper_id), 20, "the task running on the sleeper")
        copy = wait_for(lambda: first_copy(job_id), 10, "the copy's pids")
        remote.start_worker("understudy", labels=pool, wait=False)
        sleeper.pause()  # SIGSTOP, the agent only: its task runs on, in a session of its own
        try:
            done = remote.wait_job(job_id, timeout=20)
            assert done["state"] == "succeeded", (done, remote.logs())
            assert all(pid_alive(pid) for pid in copy), "the stopped worker's copy should still run: nobody could tell it yet"
        finally:
            sleeper.resume()
        late = wait_for(lambda: [e for e in remote.events(job_id) if e["kind"] == "late_finish"], 15,
                        f"the sleeper's late finish\n{remote.logs()}")
        assert len(late) == 1 and late[0]["task_id"] == first["task_id"] and late[0]["worker_id"] == sleeper_id
        assert late[0]["data"]["outcome"] == "cancelled", "the heartbeat should have told it to kill its copy"
        wait_for(lambda: not any(pid_alive(pid) for pid in copy), 10, "the sleeper's copy to be killed")

        after = remote.job(job_id)
        assert after["state"] == "succeeded" and after["exit_code"] == 0
        understudy_id = remote.wait_online("understudy")
        tasks = {t["attempt"]: t for t in after["tasks"]}
        assert tasks[1]["state"] == "lost" and tasks[1]["reason"] == "worker_lost"
        assert tasks[2]["state"] == "succeeded" and tasks[2]["worker_id"] == understudy_id
        rows = events_table(remote, job_id)
        assert [r for r in rows if r[0] == "late_finish"] == [("late_finish", first["task_id"], sleeper_id,
                                                               "cancelled")]
        assert [r[1] for r in rows if r[0] == "task_finished"] == [tasks[2]["task_id"]]
        assert [r[0] for r in rows].count("task_lost") == 1 and [r[0] for r in rows].count("job_retried") == 1
        assert "task_cancel_requested" in (remote.root / "sleeper.log").read_text()
    finally:
        kill_copies([job_id])
        for name in ("sleeper", "understudy"):
            if name in remote.workers:
                assert remote.workers.pop(name).stop() == 0, remote.logs()


# -- what a task sees ---------------------------------------------------------------------

def test_worker_credentials_never_reach_a_task(remote):
    result = ok(remote.cli("submit", "--follow", "--env", "JOB_API_KEY=the-jobs-own", "--", "env"))
    env = dict(line.split("=", 1) for line in result.stdout.splitlines()[1:] if "=" in line)
    assert not {"MY_API_KEY", "AWS_SECRET_ACCESS_KEY", "GPULAYER_JOIN_TOKEN"} & set(env), sorted(env)
    assert env["MY_PLAIN_SETTING"] == "visible" and env["JOB_API_KEY"] == "the-jobs-own"
    assert env["GPULAYER_JOB_ID"] == result.stdout.split()[0] and env["GPULAYER_ATTEMPT"] == "1"


def test_two_gpu_tasks_get_different_devices_and_a_third_waits(remote):
    # Each waits for `go` in its working dir (what a sandboxed task shares with the host).
    hold = ["sh", "-c", 'echo "cvd=$CUDA_VISIBLE_DEVICES"; while [ ! -e go ]; do sleep 0.05; done']
    jobs = [submit(remote, command=hold, gpus=1) for _ in range(3)]
    try:
        wait_for(lambda: sum(bool(running_task(remote, j)) for j in jobs) >= 2, 20, "two GPU jobs running")
        time.sleep(2 * HEARTBEAT_S)  # the third had its chance to be placed
        states = [remote.job(j)["state"] for j in jobs]
        assert sorted(states) == ["queued", "running", "running"], states
        waiting = jobs[states.index("queued")]
        devices = [wait_for(lambda j=j: "cvd=" in (t := remote.log_text(j)) and t, 10, "the job's first line")
                   for j in jobs if j != waiting]
        assert sorted(d.split("cvd=")[1].split()[0] for d in devices) == ["0", "1"], devices
        assert remote.job(waiting)["tasks"][0]["worker_id"] is None
    finally:
        def released() -> bool:
            for workdir in (remote.state_dir("gpu") / "tasks").glob("*"):
                try:
                    (workdir / "go").touch()
                except OSError:
                    pass  # a task's dir removed as it ended
            return all(remote.job(j)["state"] not in ("queued", "running") for j in jobs)
        wait_for(released, 30, "the three jobs to end once let go")
    for j in jobs:
        assert remote.wait_job(j, timeout=20)["state"] == "succeeded"
    assert remote.log_text(waiting).split("cvd=")[1].split()[0] in ("0", "1")
    assert {remote.job(j)["tasks"][0]["worker_id"] for j in jobs} == {remote.wait_online("gpu")}


def test_an_unsafe_bundle_fails_the_task_and_writes_nothing_outside(remote):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        member = tarfile.TarInfo("../x")
        member.size = 7
        tar.addfile(member, io.BytesIO(b"escaped"))
    bundle = buffer.getvalue()
    digest = "sha256:" + hashlib.sha256(bundle).hexdigest()
    put = remote.request("PUT", f"/v1/artifacts/{digest}", data=bundle,
                         headers={"Content-Type": "application/octet-stream"})
    assert put.status_code == 201, put.text
    job = remote.wait_job(submit(remote, command=["true"], source=digest), timeout=20)
    assert job["state"] == "failed", job
    reason = job["tasks"][0]["reason"]
    assert "unsafe bundle" in reason and "'../x'" in reason, reason
    assert "unsafe bundle" in remote.log_text(job["id"])
    for name in ("cpu", "gpu"):
        assert not (remote.state_dir(name) / "tasks" / "x").exists()
        assert not (remote.state_dir(name) / "x").exists()


def test_an_upload_whose_bytes_do_not_match_its_digest_is_refused(remote):
    digest = "sha256:" + hashlib.sha256(b"what the digest says").hexdigest()
    put = remote.request("PUT", f"/v1/artifacts/{digest}", data=b"what was sent",
                         headers={"Content-Type": "application/octet-stream"})
    assert put.status_code == 400 and put.json()["error"]["code"] == "digest_mismatch", put.text
    assert remote.request("HEAD", f"/v1/artifacts/{digest}").status_code == 404


# -- a second machine ------------------------------------------------------------------------

@pytest.fixture
def second_machine():
    """A namespace with its own address, 10.213.N.2/30, joined to the host (10.213.N.1) by a veth pair."""
    tag = os.getpid() % 10_000
    net = veth_namespace(VethNamespace(f"glrem{tag}", f"glrh{tag}", f"glrn{tag}",
                                       f"10.213.{tag % 250}.1", f"10.213.{tag % 250}.2", prefix=30))
    try:
        yield net
    finally:
        net.delete()


@pytest.mark.netns
def test_a_worker_on_a_second_machine_only_dials_out(second_machine, tmp_path):
    net = second_machine
    cluster = Cluster(tmp_path, host=net.host_ip, tls=True)
    try:
        cluster.start_server(lease_ttl=TTL_S)
        cluster.start_worker("far", netns=net.name, wait=False)
        worker_id = cluster.wait_online("far")
        listed = {w["id"]: w for w in cluster.api("/workers")["workers"]}
        assert listed[worker_id]["advertise_address"] == net.ns_ip, "the control plane sees the worker's own address"

        (tmp_path / "data").mkdir()
        (tmp_path / "data" / "x.bin").write_bytes(payload := os.urandom(50_000))
        result = ok(cluster.cli("submit", "--wait", "--input", "data/x.bin", "--output", "out/", "--",
                                sys.executable, "-c", TRANSFORM))
        job = cluster.job(int(result.stdout.split()[0]))
        assert job["tasks"][0]["worker_id"] == worker_id and job["tasks"][0]["address"] == net.ns_ip
        ok(cluster.cli("job", "outputs", str(job["id"]), "--dest", str(tmp_path / "back")))
        assert (tmp_path / "back" / "out" / "y.bin").read_bytes() == payload[::-1]

        # Nothing in the namespace listens, and every connection in it is one the worker opened to the
        # control plane: there is nothing for the control plane to connect to.
        assert net.run("ss", "-Hltnu").strip() == ""
        port = cluster.url.rsplit(":", 1)[1]
        peers = [line.split()[-1] for line in net.run("ss", "-Htn", "state", "established").splitlines()]
        assert peers and set(peers) == {f"{net.host_ip}:{port}"}, peers
    finally:
        codes = cluster.close()
    assert set(codes.values()) <= {0}, f"unclean stops {codes}:\n{cluster.logs()}"

