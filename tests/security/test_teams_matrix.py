"""Teams: every route × every role, against a real server process (docs/security.md, "Teams").

Roles: `admin` (server init's token), `manager` and `member` of project p1, `other` (a member
of p2 only) and `none` (a user in no project). The job under test belongs to `owner`, a
member of p1. Each operation is written out with what each role gets; a test checks the
table covers every route the app serves, so a new route cannot skip the matrix.
"""
from __future__ import annotations

import hashlib

import pytest

from gpulayer.server.http.app import ROUTES
from gpulayer.server.http.openapi import METHODS
from gpulayer.testing import ControlPlaneProcess

ROLES = ("admin", "manager", "member", "other", "none")
DIGEST = "sha256:" + hashlib.sha256(b"teams").hexdigest()
PROTO = {"X-GpuLayer-Protocol": "1"}  # worker routes refuse a request without it (426) before any auth


def codes(admin, manager, member, other, none) -> dict:
    return dict(zip(ROLES, (admin, manager, member, other, none)))


ALL = lambda code: codes(code, code, code, code, code)  # noqa: E731
ADMIN_ONLY = lambda ok: codes(ok, 403, 403, 403, 403)  # noqa: E731
# a job of p1 (private): owner/manager/admin manage, members see, outsiders get 404 (ids do not leak)
SEE = codes(200, 200, 200, 404, 404)
READ = codes(200, 200, 403, 404, 404)

# (method, route template, concrete path, JSON body or None, expected status by role); "{job}" is the job's id
MATRIX = [
    ("get", "/v1/health", "/v1/health", None, ALL(200)),
    ("get", "/v1/ca.pem", "/v1/ca.pem", None, ALL(404)),   # plain HTTP: no CA of its own
    ("post", "/v1/workers/register", "/v1/workers/register", {"name": "x"}, ALL(403)),
    ("post", "/v1/worker/heartbeat", "/v1/worker/heartbeat", {}, ALL(403)),
    ("post", "/v1/worker/acquire", "/v1/worker/acquire", {}, ALL(403)),
    ("post", "/v1/worker/deregister", "/v1/worker/deregister", {}, ALL(403)),
    ("post", "/v1/worker/tasks/{task_id:int}/start", "/v1/worker/tasks/1/start", {}, ALL(403)),
    ("post", "/v1/worker/tasks/{task_id:int}/logs", "/v1/worker/tasks/1/logs", {}, ALL(403)),
    ("post", "/v1/worker/tasks/{task_id:int}/rendezvous", "/v1/worker/tasks/1/rendezvous", {}, ALL(403)),
    ("post", "/v1/worker/tasks/{task_id:int}/finish", "/v1/worker/tasks/1/finish", {}, ALL(403)),
    ("get", "/v1/jobs", "/v1/jobs?all=true", None, ALL(200)),
    ("post", "/v1/jobs", "/v1/jobs", {"command": ["true"], "project": "p1"}, codes(201, 201, 201, 403, 403)),
    ("get", "/v1/jobs/{job_id:int}", "/v1/jobs/{job}", None, SEE),
    ("get", "/v1/jobs/{job_id:int}/events", "/v1/jobs/{job}/events", None, SEE),
    ("get", "/v1/jobs/{job_id:int}/logs", "/v1/jobs/{job}/logs", None, READ),
    ("get", "/v1/jobs/{job_id:int}/outputs", "/v1/jobs/{job}/outputs", None, READ),
    ("get", "/v1/jobs/{job_id:int}/endpoints", "/v1/jobs/{job}/endpoints", None, READ),
    ("post", "/v1/jobs/{job_id:int}/cancel", "/v1/jobs/{job}/cancel", {}, READ),  # manage: as READ when private
    ("get", "/v1/workers", "/v1/workers", None, ALL(200)),
    ("post", "/v1/workers/{worker}/cordon", "/v1/workers/nope/cordon", {"reason": "r"}, ADMIN_ONLY(404)),
    ("post", "/v1/workers/{worker}/drain", "/v1/workers/nope/drain", {"reason": "r"}, ADMIN_ONLY(404)),
    ("post", "/v1/workers/{worker}/uncordon", "/v1/workers/nope/uncordon", {}, ADMIN_ONLY(404)),
    ("post", "/v1/workers/{worker}/gpus/{index:int}/reset", "/v1/workers/nope/gpus/0/reset", {}, ADMIN_ONLY(404)),
    ("get", "/v1/provisioners", "/v1/provisioners", None, ALL(200)),
    ("get", "/v1/usage", "/v1/usage", None, ALL(200)),   # each its own runs and its managed projects'
    ("get", "/v1/whoami", "/v1/whoami", None, ALL(200)),
    ("get", "/v1/users", "/v1/users", None, ADMIN_ONLY(200)),
    ("post", "/v1/users", "/v1/users", {"name": "nobody!"}, ADMIN_ONLY(400)),
    ("get", "/v1/users/{name}", "/v1/users/member", None, ADMIN_ONLY(200)),
    ("patch", "/v1/users/{name}", "/v1/users/member", {"max_running_jobs": 5}, ADMIN_ONLY(200)),
    ("delete", "/v1/users/{name}", "/v1/users/nosuch", None, ADMIN_ONLY(404)),
    ("get", "/v1/projects", "/v1/projects", None, ALL(200)),
    ("post", "/v1/projects", "/v1/projects", {"name": "bad name"}, ADMIN_ONLY(400)),
    ("get", "/v1/projects/{name}", "/v1/projects/p1", None, codes(200, 200, 200, 404, 404)),
    ("patch", "/v1/projects/{name}", "/v1/projects/p1", {"borrow": 0}, ADMIN_ONLY(200)),
    ("delete", "/v1/projects/{name}", "/v1/projects/nosuch", None, ADMIN_ONLY(404)),
    ("put", "/v1/projects/{name}/members/{user}", "/v1/projects/p1/members/owner", {"role": "member"},
     codes(200, 200, 403, 404, 404)),
    ("delete", "/v1/projects/{name}/members/{user}", "/v1/projects/p1/members/nosuch", None,
     codes(404, 404, 403, 404, 404)),
    ("post", "/v1/tokens", "/v1/tokens", {"name": "j"}, ADMIN_ONLY(201)),
    ("get", "/v1/tokens", "/v1/tokens", None, ALL(200)),
    ("post", "/v1/tokens/{jti}/revoke", "/v1/tokens/nope/revoke", {}, ALL(404)),
    ("get", "/v1/secrets", "/v1/secrets?project=p1", None, codes(200, 200, 200, 404, 404)),
    ("put", "/v1/secrets/{name}", "/v1/secrets/TOKEN?project=p1", {"value": "v"}, codes(200, 200, 403, 404, 404)),
    ("delete", "/v1/secrets/{name}", "/v1/secrets/NOSUCH?project=p1", None, codes(404, 404, 403, 404, 404)),
    ("put", "/v1/artifacts/{digest}", f"/v1/artifacts/{DIGEST}", b"teams", ALL(201)),
    ("get", "/v1/artifacts/{digest}", f"/v1/artifacts/{DIGEST}", None, ALL(200)),
    ("head", "/v1/artifacts/{digest}", f"/v1/artifacts/{DIGEST}", None, ALL(200)),
]


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    """A real server; projects p1 and p2; a user per role; a queued job of `owner` in p1."""
    plane = ControlPlaneProcess(tmp_path_factory.mktemp("teams")).start()
    try:
        admin = plane.client()
        admin.add_project("p1", gpus=4)
        admin.add_project("p2")
        tokens = {"admin": plane.client_token}
        for name, projects in (("owner", [("p1", "member")]), ("manager", [("p1", "manager")]),
                               ("member", [("p1", "member")]), ("other", [("p2", "member")]), ("none", [])):
            tokens[name] = admin.add_user(name, projects=projects)["token"]
        admin.remove_member("default", "none")  # `none` joined default: now in no project at all
        answer = plane.request("POST", "/v1/jobs", token=tokens["owner"],
                               json={"command": ["true"], "project": "p1", "env": {"SECRETISH": "x"}})
        assert answer.status_code == 201, answer.text
        yield plane, tokens, answer.json()["id"]
    finally:
        plane.close()


