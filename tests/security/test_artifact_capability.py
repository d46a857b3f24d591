"""A digest is no read capability (issue 36, item 7), against a real `gpulayer server start`.

Before, submit checked only that a named digest was stored and a checkpoint only that its files were
stored with their sizes, and either then let its caller download the bytes: a user of another project
named someone's upload as an input of a held job of its own and read it; a worker session recorded it
as a checkpoint file (or an output) of its task and read it (or let the job's owner read it). Now naming a digest needs the right to read it (an own
upload, or what a job the caller may read names): 403 `artifact_forbidden`, nothing written, and a
probe (HEAD) answers 404, so that a client uploads the bytes (proving it holds them) rather than name
them.
"""
from __future__ import annotations

import hashlib

import pytest

from gpulayer.testing import ControlPlaneProcess

pytestmark = pytest.mark.timeout(180)
PROTO = {"X-GpuLayer-Protocol": "1"}
SECRET = b"alice's private weights, uploaded for her own job"


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    """A real server; alice in p1 uploaded SECRET (no job names it yet); mallory is in p2."""
    with ControlPlaneProcess(tmp_path_factory.mktemp("capability")) as plane:
        admin = plane.client()
        admin.add_project("p1")
        admin.add_project("p2")
        tokens = {name: admin.add_user(name, projects=[(project, "member")])["token"]
                  for name, project in (("alice", "p1"), ("mallory", "p2"))}
        put = plane.request("PUT", f"/v1/artifacts/{digest(SECRET)}", token=tokens["alice"], data=SECRET)
        assert put.status_code == 201, put.text
        yield plane, tokens


def jobs_of(plane, user: str) -> int:
    return plane.sql("SELECT count(*) FROM jobs j JOIN users u ON u.id = j.user_id WHERE u.name = ?", (user,))[0][0]


@pytest.mark.parametrize("field", ["inputs", "source", "image"])
def test_a_user_cannot_read_an_upload_by_naming_it_in_a_held_job(team, field):
    plane, tokens = team
    mallory, secret = tokens["mallory"], digest(SECRET)
    assert plane.request("GET", f"/v1/artifacts/{secret}", token=mallory).status_code == 403
    named = {"inputs": {"inputs": {"stolen.bin": secret}}, "source": {"source": secret},
             "image": {"image": {"manifest": secret, "blobs": [secret]}}}[field]
    before = jobs_of(plane, "mallory")
    answer = plane.request("POST", "/v1/jobs", token=mallory,
                           json={"command": ["true"], "project": "p2", "hold": True, **named})
    assert answer.status_code == 403, answer.text
    assert answer.json()["error"]["code"] == "artifact_forbidden" and secret in answer.json()["error"]["message"]
    assert jobs_of(plane, "mallory") == before   # nothing written
    got = plane.request("GET", f"/v1/artifacts/{secret}", token=mallory)
    assert got.status_code == 403 and got.content != SECRET
    # the probe says nothing of someone else's bytes: not stored, as far as mallory may know
    assert plane.request("HEAD", f"/v1/artifacts/{secret}", token=mallory).status_code == 404


def test_the_owner_and_who_holds_the_bytes_still_name_them(team):
    """Alice names her own upload; mallory, once it uploads the same bytes (it holds them), may too; the
    admin names anything."""
    plane, tokens = team
    secret = digest(SECRET)
    assert plane.request("HEAD", f"/v1/artifacts/{secret}", token=tokens["alice"]).status_code == 200
    assert plane.request("GET", f"/v1/artifacts/{secret}", token=tokens["alice"]).content == SECRET
    for who, project in (("alice", "p1"), (None, "p1")):
        answer = plane.request("POST", "/v1/jobs", token=tokens.get(who or ""),  # None: the admin's token
                               json={"command": ["true"], "project": project, "hold": True,
                                     "inputs": {"w.bin": secret}})
        assert answer.status_code == 201, answer.text
    own = b"mallory's own bytes"
    assert plane.request("PUT", f"/v1/artifacts/{digest(own)}", token=tokens["mallory"], data=own).status_code == 201
    answer = plane.request("POST", "/v1/jobs", token=tokens["mallory"],
                           json={"command": ["true"], "project": "p2", "hold": True, "source": digest(own)})
    assert answer.status_code == 201, answer.text


