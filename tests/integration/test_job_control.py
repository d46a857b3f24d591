"""Issue 27, parts 1 and 3, with a real server process, real worker processes and real child processes: the
warning signal before the time limit (`--signal`), a planned stop's signal and grace (cancel, preemption, a
gang's every rank), and Slurm's job control through the CLI (hold, release, requeue, update, wait, --begin)."""

from __future__ import annotations

import json
import sys
import textwrap
import time

import pytest

from gpulayer.testing import wait_for
from integration_cluster import Cluster

# A task that says when it started and when each signal came (time.monotonic(), its own clock), and, on
# SIGTERM, writes a file, says so, and exits 0 after a moment's "checkpoint".
SIGNALLED = textwrap.dedent("""
    import os, signal, sys, time
    start = time.monotonic()
    print(f"started {start:.3f}", flush=True)
    def usr1(signum, frame):
        print(f"usr1 after {time.monotonic() - start:.3f}", flush=True)
    def term(signum, frame):
        with open("stopped.txt", "w") as f:
            f.write("checkpoint")
        print(f"term after {time.monotonic() - start:.3f} wrote {os.path.getsize('stopped.txt')} bytes", flush=True)
        time.sleep(0.5)
        sys.exit(0 if os.environ.get("EXIT_ZERO") else 143)
    signal.signal(signal.SIGUSR1, usr1)
    signal.signal(signal.SIGTERM, term)
    print("working", flush=True)
    time.sleep(600)
""")


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A server whose --preempt-grace (20 s) is not any job's --grace here, a GPU worker and two CPU workers."""
    c = Cluster(tmp_path_factory.mktemp("jobcontrol"))
    c.args = ["--preempt-grace", "20", "--max-grace", "60"]
    c.start_server()
    try:
        c.start_worker("gpu", gpus=1, parallel=2)
        c.start_worker("c1", parallel=2)
        c.start_worker("c2", parallel=2)
        yield c
    finally:
        c.close()


def signalled(c: Cluster, job_id: int) -> list[dict]:
    return [e["data"] for e in c.events(job_id) if e["kind"] == "task_signalled"]


def cli_ok(c: Cluster, *args: str) -> str:
    result = c.cli(*args)
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result.stdout


def test_the_warning_signal_arrives_its_seconds_before_the_time_limit(cluster):
    out = cli_ok(cluster, "submit", "--time", "0:08", "--signal", "USR1@4", "--grace", "2", "--", *python(SIGNALLED))
    job_id = int(out.split()[0])
    done = cluster.wait_job(job_id, timeout=60)
    text = cluster.log_text(job_id)
    assert done["state"] == "failed" and done["tasks"][0]["outcome"] == "timed_out", text
    usr1 = float(text.split("usr1 after ")[1].split()[0])
    term = float(text.split("term after ")[1].split()[0])  # the time limit's SIGTERM, on the task's own clock
    # USR1 came 4 s before the limit, within a second (a check with a tolerance, not a bench): measured from
    # the limit's own SIGTERM, since the task's first line comes after its sandbox started (a second or two)
    assert abs((term - usr1) - 4) < 1.0, text
    assert usr1 < 8 - 4 + 1.0, text
    assert "SIGKILL after 2 s" in text, text
    sent = signalled(cluster, job_id)
    assert [(s["signal"], s["why"]) for s in sent] == [("SIGUSR1", "time_limit"), ("SIGTERM", "time_limit")], sent


def test_a_cancel_sends_the_jobs_signal_and_waits_its_grace(cluster):
    job_id = cluster.submit({"command": python(SIGNALLED), "grace_seconds": 3, "env": {"EXIT_ZERO": "1"}})
    wait_for(lambda: "working" in cluster.log_text(job_id), 30, "the job to run")
    cli_ok(cluster, "job", "cancel", str(job_id))
    assert cluster.wait_job(job_id, timeout=60)["state"] == "cancelled"
    text = wait_for(lambda: "term after" in (t := cluster.log_text(job_id)) and t, 30, "its last lines")
    assert "wrote 10 bytes" in text and "SIGKILL after 3 s" in text, text
    sent = wait_for(lambda: signalled(cluster, job_id), 30, "its finish")  # the finish comes after the last lines
    assert [(s["signal"], s["why"]) for s in sent] == [("SIGTERM", "cancelled")]


