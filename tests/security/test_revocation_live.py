"""Removal and revocation take effect at once, parked requests included (issue 22 items 4 and 5).

A real server process; the worker is played by hand over HTTP, so each log line is written exactly
when the test says. A follow or acquire parked before its caller was removed or revoked answers 401
as soon as that happens, long before its `wait_s`, and gets no line written after.
"""
from __future__ import annotations

import threading

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from gpulayer.testing import ControlPlaneProcess, wait_for

PROTO = {"X-GpuLayer-Protocol": "1"}
WAIT_S = 30          # what each parked request asks for
JOIN_S = 20          # a parked request still waiting after this outlived its caller's removal


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    with ControlPlaneProcess(tmp_path_factory.mktemp("revocation")) as plane:
        yield plane


class Parked:
    """One request in a thread: its response once it answered."""

    def __init__(self, plane, method: str, path: str, token: str, **kwargs):
        self.answer: requests.Response | None = None
        self._thread = threading.Thread(target=self._run, args=(plane, method, path, token, kwargs), daemon=True)
        self._thread.start()

    def _run(self, plane, method, path, token, kwargs):
        self.answer = plane.request(method, path, token=token, headers=PROTO, timeout=WAIT_S + 30, **kwargs)

    def result(self) -> requests.Response:
        self._thread.join(JOIN_S)
        assert not self._thread.is_alive(), f"still parked {JOIN_S} s after its caller was cut off"
        assert self.answer is not None
        return self.answer


def gauge(plane, name: str) -> float:
    text = plane.request("GET", "/metrics").text
    return next(m.samples[0].value for m in text_string_to_metric_families(text) if m.name == name)


def register(plane, name: str, join_token: str) -> tuple[int, str]:
    answer = plane.request("POST", "/v1/workers/register", token=join_token, headers=PROTO, json={
        "name": name, "labels": {"hand": name}, "version": "test", "slots": 1,
        "resources": {"cpus": 1, "gpus": 0, "memory_mb": 100, "gpu_models": []}})
    assert answer.status_code == 200, answer.text
    return answer.json()["worker_id"], answer.json()["session_token"]