def register(plane, name: str) -> str:
    answer = plane.request("POST", "/v1/workers/register", token=plane.join_token, headers=PROTO, json={
        "name": name, "labels": {}, "version": "test", "slots": 1,
        "resources": {"cpus": 1, "gpus": 0, "memory_mb": 100, "gpu_models": []}})
    assert answer.status_code == 200, answer.text
    return answer.json()["session_token"]


def as_worker(plane, session: str, path: str, body: dict):
    return plane.request("POST", path, token=session, headers=PROTO, json=body)


def test_a_worker_cannot_read_an_upload_by_recording_it_as_a_checkpoint(team):
    plane, tokens = team
    secret = digest(SECRET)
    job = plane.request("POST", "/v1/jobs", token=tokens["mallory"], json={"command": ["sleep", "60"], "project": "p2"})
    assert job.status_code == 201, job.text
    session = register(plane, "w-thief")
    task = as_worker(plane, session, "/v1/worker/acquire", {}).json()["task"]
    assert task["job_id"] == job.json()["id"]
    assert as_worker(plane, session, f"/v1/worker/tasks/{task['task_id']}/start", {"pid": 4242}).status_code == 200
    assert plane.request("GET", f"/v1/artifacts/{secret}", token=session, headers=PROTO).status_code == 403
    stolen = {"path": "stolen.bin", "digest": secret, "size": len(SECRET), "mode": 0o644}
    answer = as_worker(plane, session, "/v1/worker/checkpoint", {"task_id": task["task_id"], "files": [stolen]})
    assert answer.status_code == 403, answer.text
    assert answer.json()["error"]["code"] == "artifact_forbidden"
    assert plane.sql("SELECT count(*) FROM checkpoints WHERE job_id = ?", (task["job_id"],))[0][0] == 0
    assert plane.request("GET", f"/v1/artifacts/{secret}", token=session, headers=PROTO).status_code == 403
    assert plane.request("GET", f"/v1/artifacts/{secret}", token=tokens["mallory"]).status_code == 403
    assert plane.request("HEAD", f"/v1/artifacts/{secret}", token=session, headers=PROTO).status_code == 404
    # the same through the finish's checkpoint and outputs: the finish counts, they are left out
    finish = as_worker(plane, session, f"/v1/worker/tasks/{task['task_id']}/finish",
                       {"exit_code": 1, "outcome": "failed", "checkpoint": {"files": [stolen]},
                        "outputs": {"stolen.bin": secret}})
    assert finish.status_code == 200 and finish.json()["accepted"], finish.text
    assert plane.sql("SELECT count(*) FROM checkpoints WHERE job_id = ?", (task["job_id"],))[0][0] == 0
    kinds = [e["kind"] for e in plane.events(task["job_id"])]
    assert "checkpoint_incomplete" in kinds and "outputs_refused" in kinds
    assert plane.sql("SELECT outputs FROM tasks WHERE id = ?", (task["task_id"],))[0][0] == "{}"
    assert plane.request("GET", f"/v1/artifacts/{secret}", token=tokens["mallory"]).status_code == 403


def test_a_worker_records_the_checkpoint_files_it_uploaded(team):
    """The agent's own way: HEAD (404 for what it may not read), PUT, record."""
    plane, tokens = team
    job = plane.request("POST", "/v1/jobs", token=tokens["alice"], json={"command": ["sleep", "60"], "project": "p1"})
    session = register(plane, "w-honest")
    task = as_worker(plane, session, "/v1/worker/acquire", {}).json()["task"]
    assert task["job_id"] == job.json()["id"]
    as_worker(plane, session, f"/v1/worker/tasks/{task['task_id']}/start", {"pid": 4243})
    # the bytes equal alice's upload: the worker may not learn that, so it sends them, and holds them then
    assert plane.request("HEAD", f"/v1/artifacts/{digest(SECRET)}", token=session, headers=PROTO).status_code == 404
    put = plane.request("PUT", f"/v1/artifacts/{digest(SECRET)}", token=session, headers=PROTO, data=SECRET)
    assert put.status_code == 201, put.text
    files = [{"path": "w.bin", "digest": digest(SECRET), "size": len(SECRET), "mode": 0o644}]
    answer = as_worker(plane, session, "/v1/worker/checkpoint", {"task_id": task["task_id"], "files": files})
    assert answer.status_code == 200, answer.text
    assert plane.request("HEAD", f"/v1/artifacts/{digest(SECRET)}", token=session, headers=PROTO).status_code == 200