def test_a_preempted_victim_keeps_its_gpu_through_its_grace(cluster):
    low = cluster.submit({"command": python(SIGNALLED), "gpus": 1, "priority": "low", "preemptible": True, "grace_seconds": 4, "signal": "USR1"})
    wait_for(lambda: "working" in cluster.log_text(low), 30, "the low-priority job to run")
    high = cluster.submit({"command": ["echo", "high"], "gpus": 1, "priority": "high"})
    assert cluster.wait_job(high, timeout=90)["state"] == "succeeded"
    text = cluster.log_text(low)
    assert "usr1 after" in text and "SIGKILL after 4 s" in text, text  # the job's signal and grace, not the server's
    events = cluster.events(low)
    preempted = next(e for e in events if e["kind"] == "task_preempted")
    assigned = next(e for e in cluster.events(high) if e["kind"] == "task_assigned")
    assert assigned["at"] >= preempted["at"], (preempted, assigned)  # its GPU was not given away before it stopped
    sent = wait_for(lambda: signalled(cluster, low), 30, "its finish")
    assert [(s["signal"], s["why"]) for s in sent] == [("SIGUSR1", "preempted")]
    cluster.request("POST", f"/v1/jobs/{low}/cancel")
    cluster.wait_job(low, timeout=60)


def test_every_rank_of_a_gang_is_signalled(cluster):
    gang = cluster.submit({"command": python(SIGNALLED), "nodes": 2, "grace_seconds": 2, "signal": "B:USR2"})
    wait_for(lambda: cluster.log_text(gang).count("working") == 2, 60, "both ranks to run")
    cluster.request("POST", f"/v1/jobs/{gang}/cancel")
    assert cluster.wait_job(gang, timeout=60)["state"] == "cancelled"
    sent = wait_for(lambda: len(s := signalled(cluster, gang)) == 2 and s, 30, "both ranks' signals")
    assert sorted((s["signal"], s["why"]) for s in sent) == [("SIGUSR2", "cancelled")] * 2, sent
    assert len({e["task_id"] for e in cluster.events(gang) if e["kind"] == "task_signalled"}) == 2


def test_hold_release_update_and_wait_through_the_cli(cluster):
    out = cli_ok(cluster, "submit", "--hold", "--name", "held-one", "--", "sh", "-c", "exit 3")
    job_id = out.split()[0]
    info = cluster.job(int(job_id))
    assert info["state"] == "waiting" and info["waiting_reason"].startswith("held"), info
    assert "held" in cli_ok(cluster, "job", "status", job_id)
    cli_ok(cluster, "job", "update", job_id, "--priority", "-5", "--name", "renamed", "--time", "10")
    info = cluster.job(int(job_id))
    assert info["name"] == "renamed" and info["spec"]["priority"] == -5 and info["spec"]["timeout_seconds"] == 600
    assert info["state"] == "waiting", info  # an update releases nothing
    cli_ok(cluster, "job", "release", job_id)
    waited = cluster.cli("job", "wait", job_id, "--timeout", "60")
    assert waited.returncode == 3, (waited.stdout, waited.stderr)  # the job's exit code
    kinds = [e["kind"] for e in cluster.events(int(job_id))]
    assert kinds.index("job_submitted") < kinds.index("job_released_hold") < kinds.index("task_started"), kinds


def test_requeue_a_running_job_and_one_that_ended(cluster):
    job_id = cluster.submit({"command": python(SIGNALLED), "grace_seconds": 5, "retry": {"max_attempts": 1}})
    wait_for(lambda: "working" in cluster.log_text(job_id), 30, "the job to run")
    cli_ok(cluster, "job", "requeue", str(job_id))
    again = wait_for(lambda: (j := cluster.job(job_id))["attempt"] == 2 and j["state"] == "running" and j, 60, "the second attempt to run")
    first = next(t for t in cluster.job(job_id)["tasks"] if t["attempt"] == 1)
    assert first["state"] == "cancelled" and first["reason"] == "requeued", again
    assert ("SIGTERM", "requeued") in [(s["signal"], s["why"]) for s in signalled(cluster, job_id)]
    cluster.request("POST", f"/v1/jobs/{job_id}/cancel")
    assert cluster.wait_job(job_id, timeout=60)["state"] == "cancelled"
    # the job ended at the cancel; its task stops within its grace (until then a requeue is 409 job_stopping)
    wait_for(lambda: all(t["state"] not in ("assigned", "running") for t in cluster.job(job_id)["tasks"]), 60, "its task to stop")
    # an ended job runs again, held first when asked
    cli_ok(cluster, "job", "requeue", str(job_id), "--hold")
    info = cluster.job(job_id)
    assert info["attempt"] == 3 and info["state"] == "waiting" and info["waiting_reason"].startswith("held"), info
    cluster.request("POST", f"/v1/jobs/{job_id}/cancel")
    assert cluster.wait_job(job_id, timeout=60)["state"] == "cancelled"


def test_begin_later_waits_then_runs(cluster):
    out = cli_ok(cluster, "submit", "--begin", "now+3s", "--", "echo", "begun")
    job_id = int(out.split()[0])
    info = cluster.job(job_id)
    assert info["state"] == "waiting" and info["waiting_reason"].startswith("begin_time"), info
    done = cluster.wait_job(job_id, timeout=60)
    assert done["state"] == "succeeded"
    begun = next(e for e in cluster.events(job_id) if e["kind"] == "job_begin_time")
    assert begun["at"] >= info["spec"]["begin_at"]


