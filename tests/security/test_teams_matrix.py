"""Teams: every route × every role, against a real server process (docs/security.md, "Teams").

Roles: `admin` (server init's token), `manager` and `member` of project p1, `other` (a member
of p2 only) and `none` (a user in no project). The job under test belongs to `owner`, a
member of p1. Each operation is written out with what each role gets; a test checks the
table covers every route the app serves, so a new route cannot skip the matrix.
"""
from __future__ import annotations

import hashlib
import sys

import pytest

from gpulayer.server.http.app import ROUTES
from gpulayer.server.http.openapi import METHODS
from gpulayer.testing import ControlPlaneProcess, wait_for

ROLES = ("admin", "manager", "member", "other", "none")
DIGEST = "sha256:" + hashlib.sha256(b"teams").hexdigest()
SOURCE, INPUT = b"secret source code", b"secret input data"   # the owner's job's code and data
ADMINS = b"uploaded by the admin alone"   # stored, named by no job: a digest is no read capability (issue 36)
ADMINS_DIGEST = "sha256:" + hashlib.sha256(ADMINS).hexdigest()
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
    ("get", "/v1/ssh-host-ca.pub", "/v1/ssh-host-ca.pub", None, ALL(200)),   # a public key, as ca.pem
    ("post", "/v1/workers/register", "/v1/workers/register", {"name": "x"}, ALL(403)),
    ("post", "/v1/worker/heartbeat", "/v1/worker/heartbeat", {}, ALL(403)),
    ("post", "/v1/worker/acquire", "/v1/worker/acquire", {}, ALL(403)),
    ("post", "/v1/worker/deregister", "/v1/worker/deregister", {}, ALL(403)),
    ("post", "/v1/worker/finish-many", "/v1/worker/finish-many", {}, ALL(403)),
    ("post", "/v1/worker/checkpoint", "/v1/worker/checkpoint", {}, ALL(403)),
    ("get", "/v1/worker/relay", "/v1/worker/relay", None, ALL(403)),
    # Without a WebSocket upgrade: the relay's policy is checked on the WebSocket (test_relay_exec.py)
    ("get", "/v1/jobs/{job_id:int}/relay", "/v1/jobs/{job}/relay", None, ALL(400)),
    ("post", "/v1/worker/tasks/{task_id:int}/start", "/v1/worker/tasks/1/start", {}, ALL(403)),
    ("post", "/v1/worker/tasks/{task_id:int}/logs", "/v1/worker/tasks/1/logs", {}, ALL(403)),
    ("post", "/v1/worker/tasks/{task_id:int}/rendezvous", "/v1/worker/tasks/1/rendezvous", {}, ALL(403)),
    ("post", "/v1/worker/tasks/{task_id:int}/finish", "/v1/worker/tasks/1/finish", {}, ALL(403)),
    ("get", "/v1/jobs", "/v1/jobs?all=true", None, ALL(200)),
    ("post", "/v1/jobs", "/v1/jobs", {"command": ["true"], "project": "p1"}, codes(201, 201, 201, 403, 403)),
    # what-if: the submit's checks as the caller (the project's members may ask), and nothing is made
    ("post", "/v1/jobs/estimate", "/v1/jobs/estimate", {"command": ["true"], "project": "p1"},
     codes(200, 200, 200, 403, 403)),
    ("get", "/v1/jobs/{job_id:int}", "/v1/jobs/{job}", None, SEE),
    ("get", "/v1/jobs/{job_id:int}/events", "/v1/jobs/{job}/events", None, SEE),
    ("get", "/v1/jobs/{job_id:int}/logs", "/v1/jobs/{job}/logs", None, READ),
    ("get", "/v1/jobs/{job_id:int}/outputs", "/v1/jobs/{job}/outputs", None, READ),
    ("get", "/v1/jobs/{job_id:int}/checkpoints", "/v1/jobs/{job}/checkpoints", None, READ),
    ("get", "/v1/jobs/{job_id:int}/checkpoints/{checkpoint_id:int}", "/v1/jobs/{job}/checkpoints/1", None,
     codes(404, 404, 403, 404, 404)),   # the job has none: readers learn that, members may not read
    ("get", "/v1/jobs/{job_id:int}/endpoints", "/v1/jobs/{job}/endpoints", None, READ),
    ("get", "/v1/jobs/{job_id:int}/gpus", "/v1/jobs/{job}/gpus", None, READ),   # GPU use (sstat): as logs
    ("post", "/v1/jobs/{job_id:int}/cancel", "/v1/jobs/{job}/cancel", {}, READ),  # manage: as READ when private
    # job control (docs/training.md): manage, as cancel; a body each refuses (400) keeps the job as it is
    ("patch", "/v1/jobs/{job_id:int}", "/v1/jobs/{job}", {"bogus": 1}, codes(400, 400, 403, 404, 404)),
    ("post", "/v1/jobs/{job_id:int}/hold", "/v1/jobs/{job}/hold", {"bogus": 1}, codes(400, 400, 403, 404, 404)),
    ("post", "/v1/jobs/{job_id:int}/release", "/v1/jobs/{job}/release", {"bogus": 1}, codes(400, 400, 403, 404, 404)),
    ("post", "/v1/jobs/{job_id:int}/requeue", "/v1/jobs/{job}/requeue", {"index": -1}, codes(400, 400, 403, 404, 404)),
    # a service's revisions and rolling updates (docs/services.md): see to read, manage to change; the job
    # under test is a batch job, so who may manage it is told so (409 not_a_service) or its body is refused
    ("get", "/v1/jobs/{job_id:int}/service", "/v1/jobs/{job}/service", None, SEE),
    ("patch", "/v1/jobs/{job_id:int}/service", "/v1/jobs/{job}/service", {"bogus": 1},
     codes(400, 400, 403, 404, 404)),
    ("post", "/v1/jobs/{job_id:int}/service/promote", "/v1/jobs/{job}/service/promote", {},
     codes(409, 409, 403, 404, 404)),
    ("post", "/v1/jobs/{job_id:int}/service/rollback", "/v1/jobs/{job}/service/rollback", {},
     codes(409, 409, 403, 404, 404)),
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
    # its priority ceiling: its managers too (their lever on what members may ask for); outsiders: no project
    ("patch", "/v1/projects/{name}", "/v1/projects/p1", {"max_priority": 0}, codes(200, 200, 403, 404, 404)),
    ("delete", "/v1/projects/{name}", "/v1/projects/nosuch", None, ADMIN_ONLY(404)),
    ("put", "/v1/projects/{name}/members/{user}", "/v1/projects/p1/members/owner", {"role": "member"},
     codes(200, 200, 403, 404, 404)),
    ("delete", "/v1/projects/{name}/members/{user}", "/v1/projects/p1/members/nosuch", None,
     codes(404, 404, 403, 404, 404)),
    ("post", "/v1/tokens", "/v1/tokens", {"name": "j"}, ADMIN_ONLY(201)),
    ("get", "/v1/tokens", "/v1/tokens", None, ALL(200)),
    ("post", "/v1/tokens/{jti}/revoke", "/v1/tokens/nope/revoke", {}, ALL(404)),
    # notifications: a webhook for the owner's job (who may read it); none of that id; alerts are admins'
    ("post", "/v1/webhooks", "/v1/webhooks", {"url": "http://93.184.215.14/x", "events": ["job.failed"], "job": "{job}"},
     codes(201, 201, 403, 404, 404)),
    ("get", "/v1/webhooks", "/v1/webhooks", None, ALL(200)),
    ("get", "/v1/webhooks/{webhook_id:int}", "/v1/webhooks/999999", None, ALL(404)),
    ("delete", "/v1/webhooks/{webhook_id:int}", "/v1/webhooks/999999", None, ALL(404)),
    ("post", "/v1/webhooks/{webhook_id:int}/test", "/v1/webhooks/999999/test", {}, ALL(404)),
    ("post", "/v1/alerts", "/v1/alerts", {"name": "a", "sql": "SELECT 1", "every_s": 60, "webhook": 999999},
     ADMIN_ONLY(400)),
    ("get", "/v1/alerts", "/v1/alerts", None, ADMIN_ONLY(200)),
    ("delete", "/v1/alerts/{name}", "/v1/alerts/nosuch", None, ADMIN_ONLY(404)),
    ("get", "/v1/secrets", "/v1/secrets?project=p1", None, codes(200, 200, 200, 404, 404)),
    ("put", "/v1/secrets/{name}", "/v1/secrets/TOKEN?project=p1", {"value": "v"}, codes(200, 200, 403, 404, 404)),
    ("delete", "/v1/secrets/{name}", "/v1/secrets/NOSUCH?project=p1", None, codes(404, 404, 403, 404, 404)),
    ("put", "/v1/artifacts/{digest}", f"/v1/artifacts/{DIGEST}", b"teams", ALL(201)),
    # downloads: admins any artifact, others their own uploads and what a job they may read names (only the
    # admin uploaded this one, no job names it); a probe answers 404 to who may not read it (issue 36)
    ("get", "/v1/artifacts/{digest}", f"/v1/artifacts/{ADMINS_DIGEST}", None, ADMIN_ONLY(200)),
    ("head", "/v1/artifacts/{digest}", f"/v1/artifacts/{ADMINS_DIGEST}", None, codes(200, 404, 404, 404, 404)),
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
        for data in (SOURCE, INPUT):
            put = plane.request("PUT", f"/v1/artifacts/{digest(data)}", token=tokens["owner"], data=data)
            assert put.status_code == 201, put.text
        assert plane.request("PUT", f"/v1/artifacts/{ADMINS_DIGEST}", data=ADMINS).status_code == 201
        answer = plane.request("POST", "/v1/jobs", token=tokens["owner"],
                               json={"command": ["true"], "project": "p1", "env": {"SECRETISH": "x"},
                                     "source": digest(SOURCE), "inputs": {"data/in.bin": digest(INPUT)}})
        assert answer.status_code == 201, answer.text
        yield plane, tokens, answer.json()["id"]
    finally:
        plane.close()


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_matrix_covers_every_route():
    served = {(template, method) for template, cls, suffix in ROUTES for method in METHODS
              if hasattr(cls, f"on_{method}" + (f"_{suffix}" if suffix else ""))}
    listed = {(template, method) for method, template, *_ in MATRIX}
    assert served - listed == set(), "routes missing from the teams security matrix (and docs/security.md)"


