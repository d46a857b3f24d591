"""Upload quotas (issue 36, item 14), against a real `gpulayer server start --upload-quota-mb 1`.

Before, a user in no project filled the artifact store's disk with uploads no job named; everyone
else's uploads got 507 and health 503 until the sweep, 7 days later. Now a user's (and a project's)
uploads that no job names yet hold at most the quota: past it 413 `upload_quota_exceeded`, nothing
stored, and other users upload on.
"""
from __future__ import annotations

import hashlib
import os

import pytest
import requests

from gpulayer.testing import ControlPlaneProcess

pytestmark = pytest.mark.timeout(180)
KIB = 1024


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    """A real server with a 1 MiB quota per user and 2 MiB per project; `loner` is in no project, `a` and
    `b` in p1 alone."""
    args = ["--upload-quota-mb", "1", "--project-upload-quota-mb", "2"]
    with ControlPlaneProcess(tmp_path_factory.mktemp("quota"), args=args) as plane:
        admin = plane.client()
        admin.add_project("p1")
        tokens = {name: admin.add_user(name, projects=projects)["token"]
                  for name, projects in (("loner", []), ("a", [("p1", "member")]), ("b", [("p1", "member")]))}
        admin.remove_member("default", "loner")
        yield plane, tokens


def put(plane, token: str, data: bytes, *, chunked: bool = False) -> requests.Response:
    body = iter([data[i:i + 64 * KIB] for i in range(0, len(data), 64 * KIB)]) if chunked else data
    return plane.request("PUT", f"/v1/artifacts/{digest(data)}", token=token, data=body, timeout=30)


def stored(plane, data: bytes) -> bool:
    return bool(plane.sql("SELECT count(*) FROM artifacts WHERE digest = ?", (digest(data),))[0][0])


def test_a_user_in_no_project_cannot_fill_the_store(team):
    plane, tokens = team
    first = os.urandom(700 * KIB)
    assert put(plane, tokens["loner"], first).status_code == 201
    for chunked in (False, True):   # declared (refused before a byte is read), and cut off at the quota
        more = os.urandom(700 * KIB)
        answer = put(plane, tokens["loner"], more, chunked=chunked)
        assert answer.status_code == 413, answer.text
        error = answer.json()["error"]
        assert error["code"] == "upload_quota_exceeded" and "1048576 bytes" in error["message"], error
        assert answer.json()["quota_bytes"] == 1024 * 1024
        assert not stored(plane, more)
    # everyone else uploads on, and the server stays healthy
    assert put(plane, tokens["a"], os.urandom(100 * KIB)).status_code == 201
    assert put(plane, plane.client_token, os.urandom(1500 * KIB)).status_code == 201   # admins are not bound
    assert plane.request("GET", "/v1/health").status_code == 200


def test_a_job_naming_the_uploads_gives_the_quota_back(team):
    plane, tokens = team
    data = os.urandom(900 * KIB)
    assert put(plane, tokens["b"], data).status_code == 201
    assert put(plane, tokens["b"], os.urandom(300 * KIB)).status_code == 413
    job = plane.request("POST", "/v1/jobs", token=tokens["b"],
                        json={"command": ["true"], "hold": True, "source": digest(data)})
    assert job.status_code == 201, job.text
    assert put(plane, tokens["b"], os.urandom(300 * KIB)).status_code == 201


def test_a_project_quota_bounds_its_members_together(team):
    plane, _ = team
    admin = plane.client()
    admin.add_project("p2")
    d, e, f = (admin.add_user(name, projects=[("p2", "member")])["token"] for name in ("d", "e", "f"))
    assert put(plane, d, os.urandom(900 * KIB)).status_code == 201
    assert put(plane, e, os.urandom(900 * KIB)).status_code == 201
    answer = put(plane, f, os.urandom(300 * KIB))   # f's own 1 MiB is free; p2's 2 MiB would hold 2,100 KiB
    assert answer.status_code == 413 and "its project" in answer.json()["error"]["message"], answer.text