def as_worker(plane, session: str, path: str, body: dict) -> dict:
    answer = plane.request("POST", path, token=session, headers=PROTO, json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def line(n: int, text: str) -> dict:
    return {"n": n, "stream": "stdout", "text": text, "at": 1.0}


def test_a_removed_users_token_is_refused_at_once(plane):
    bob = plane.client().add_user("bob")["token"]
    assert plane.request("GET", "/v1/whoami", token=bob).status_code == 200   # cached now
    assert plane.request("DELETE", "/v1/users/bob").status_code == 200
    answer = plane.request("GET", "/v1/whoami", token=bob)
    assert answer.status_code == 401 and answer.json()["error"]["code"] == "unauthorized"


def test_a_demoted_admin_cannot_promote_itself_again(plane):
    root2 = plane.client().add_user("root2", admin=True)["token"]
    assert plane.request("GET", "/v1/users", token=root2).status_code == 200   # cached as an admin
    assert plane.request("PATCH", "/v1/users/root2", json={"admin": False}).status_code == 200
    answer = plane.request("PATCH", "/v1/users/root2", token=root2, json={"admin": True})
    assert answer.status_code == 403 and answer.json()["error"]["code"] == "forbidden"
    assert plane.get_json("/v1/users/root2")["admin"] is False


def running_job(plane, token: str, worker: str, **spec) -> tuple[int, str, dict, int]:
    """A job of `token`'s user, started by a hand-played worker that wrote the line "before": its id, the
    worker's session, its task and the log cursor after that line."""
    job = plane.request("POST", "/v1/jobs", token=token, json={"command": ["true"], "labels": {"hand": worker},
                                                               **spec})
    assert job.status_code == 201, job.text
    _, session = register(plane, worker, plane.join_token)
    task = as_worker(plane, session, "/v1/worker/acquire", {})["task"]
    assert task["job_id"] == job.json()["id"]
    as_worker(plane, session, f"/v1/worker/tasks/{task['task_id']}/start", {"pid": 4242})
    as_worker(plane, session, f"/v1/worker/tasks/{task['task_id']}/logs", {"lines": [line(0, "before")]})
    first = plane.get_json(f"/v1/jobs/{job.json()['id']}/logs")
    assert [x["text"] for x in first["lines"]] == ["before"]
    return job.json()["id"], session, task, first["next"]


def follow_while(plane, job_id: int, after: int, token: str, session: str, task: dict, cut_off: str) -> dict:
    """Park a follow of the job's log as `token`, have the admin call `cut_off` ("METHOD PATH"), then write
    the line "after" as the worker; the follow's error (checked: the line reached the log, not the follow)."""
    follow = Parked(plane, "GET", f"/v1/jobs/{job_id}/logs?after={after}&wait_s={WAIT_S}", token)
    wait_for(lambda: gauge(plane, "gpulayer_parked_log_polls") == 1, 10, "the follow to park")
    method, path = cut_off.split()
    assert plane.request(method, path).status_code == 200
    as_worker(plane, session, f"/v1/worker/tasks/{task['task_id']}/logs", {"lines": [line(1, "after")]})
    answer = follow.result()
    assert "after" not in answer.text and answer.status_code >= 400, answer.text
    assert [x["text"] for x in plane.get_json(f"/v1/jobs/{job_id}/logs")["lines"]] == ["before", "after"]
    return {"status": answer.status_code, **answer.json()["error"]}


def test_a_parked_log_follow_ends_with_401_when_its_user_is_removed(plane):
    carol = plane.client().add_user("carol")["token"]
    job_id, session, task, after = running_job(plane, carol, "w-logs")
    error = follow_while(plane, job_id, after, carol, session, task, "DELETE /v1/users/carol")
    assert (error["status"], error["code"]) == (401, "unauthorized")


def test_a_parked_log_follow_ends_when_its_user_leaves_the_project(plane):
    admin = plane.client()
    admin.add_project("open", visibility="project")
    owner = admin.add_user("owner", projects=[("open", "member")])["token"]
    dave = admin.add_user("dave", projects=[("open", "member")])["token"]
    job_id, session, task, after = running_job(plane, owner, "w-open", project="open")
    error = follow_while(plane, job_id, after, dave, session, task, "DELETE /v1/projects/open/members/dave")
    assert (error["status"], error["code"]) == (404, "not_found")


def parked_acquire(plane, session: str) -> Parked:
    """The worker's acquire, parked on the long-poll (the gauge says so)."""
    parked_before = gauge(plane, "gpulayer_parked_acquires")
    acquire = Parked(plane, "POST", "/v1/worker/acquire", session, json={"wait_s": WAIT_S})
    wait_for(lambda: gauge(plane, "gpulayer_parked_acquires") == parked_before + 1, 10, "the acquire to park")
    return acquire


def test_a_parked_acquire_ends_with_401_when_its_join_token_is_revoked(plane):
    minted = plane.request("POST", "/v1/tokens", json={"name": "doomed", "labels": {"hand": "w-revoked"}}).json()
    _, session = register(plane, "w-revoked", minted["token"])
    acquire = parked_acquire(plane, session)
    assert plane.request("POST", f"/v1/tokens/{minted['jti']}/revoke", json={}).status_code == 200
    answer = acquire.result()
    assert answer.status_code == 401 and answer.json()["error"]["code"] == "unauthorized", answer.text


def test_a_parked_acquire_ends_with_401_when_its_worker_deregisters(plane):
    _, session = register(plane, "w-leaving", plane.join_token)
    acquire = parked_acquire(plane, session)
    as_worker(plane, session, "/v1/worker/deregister", {})
    answer = acquire.result()
    assert answer.status_code == 401 and answer.json()["error"]["code"] == "unauthorized", answer.text


def test_a_beating_workers_session_is_cut_off_at_its_next_request_after_its_token_is_revoked(plane):
    """Each use renews a cached principal (security/auth.py): a revocation still takes effect at once (the
    heartbeat, which a gone worker may still call, says `revoked`; anything else is refused)."""
    minted = plane.request("POST", "/v1/tokens", json={"name": "beating", "labels": {"hand": "w-beating"}}).json()
    _, session = register(plane, "w-beating", minted["token"])
    for _ in range(3):   # cached, then renewed by each use
        as_worker(plane, session, "/v1/worker/heartbeat", {"tasks": []})
    assert plane.request("POST", f"/v1/tokens/{minted['jti']}/revoke", json={}).status_code == 200
    assert as_worker(plane, session, "/v1/worker/heartbeat", {"tasks": []})["revoked"] is True
    answer = plane.request("POST", "/v1/worker/acquire", token=session, headers=PROTO, json={})
    assert answer.status_code == 401 and answer.json()["error"]["code"] == "unauthorized", answer.text


def test_a_users_client_token_in_use_is_refused_on_its_next_request_after_its_revocation(plane):
    plane.client().add_user("hal")
    minted = plane.request("POST", "/v1/tokens", json={"kind": "client", "user": "hal", "name": "hal-2"}).json()
    for _ in range(3):   # cached, then renewed by each use
        assert plane.request("GET", "/v1/whoami", token=minted["token"]).status_code == 200
    assert plane.request("POST", f"/v1/tokens/{minted['jti']}/revoke", json={}).status_code == 200
    answer = plane.request("GET", "/v1/whoami", token=minted["token"])
    assert answer.status_code == 401 and answer.json()["error"]["code"] == "unauthorized", answer.text