@pytest.mark.parametrize("method, template, path, body, expected", MATRIX, ids=[f"{m} {t}" for m, t, *_ in MATRIX])
def test_route_by_role(team, method, template, path, body, expected):
    plane, tokens, job_id = team
    path = path.replace("{job}", str(job_id))
    if isinstance(body, dict):
        body = {k: job_id if v == "{job}" else v for k, v in body.items()}
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
    assert not {"env", "command", "source", "inputs", "outputs"} & set(seen["spec"])
    assert all(t["endpoint"] is None and t["address"] is None and t["restart_message"] is None and not t["outputs"]
               for t in seen["tasks"])
    listed = plane.request("GET", "/v1/jobs?all=true", token=tokens["member"]).json()["jobs"]
    assert next(j for j in listed if j["id"] == job_id)["spec"] == seen["spec"]
    full = plane.request("GET", f"/v1/jobs/{job_id}", token=tokens["manager"]).json()
    assert full["spec"]["env"] == {"SECRETISH": "x"} and not full.get("redacted")
    assert full["spec"]["source"] == digest(SOURCE) and full["spec"]["inputs"] == {"data/in.bin": digest(INPUT)}


def test_outsider_gets_the_same_404_as_for_no_job(team):
    plane, tokens, job_id = team
    hidden = plane.request("GET", f"/v1/jobs/{job_id}", token=tokens["other"])
    missing = plane.request("GET", "/v1/jobs/999999", token=tokens["other"])
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json()["error"]["message"].replace(str(job_id), "N") == \
        missing.json()["error"]["message"].replace("999999", "N")


