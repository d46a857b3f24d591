"""Quotas, borrowing, fair share, preemption and the usage ledger with a real server process, real worker
processes (GPUs faked with `--gpus N`: the agent's probe is the only thing not real) and real HTTP; a project's
priority ceiling, and what a member sees of another project's jobs (issue 22, items 6 and 7)."""
from __future__ import annotations

import json
import sys
import textwrap

import pytest

from gpulayer.testing import wait_for
from integration_cluster import Cluster

# A task that checkpoints on SIGTERM: the next run (GPULAYER_PREEMPTED=1) resumes and succeeds.
CHECKPOINTING = textwrap.dedent("""
    import os, signal, sys, time
    if os.environ.get("GPULAYER_PREEMPTED") == "1":
        print("resumed after a preemption", flush=True)
        sys.exit(0)
    def stop(signum, frame):
        print("got SIGTERM: checkpointing", flush=True)
        time.sleep(0.5)
        sys.exit(143)
    signal.signal(signal.SIGTERM, stop)
    print("working", flush=True)
    time.sleep(120)
""")


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    c.args = ["--preempt-grace", "3"]
    c.start_server()
    try:
        yield c
    finally:
        c.close()


def admin(c: Cluster, method: str, path: str, body: dict) -> dict:
    answer = c.request(method, f"/v1{path}", json=body)
    assert answer.status_code in (200, 201), answer.text
    return answer.json()


def team(c: Cluster, **quotas: dict) -> dict:
    """Projects named by `quotas` ({gpus, borrow, weight}), each with one user of the same name; their tokens."""
    tokens = {}
    for name, settings in quotas.items():
        admin(c, "POST", "/projects", {"name": name, **settings})
        tokens[name] = admin(c, "POST", "/users", {"name": f"u{name}", "projects": [{"project": name}]})["token"]
    return tokens


def submit_as(c: Cluster, token: str, project: str, spec: dict) -> int:
    answer = c.request("POST", "/v1/jobs", token=token, json={**spec, "project": project})
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_high_priority_job_preempts_a_preemptible_one_which_resumes(cluster):
    cluster.start_worker("gpu", gpus=1, parallel=1)
    low = cluster.submit({"command": python(CHECKPOINTING), "gpus": 1, "priority": "low", "preemptible": True})
    wait_for(lambda: "working" in cluster.log_text(low), 30, "the low-priority job to run")
    high = cluster.submit({"command": ["echo", "high"], "gpus": 1, "priority": "high"})
    assert cluster.wait_job(high, timeout=60)["state"] == "succeeded"
    done = cluster.wait_job(low, timeout=60)
    assert done["state"] == "succeeded" and done["attempt"] == 1, done
    text = cluster.log_text(low)
    assert "got SIGTERM: checkpointing" in text and "resumed after a preemption" in text, text
    assert "SIGKILL after 3 s" in text  # the server's --preempt-grace reached the agent
    kinds = [e["kind"] for e in cluster.events(low)]
    assert "task_preempt_requested" in kinds and "task_preempted" in kinds and "job_retried" not in kinds
    preempted = next(e for e in cluster.events(low) if e["kind"] == "task_preempted")
    assert preempted["data"]["for_job_id"] == high
    assert [p["for_job_id"] for p in done["preemptions"]] == [high]
    status = cluster.cli("job", "status", str(low))
    assert status.returncode == 0 and f"(job {high}, priority)" in status.stdout, status.stdout