def test_matrix_covers_every_route():
    served = {(template, method) for template, cls, suffix in ROUTES for method in METHODS
              if hasattr(cls, f"on_{method}" + (f"_{suffix}" if suffix else ""))}
    listed = {(template, method) for method, template, *_ in MATRIX}
    assert served - listed == set(), "routes missing from the teams security matrix (and docs/security.md)"


@pytest.mark.parametrize("method, template, path, body, expected", MATRIX, ids=[f"{m} {t}" for m, t, *_ in MATRIX])
def test_route_by_role(team, method, template, path, body, expected):
    plane, tokens, job_id = team
    path = path.replace("{job}", str(job_id))
    for role in ROLES:  # access is decided before the job's state: cancel by one role changes no other answer
        kwargs = {"data": body} if isinstance(body, bytes) else {} if body is None else {"json": body}
        answer = plane.request(method.upper(), path, token=tokens[role], headers=PROTO, **kwargs)
        assert answer.status_code == expected[role], (role, method, path, answer.status_code, answer.text)
        if answer.status_code >= 400 and method != "head":
            error = answer.json()["error"]
            assert error["code"] and error["message"]


def test_member_sees_a_job_exists_but_not_its_env(team):
    plane, tokens, job_id = team
    seen = plane.request("GET", f"/v1/jobs/{job_id}", token=tokens["member"]).json()
    assert seen["owner"] == "owner" and seen["project"] == "p1" and seen["redacted"] is True
    assert "env" not in seen["spec"] and "command" not in seen["spec"]
    full = plane.request("GET", f"/v1/jobs/{job_id}", token=tokens["manager"]).json()
    assert full["spec"]["env"] == {"SECRETISH": "x"} and not full.get("redacted")


def test_outsider_gets_the_same_404_as_for_no_job(team):
    plane, tokens, job_id = team
    hidden = plane.request("GET", f"/v1/jobs/{job_id}", token=tokens["other"])
    missing = plane.request("GET", "/v1/jobs/999999", token=tokens["other"])
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json()["error"]["message"].replace(str(job_id), "N") == \
        missing.json()["error"]["message"].replace("999999", "N")