def test_only_who_may_read_a_job_downloads_its_code_and_data(team):
    """The artifacts a job names are downloaded by who may read the job; a member who only sees it, and
    outsiders, get 403 even with the digest; a digest nobody stored stays 404."""
    plane, tokens, _ = team
    expected = {"admin": 200, "owner": 200, "manager": 200, "member": 403, "other": 403, "none": 403}
    for data in (SOURCE, INPUT):
        got = {role: plane.request("GET", f"/v1/artifacts/{digest(data)}", token=tokens[role]) for role in expected}
        assert {role: r.status_code for role, r in got.items()} == expected
        assert got["owner"].content == data and got["member"].json()["error"]["code"] == "forbidden"
    nowhere = plane.request("GET", f"/v1/artifacts/{digest(b'never stored')}", token=tokens["member"])
    assert nowhere.status_code == 404


def test_project_visibility_lets_members_download(team):
    plane, tokens, _ = team
    admin = plane.client()
    admin.add_project("open", visibility="project")
    writer = admin.add_user("writer", projects=[("open", "member")])["token"]
    reader = admin.add_user("reader", projects=[("open", "member")])["token"]
    data = b"shared in an open project"
    assert plane.request("PUT", f"/v1/artifacts/{digest(data)}", token=writer, data=data).status_code == 201
    assert plane.request("POST", "/v1/jobs", token=writer,
                         json={"command": ["true"], "project": "open", "source": digest(data)}).status_code == 201
    assert plane.request("GET", f"/v1/artifacts/{digest(data)}", token=reader).content == data
    assert plane.request("GET", f"/v1/artifacts/{digest(data)}", token=tokens["member"]).status_code == 403