def test_job_control_refusals_change_nothing(cluster):
    done = cluster.submit({"command": ["true"]})
    cluster.wait_job(done)
    bad = cluster.cli("job", "update", str(done), "--time", "25:99")
    assert bad.returncode == 2 and "--time" in bad.stderr, bad.stderr
    ended = cluster.request("POST", f"/v1/jobs/{done}/hold")
    assert ended.status_code == 409 and ended.json()["error"]["code"] == "job_ended", ended.text
    for body in ({"priority": "nonsense"}, {"timeout_seconds": "25:99"}, {"colour": "red"}, {}):
        answer = cluster.request("PATCH", f"/v1/jobs/{done}", json=body)
        assert answer.status_code == 400 or answer.status_code == 409, (body, answer.text)
    over = cluster.request("POST", "/v1/jobs", json={"command": ["true"], "grace_seconds": 61})
    assert over.status_code == 400 and over.json()["error"]["code"] == "grace_above_limit", over.text
    # a user who may not change the job: 404 (it may not see it), and nothing changed
    token = cluster.request("POST", "/v1/users", json={"name": "other"}).json()["token"]
    for path in (f"/v1/jobs/{done}/requeue", f"/v1/jobs/{done}/hold", f"/v1/jobs/{done}/release"):
        answer = cluster.request("POST", path, token=token)
        assert answer.status_code in (403, 404), answer.text
    answer = cluster.request("PATCH", f"/v1/jobs/{done}", token=token, json={"name": "x"})
    assert answer.status_code in (403, 404), answer.text
    info = cluster.job(done)
    assert info["state"] == "succeeded" and info["attempt"] == 1 and info["name"] is None, json.dumps(info)[:500]


def test_a_time_limit_shortened_while_running_ends_the_run_at_its_new_deadline(cluster):
    out = cli_ok(cluster, "submit", "--time", "10:00", "--signal", "USR1@3", "--grace", "2", "--", *python(SIGNALLED))
    job_id = out.split()[0]
    wait_for(lambda: "working" in cluster.log_text(int(job_id)), 30, "the job to run")
    assert "timeout_seconds=8" in cli_ok(cluster, "job", "update", job_id, "--time", "0:08")
    done = cluster.wait_job(int(job_id), timeout=60)
    text = cluster.log_text(int(job_id))
    assert done["state"] == "failed" and done["tasks"][0]["outcome"] == "timed_out", text
    assert "time limit changed to 8 s (was 600 s" in text, text
    # the limit's SIGTERM came at the new deadline, within a second: measured on the task's own clock, which
    # starts after the worker's (its sandbox and interpreter start first), so at most 8 s plus that second
    term = float(text.split("term after ")[1].split()[0])
    assert term < 8 + 1.0, text
    assert "usr1 after" in text, text
    sent = wait_for(lambda: signalled(cluster, int(job_id)), 30, "its finish")
    assert [(s["signal"], s["why"]) for s in sent] == [("SIGUSR1", "time_limit"), ("SIGTERM", "time_limit")], sent


def test_a_time_limit_passed_already_ends_the_run_now_and_a_longer_one_lets_it_run(cluster):
    out = cli_ok(cluster, "submit", "--time", "10:00", "--", *python(SIGNALLED))
    passed = int(out.split()[0])
    longer = cluster.submit({"command": ["sh", "-c", "echo working; sleep 12; echo done"], "timeout_seconds": 8})
    wait_for(lambda: "working" in cluster.log_text(passed) and "working" in cluster.log_text(longer), 30, "both to run")
    cli_ok(cluster, "job", "update", str(longer), "--time", "1:00")
    # "0:01" is one second (MM:SS; a bare "1" is a minute, as Slurm reads it), and it has run longer already
    started = next(e["at"] for e in cluster.events(passed) if e["kind"] == "task_started")
    time.sleep(max(0.0, started + 2 - time.time()))
    cli_ok(cluster, "job", "update", str(passed), "--time", "0:01")
    done = cluster.wait_job(passed, timeout=30)  # ended now: well before its old limit of 600 s
    assert done["state"] == "failed" and done["tasks"][0]["outcome"] == "timed_out", cluster.log_text(passed)
    assert "time limit changed to 1 s (was 600 s" in cluster.log_text(passed), cluster.log_text(passed)
    wait_for(lambda: "term after" in cluster.log_text(passed), 30, "its SIGTERM")  # the normal stop
    kept = cluster.wait_job(longer, timeout=60)  # ran 12 s, past its first limit of 8 s
    assert kept["state"] == "succeeded", (kept, cluster.log_text(longer))
    assert "time limit changed to 60 s (was 8 s" in cluster.log_text(longer)