def test_borrowed_gpus_are_reclaimed_when_the_lender_submits(cluster):
    tokens = team(cluster, ml={"gpus": 1, "borrow": 1}, cv={"gpus": 1})
    cluster.start_worker("gpu", gpus=2, parallel=2)
    ml = [submit_as(cluster, tokens["ml"], "ml", {"command": ["sleep", "120"], "gpus": 1}) for _ in range(2)]
    third = submit_as(cluster, tokens["ml"], "ml", {"command": ["sleep", "120"], "gpus": 1})
    wait_for(lambda: all(cluster.job(j)["state"] == "running" for j in ml), 30, "ml to run on both GPUs")
    assert cluster.job(third)["waiting_reason"] == "project ml at its quota (2 GPUs in use, 1 borrowed)"
    cv = submit_as(cluster, tokens["cv"], "cv", {"command": ["sleep", "120"], "gpus": 1})
    wait_for(lambda: cluster.job(cv)["state"] == "running", 30, "cv to get its GPU back")
    requeued = [j for j in ml if cluster.job(j)["state"] == "queued"]
    assert len(requeued) == 1, [cluster.job(j)["state"] for j in ml]
    info = cluster.job(requeued[0])
    assert info["attempt"] == 1 and info["preemptions"][0]["reason"] == "borrowed"
    assert info["preemptions"][0]["for_job_id"] == cv
    for job_id in [*ml, third, cv]:
        cluster.request("POST", f"/v1/jobs/{job_id}/cancel")


def test_fair_share_splits_gpu_seconds_between_two_full_queues(cluster):
    tokens = team(cluster, pa={"weight": 1}, pb={"weight": 1})
    cluster.start_worker("gpu", gpus=2, parallel=2)
    spec = {"command": ["sleep", "0.3"], "gpus": 1}
    # pa's whole sweep is queued first: first come first served would run all of it before pb's
    first = [submit_as(cluster, tokens["pa"], "pa", spec) for _ in range(40)]
    second = [submit_as(cluster, tokens["pb"], "pb", spec) for _ in range(40)]

    def finished() -> int:
        return sum(1 for j in first + second if cluster.job(j)["state"] == "succeeded")
    wait_for(lambda: finished() >= 40, 120, "half the jobs to finish")
    usage = {r["key"]: r["gpu_hours"] * 3600 for r in cluster.get_json("/v1/usage?by=project&since=1h")["rows"]}
    for job_id in first + second:
        cluster.request("POST", f"/v1/jobs/{job_id}/cancel")
    a, b = usage["pa"], usage["pb"]
    assert abs(a - b) <= 0.1 * (a + b), usage


def test_the_usage_ledger_matches_the_tasks_run_times(cluster):
    tokens = team(cluster, ml={"gpus": 4})
    cluster.start_worker("gpu", gpus=2, parallel=1)
    code = "import time, json; a = time.time(); time.sleep(1.5); print(json.dumps([a, time.time()]))"
    job_id = submit_as(cluster, tokens["ml"], "ml", {"command": python(code), "gpus": 2, "name": "timed"})
    info = cluster.wait_job(job_id, timeout=60)
    assert info["state"] == "succeeded"
    task = info["tasks"][0]
    began, ended = json.loads(next(ln for ln in cluster.log_text(job_id).splitlines() if ln.startswith("[")))
    rows = cluster.sql("SELECT started_at, ended_at, gpu_seconds, gpus, outcome FROM usage WHERE job_id = ?",
                       (job_id,))
    assert len(rows) == 1
    started_at, ended_at, gpu_seconds, gpus, outcome = rows[0]
    assert (started_at, ended_at, gpus, outcome) == (task["started_at"], task["finished_at"], 2, "succeeded")
    assert gpu_seconds == pytest.approx(2 * (ended_at - started_at))
    # the run the process measured itself lies within the ledger's, which adds only the agent's start and report
    assert started_at - 0.5 <= began and ended <= ended_at + 0.5
    assert 1.4 <= ended_at - started_at <= (ended - began) + 3
    answer = cluster.cli("usage", "--by", "job-name", "--since", "1h", "--json")
    assert answer.returncode == 0, answer.stderr
    assert json.loads(answer.stdout)["rows"][0]["key"] == "timed"
    table = cluster.cli("usage", "--by", "project")
    assert table.returncode == 0 and "ml" in table.stdout and "GPU-HOURS" in table.stdout


# A task that ignores SIGTERM: the grace passes, then SIGKILL ends it.
STUBBORN = textwrap.dedent("""
    import signal, time
    signal.signal(signal.SIGTERM, lambda *_: print("ignoring SIGTERM", flush=True))
    print("working", flush=True)
    time.sleep(120)
""")