def test_member_does_not_see_service_weights_or_endpoints(team, tmp_path):
    """A running service of the owner: its weights digest, endpoints and addresses are for who may read it."""
    plane, tokens, _ = team
    weights = b"secret weights"
    assert plane.request("PUT", f"/v1/artifacts/{digest(weights)}", token=tokens["owner"],
                         data=weights).status_code == 201
    plane.start_worker("w-matrix")
    serve = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1"]
    answer = plane.request("POST", "/v1/jobs", token=tokens["owner"], json={
        "command": ["sh", "-c", " ".join(serve) + ' "$PORT"'], "project": "p1",
        "service": {"weights": digest(weights)}})
    assert answer.status_code == 201, answer.text
    job = answer.json()["id"]
    try:
        def endpoint():
            tasks = plane.request("GET", f"/v1/jobs/{job}", token=tokens["manager"]).json()["tasks"]
            return next((t["endpoint"] for t in tasks if t["endpoint"]), None)
        wait_for(endpoint, 60, "the service's endpoint", details=plane.logs)
        seen = plane.request("GET", f"/v1/jobs/{job}", token=tokens["member"]).json()
        assert seen["redacted"] and "weights" not in seen["spec"]["service"] and seen["spec"]["service"]["replicas"] == 1
        assert seen["tasks"] and all(t["endpoint"] is None and t["address"] is None for t in seen["tasks"])
        listed = plane.request("GET", "/v1/jobs?all=true", token=tokens["member"]).json()["jobs"]
        assert all(t["endpoint"] is None for t in next(j for j in listed if j["id"] == job)["tasks"])
        events = plane.request("GET", f"/v1/jobs/{job}/events", token=tokens["member"]).json()["events"]
        reported = [e for e in events if e["kind"] == "task_reported"]
        assert reported and not any("endpoint" in e["data"] for e in reported)
        full = plane.request("GET", f"/v1/jobs/{job}/events", token=tokens["manager"]).json()["events"]
        assert any((e["data"].get("endpoint") or "").startswith("127.0.0.1:") for e in full)
        assert plane.request("GET", f"/v1/artifacts/{digest(weights)}", token=tokens["member"]).status_code == 403
        assert plane.request("GET", f"/v1/artifacts/{digest(weights)}", token=tokens["manager"]).content == weights
    finally:
        plane.request("POST", f"/v1/jobs/{job}/cancel", token=tokens["owner"], json={})


def test_a_dependency_on_a_hidden_job_is_answered_as_on_no_job(team):
    """`after` names only jobs the submitter may see: a hidden one is "no job", word for word."""
    plane, tokens, job_id = team
    hidden = plane.request("POST", "/v1/jobs", token=tokens["other"], json={"command": ["true"], "after": [job_id]})
    missing = plane.request("POST", "/v1/jobs", token=tokens["other"], json={"command": ["true"], "after": [999999]})
    assert hidden.status_code == missing.status_code == 400
    assert hidden.json()["error"]["code"] == missing.json()["error"]["code"] == "unknown_job"
    assert hidden.json()["error"]["message"].replace(str(job_id), "N") == \
        missing.json()["error"]["message"].replace("999999", "N")
    for condition in ("ok", "notok", "any"):   # nor does a condition tell how it ended
        answer = plane.request("POST", "/v1/jobs", token=tokens["other"],
                               json={"command": ["true"], "after": [f"{job_id}:{condition}"]})
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "unknown_job"
    seen = plane.request("POST", "/v1/jobs", token=tokens["member"],   # a job it sees: fine
                         json={"command": ["true"], "project": "p1", "after": [f"{job_id}:any"]})
    assert seen.status_code == 201, seen.text
    assert seen.json()["after"][0]["job"] == job_id and seen.json()["after"][0]["state"] is not None


def test_a_dependency_shows_its_name_and_state_only_to_who_may_see_it(team):
    """A user of p1 and p2 chains a p1 job after a private p2 job: p1's manager and members see the chain's
    ids, not the p2 job's name or state."""
    plane, tokens, _ = team
    both = plane.client().add_user("both", projects=[("p1", "member"), ("p2", "member")])["token"]
    first = plane.request("POST", "/v1/jobs", token=both,
                          json={"command": ["true"], "project": "p2", "name": "p2-private-name"}).json()["id"]
    second = plane.request("POST", "/v1/jobs", token=both,
                           json={"command": ["true"], "project": "p1", "after": [f"{first}:any"]}).json()["id"]
    for role in ("manager", "member"):
        view = plane.request("GET", f"/v1/jobs/{second}", token=tokens[role]).json()
        assert view["after"] == [{"job": first, "condition": "any", "name": None, "state": None}], role
        listed = plane.request("GET", "/v1/jobs?project=p1", token=tokens[role]).json()["jobs"]
        assert next(j for j in listed if j["id"] == second)["after"][0]["name"] is None
    for token in (both, tokens["admin"]):
        assert plane.request("GET", f"/v1/jobs/{second}", token=token).json()["after"][0]["name"] == "p2-private-name"


def test_client_token_is_named_after_its_user_by_default(team):
    plane, tokens, _ = team
    mine = plane.request("POST", "/v1/tokens", token=tokens["member"], json={"kind": "client"})
    assert mine.status_code == 201 and mine.json()["name"] == "member" and mine.json()["user"] == "member"
    theirs = plane.request("POST", "/v1/tokens", json={"kind": "client", "user": "other"})
    assert theirs.status_code == 201 and theirs.json()["name"] == "other"
    unnamed = plane.request("POST", "/v1/tokens", json={"kind": "join"})
    assert unnamed.status_code == 400 and "name" in unnamed.json()["error"]["message"]
    rc, out, err = plane.cli("token", "create", "--kind", "client", "--user", "other")
    assert rc == 0 and out.strip().startswith("glc_") and "name=other" in err, err
    rc, _, err = plane.cli("token", "create")
    assert rc == 2 and "--name" in err and "Traceback" not in err


def test_a_removed_users_name_comes_back_only_when_reclaimed(team):
    """Re-adding a removed user's name would hand its jobs to whoever gets the name: 409 unless reclaim."""
    plane, _, _ = team
    admin = plane.client()
    token = admin.add_user("leaver")["token"]
    job = plane.request("POST", "/v1/jobs", token=token, json={"command": ["true"]}).json()["id"]
    admin.remove_user("leaver")
    again = plane.request("POST", "/v1/users", json={"name": "leaver"})
    assert again.status_code == 409 and again.json()["error"]["code"] == "user_removed"
    assert "reclaim" in again.json()["error"]["message"]
    rc, _, err = plane.cli("user", "add", "leaver")
    assert rc != 0 and "--reclaim" in err and "Traceback" not in err
    bad = plane.request("POST", "/v1/users", json={"name": "leaver", "reclaim": "yes"})
    assert bad.status_code == 400 and "reclaim" in bad.json()["error"]["message"]
    rc, out, err = plane.cli("user", "add", "leaver", "--reclaim")
    assert rc == 0, err
    back = plane.request("GET", f"/v1/jobs/{job}", token=out.strip())
    assert back.status_code == 200 and back.json()["owner"] == "leaver"
    fresh = plane.request("POST", "/v1/users", json={"name": "newcomer", "reclaim": True})   # nothing to reclaim
    assert fresh.status_code == 201