def test_a_victim_that_ignores_sigterm_is_killed_after_the_grace(cluster):
    cluster.start_worker("gpu", gpus=1, parallel=1)
    low = cluster.submit({"command": python(STUBBORN), "gpus": 1, "priority": "low", "preemptible": True,
                          "retry": {"max_attempts": 1}})
    wait_for(lambda: "working" in cluster.log_text(low), 30, "the low-priority job to run")
    high = cluster.submit({"command": ["echo", "high"], "gpus": 1, "priority": "high"})
    assert cluster.wait_job(high, timeout=60)["state"] == "succeeded"
    events = {e["kind"]: e for e in cluster.events(low)}
    asked, requeued = events["task_preempt_requested"]["at"], events["task_preempted"]["at"]
    assert 3 <= requeued - asked < 3 + 10, (asked, requeued)   # the server's --preempt-grace 3, then SIGKILL
    assert "ignoring SIGTERM" in cluster.log_text(low)
    info = cluster.job(low)
    assert info["attempt"] == 1 and info["state"] in ("queued", "running")  # requeued, no attempt used
    cluster.request("POST", f"/v1/jobs/{low}/cancel")


def test_a_victim_whose_worker_goes_silent_in_the_grace_keeps_its_attempt(cluster):
    worker = cluster.start_worker("gpu", gpus=1, parallel=1)
    low = cluster.submit({"command": python(STUBBORN), "gpus": 1, "priority": "low", "preemptible": True,
                          "retry": {"max_attempts": 1}})
    wait_for(lambda: "working" in cluster.log_text(low), 30, "the low-priority job to run")
    high = cluster.submit({"command": ["echo", "high"], "gpus": 1, "priority": "high"})
    wait_for(lambda: any(e["kind"] == "task_preempt_requested" for e in cluster.events(low)), 30,
             "the preemption to be asked")
    worker.pause()   # the agent stops answering within the grace: its lease (3 s) expires first
    try:
        wait_for(lambda: any(e["kind"] == "task_preempted" for e in cluster.events(low)), 30,
                 "the victim to be requeued at its lease's expiry")
    finally:
        worker.resume()
    preempted = next(e for e in cluster.events(low) if e["kind"] == "task_preempted")
    assert preempted["data"]["worker_lost"] is True and preempted["data"]["for_job_id"] == high
    kinds = [e["kind"] for e in cluster.events(low)]
    assert "task_lost" not in kinds and "job_retried" not in kinds
    # not lost (its one attempt spent): the worker comes back, runs the high job, then the victim again
    assert cluster.wait_job(high, timeout=60)["state"] == "succeeded"
    wait_for(lambda: cluster.log_text(low).count("working") >= 2, 60, "the victim to run again")
    info = cluster.job(low)
    assert info["attempt"] == 1 and info["state"] == "running", info
    outcomes = [r[0] for r in cluster.sql("SELECT outcome FROM usage WHERE job_id = ? ORDER BY id", (low,))]
    assert outcomes == ["preempted"], outcomes
    cluster.request("POST", f"/v1/jobs/{low}/cancel")


def test_a_waiting_gang_preempts_on_two_workers_and_runs_whole(cluster):
    for name in ("g1", "g2"):
        cluster.start_worker(name, gpus=1, parallel=1)
    low = [cluster.submit({"command": python(CHECKPOINTING), "gpus": 1, "priority": "low", "preemptible": True})
           for _ in range(2)]
    wait_for(lambda: all("working" in cluster.log_text(j) for j in low), 30, "both low-priority jobs to run")
    gang = cluster.submit({"command": ["echo", "rank"], "gpus": 1, "nodes": 2, "priority": "high"})
    done = cluster.wait_job(gang, timeout=60)
    assert done["state"] == "succeeded", done
    assert len({t["worker_id"] for t in done["tasks"]}) == 2
    for job_id in low:   # each stopped for the gang, then resumed on the same attempt
        info = cluster.wait_job(job_id, timeout=60)
        assert info["state"] == "succeeded" and info["attempt"] == 1, info
        assert [p["for_job_id"] for p in info["preemptions"]] == [gang]
        assert "resumed after a preemption" in cluster.log_text(job_id)


# -- issue 22, items 6 and 7: the priority ceiling on the wire; what a member of project A sees of project B's
# jobs that preempted its work or that its job depended on ---------------------------------------------

def ok(answer, *codes: int) -> dict:
    assert answer.status_code in (codes or (200, 201)), answer.text
    return answer.json()


def test_a_member_may_not_raise_priority_above_its_projects_ceiling(cluster):
    ok(cluster.request("POST", "/v1/projects", json={"name": "pa"}))
    lead = ok(cluster.request("POST", "/v1/users", json={"name": "lead", "projects": [
        {"project": "pa", "role": "manager"}]}))["token"]
    ua = ok(cluster.request("POST", "/v1/users", json={"name": "ua", "projects": [{"project": "pa"}]}))["token"]
    refused = cluster.request("POST", "/v1/jobs", token=ua,
                              json={"command": ["true"], "project": "pa", "priority": 1_000_000})
    assert refused.status_code == 403, refused.text
    body = refused.json()
    assert body["error"]["code"] == "priority_above_ceiling" and body["max_priority"] == 0
    assert "max_priority 0" in body["error"]["message"]
    assert cluster.sql("SELECT count(*) FROM jobs")[0][0] == 0   # nothing was submitted
    ok(cluster.request("POST", "/v1/jobs", token=ua, json={"command": ["true"], "project": "pa", "priority": "low"}))
    # the manager raises the ceiling (its lever); a member may not, nor may the manager change anything else
    assert ok(cluster.request("PATCH", "/v1/projects/pa", token=lead, json={"max_priority": 10}))["max_priority"] == 10
    assert cluster.request("PATCH", "/v1/projects/pa", token=ua, json={"max_priority": 99}).status_code == 403
    assert cluster.request("PATCH", "/v1/projects/pa", token=lead, json={"gpus": 99}).status_code == 403
    for bad in ("high", 10**7, True, 1.5):
        answer = cluster.request("PATCH", "/v1/projects/pa", json={"max_priority": bad})
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_field", answer.text
    ok(cluster.request("POST", "/v1/jobs", token=ua, json={"command": ["true"], "project": "pa", "priority": "high"}))
    # the CLI: the error names the ceiling; project list shows it
    cli = cluster.cli("submit", "--project", "pa", "--priority", "11", "--", "true", GPULAYER_TOKEN=ua)
    assert cli.returncode != 0 and "max_priority 10" in cli.stderr, (cli.stdout, cli.stderr)
    listed = cluster.cli("project", "list")
    assert listed.returncode == 0 and "MAX PRIORITY" in listed.stdout, listed.stdout
    assert cluster.cli("project", "set", "pa", "--max-priority", "3").returncode == 0
    assert cluster.cli("project", "set", "pa", "--max-priority", "x").returncode == 2
    assert ok(cluster.request("GET", "/v1/projects/pa"))["max_priority"] == 3


def test_a_member_sees_no_id_of_the_other_projects_job_that_preempted_its_own(cluster):
    ok(cluster.request("POST", "/v1/projects", json={"name": "pa"}))
    ok(cluster.request("POST", "/v1/projects", json={"name": "pb", "max_priority": 10}))
    ua = ok(cluster.request("POST", "/v1/users", json={"name": "ua", "projects": [{"project": "pa"}]}))["token"]
    ub = ok(cluster.request("POST", "/v1/users", json={"name": "ub", "projects": [{"project": "pb"}]}))["token"]
    cluster.start_worker("gpu", gpus=1, parallel=1)
    low = ok(cluster.request("POST", "/v1/jobs", token=ua, json={
        "command": python(CHECKPOINTING), "gpus": 1, "priority": "low", "preemptible": True,
        "project": "pa"}))["id"]
    wait_for(lambda: "working" in cluster.log_text(low), 30, "pa's job to run")
    high = ok(cluster.request("POST", "/v1/jobs", token=ub, json={
        "command": ["echo", "pb"], "gpus": 1, "priority": "high", "project": "pb"}))["id"]
    high_task = wait_for(lambda: cluster.current_tasks(high), 30, "pb's task")[0]["task_id"]
    wait_for(lambda: any(e["kind"] == "task_preempted" for e in cluster.events(low)), 60, "the preemption")
    assert cluster.wait_job(low, timeout=60)["state"] == "succeeded"
    # the admin sees who preempted whom
    assert [p["for_job_id"] for p in cluster.job(low)["preemptions"]] == [high]
    # ua: the job, its events and the CLI name no pb job or task
    view = ok(cluster.request("GET", f"/v1/jobs/{low}", token=ua))
    assert view["preemptions"] and all(p["for_job_id"] is None and p["for_task_id"] is None
                                       for p in view["preemptions"])
    events = ok(cluster.request("GET", f"/v1/jobs/{low}/events", token=ua))["events"]
    preempt = [e for e in events if e["kind"] in ("task_preempt_requested", "task_preempted")]
    assert len(preempt) == 2 and all(e["data"]["for_job_id"] is None and e["data"]["for_task_id"] is None
                                     for e in preempt)
    listed = ok(cluster.request("GET", "/v1/jobs", token=ua))["jobs"]
    assert all(p["for_job_id"] is None for j in listed for p in j.get("preemptions") or [])
    status = cluster.cli("job", "status", str(low), GPULAYER_TOKEN=ua)
    shown = cluster.cli("job", "events", str(low), "--json", GPULAYER_TOKEN=ua)
    as_json = cluster.cli("job", "status", str(low), "--json", GPULAYER_TOKEN=ua)
    assert status.returncode == shown.returncode == as_json.returncode == 0, status.stderr + shown.stderr
    assert "for a job you may not see (priority)" in status.stdout, status.stdout
    for text in (status.stdout, shown.stdout, as_json.stdout, json.dumps(view), json.dumps(events)):
        assert f"job {high}" not in text and f'"for_job_id": {high}' not in text
        assert f'"for_task_id": {high_task}' not in text and f"task {high_task}" not in text
    # and pb's user may not see pa's job at all
    assert ok(cluster.request("GET", f"/v1/jobs/{low}", token=ub), 404)


def test_a_dependency_the_caller_may_no_longer_see_shows_no_final_state(cluster):
    ok(cluster.request("POST", "/v1/projects", json={"name": "pa"}))
    ok(cluster.request("POST", "/v1/projects", json={"name": "pb"}))
    ua = ok(cluster.request("POST", "/v1/users", json={"name": "ua", "projects": [
        {"project": "pa"}, {"project": "pb"}]}))["token"]
    ub = ok(cluster.request("POST", "/v1/users", json={"name": "ub", "projects": [{"project": "pb"}]}))["token"]
    cluster.start_worker("cpu", parallel=2)
    hidden = ok(cluster.request("POST", "/v1/jobs", token=ub, json={
        "command": [sys.executable, "-c", "import time; time.sleep(1.5); raise SystemExit(3)"],
        "project": "pb", "name": "pb-private"}))["id"]
    mine = ok(cluster.request("POST", "/v1/jobs", token=ua, json={
        "command": ["true"], "project": "pa", "after": [f"{hidden}:ok"]}))["id"]  # ua saw it, as pb's member
    assert cluster.request("DELETE", "/v1/projects/pb/members/ua").status_code == 200
    assert cluster.wait_job(hidden)["state"] == "failed"
    done = cluster.wait_job(mine)
    assert done["state"] == "cancelled" and done["reason"] == "dependency_failed"
    # the admin sees how the dependency ended
    failed = next(e for e in cluster.events(mine) if e["kind"] == "dependency_failed")
    assert failed["data"] == {"after": hidden, "state": "failed"}
    events = ok(cluster.request("GET", f"/v1/jobs/{mine}/events", token=ua))["events"]
    failed = next(e for e in events if e["kind"] == "dependency_failed")
    assert failed["data"] == {"after": hidden, "state": None}
    view = ok(cluster.request("GET", f"/v1/jobs/{mine}", token=ua))
    assert view["after"] == [{"job": hidden, "condition": "ok", "name": None, "state": None}]
    for args in (("job", "status", str(mine)), ("job", "events", str(mine), "--json"),
                 ("job", "status", str(mine), "--json")):
        shown = cluster.cli(*args, GPULAYER_TOKEN=ua)
        assert shown.returncode == 0, shown.stderr
        assert "failed" not in shown.stdout.replace("dependency_failed", ""), shown.stdout
        assert "pb-private" not in shown.stdout
