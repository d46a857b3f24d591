"""Teams end to end: the CLI and the Python client against a real server and a real worker (docs/teams.md)."""
from __future__ import annotations

import json

import pytest

from gpulayer.client.api import connect
from gpulayer.client.errors import ApiError
from gpulayer.testing import ControlPlaneProcess


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    with ControlPlaneProcess(tmp_path_factory.mktemp("teams"), heartbeat_interval=0.5, lease_ttl=3) as plane:
        plane.start_worker("w1")
        yield plane


def _as(plane, token):
    return connect(url=plane.url, token=token)


def test_cli_adds_users_and_projects_and_each_owns_its_jobs(plane):
    assert plane.cli("project", "add", "ml", "--gpus", "4", "--borrow", "2").returncode == 0
    rc, out, err = plane.cli("user", "add", "alice", "--project", "ml:manager")
    assert rc == 0, err
    alice = out.strip()
    assert alice.startswith("glc_") and "not shown again" in err
    rc, out, err = plane.cli("user", "add", "bob", "--project", "ml", "--max-running-jobs", "3", "--json")
    assert rc == 0, err
    bob = json.loads(out)["token"]

    rc, out, err = plane.cli("whoami", GPULAYER_TOKEN=bob)
    assert rc == 0 and out.splitlines() == ["bob", "projects: ml"], (out, err)
    rc, out, _ = plane.cli("whoami", "--json")
    assert json.loads(out)["user"] == "admin" and json.loads(out)["admin"] is True

    rc, out, err = plane.cli("submit", "--project", "ml", "--wait", "--", "echo", "from-bob", GPULAYER_TOKEN=bob)
    assert rc == 0, err
    job_id = int(out.splitlines()[0])
    job = _as(plane, bob).get_job(job_id).data
    assert (job["owner"], job["project"], job["state"]) == ("bob", "ml", "succeeded")

    # the owner's own list holds it; the admin's own list does not, its --all does
    rc, out, _ = plane.cli("job", "list", "--json", GPULAYER_TOKEN=bob)
    assert [j["id"] for j in json.loads(out)] == [job_id]
    rc, out, _ = plane.cli("job", "list", "--json")
    assert job_id not in [j["id"] for j in json.loads(out)]
    rc, out, _ = plane.cli("job", "list", "--all", "--json")
    assert job_id in [j["id"] for j in json.loads(out)]
    rc, out, _ = plane.cli("job", "list", "--user", "bob", "--json", GPULAYER_TOKEN=alice)
    assert [j["id"] for j in json.loads(out)] == [job_id]
    rc, out, _ = plane.cli("job", "list", "--project", "ml", GPULAYER_TOKEN=alice)
    header, row = out.splitlines()[0].split(), out.splitlines()[1].split()
    assert header[:6] == ["ID", "STATE", "EXIT", "NAME", "USER", "PROJECT"] and row[0] == str(job_id)
    assert "bob" in row and "ml" in row
    rc, out, _ = plane.cli("job", "status", str(job_id), GPULAYER_TOKEN=alice)
    assert "owner=bob project=ml" in out

    # the manager reads the member's logs; every event names who caused it
    rc, out, _ = plane.cli("job", "logs", str(job_id), GPULAYER_TOKEN=alice)
    assert "from-bob" in out
    actors = {e["kind"]: e["actor"] for e in _as(plane, alice).get_job(job_id).events()}
    assert actors["job_submitted"] == "user:bob"
    assert actors["task_started"].startswith("worker:") and actors["task_finished"].startswith("worker:")


def test_outsiders_see_nothing_and_members_see_only_existence(plane):
    admin = plane.client()
    admin.add_project("vision")
    carol = admin.add_user("carol", projects=[("vision", "member")])["token"]
    dave = admin.add_user("dave", projects=[("vision", "member")])["token"]
    job = _as(plane, carol).submit({"command": ["sh", "-c", "echo private-bits"], "env": {"KEY": "v"}})
    job.wait(timeout=30)

    outsider = _as(plane, plane.client().add_user("erin")["token"])   # a member of default only
    for call in (lambda: outsider.get_job(job.id), lambda: outsider.get_job(job.id).logs(),
                 lambda: outsider.call("POST", f"/jobs/{job.id}/cancel", json={})):
        with pytest.raises(ApiError) as caught:
            call()
        assert caught.value.status == 404

    seen = _as(plane, dave).get_job(job.id).data
    assert seen["redacted"] and "env" not in seen["spec"] and seen["state"] == "succeeded"
    with pytest.raises(ApiError) as caught:
        _as(plane, dave).call("GET", f"/jobs/{job.id}/logs")
    assert caught.value.status == 403
    parked = _as(plane, carol).submit({"command": ["true"], "labels": {"pool": "nowhere"}})   # stays queued
    rc, _, err = plane.cli("job", "cancel", str(parked.id), GPULAYER_TOKEN=dave)
    assert rc != 0 and "not yours" in err and "Traceback" not in err
    rc, _, err = plane.cli("job", "cancel", str(parked.id), GPULAYER_TOKEN=carol)
    assert rc == 0, err

    rc, _, err = plane.cli("project", "set", "vision", "--visibility", "project")
    assert rc == 0, err
    lines = _as(plane, dave).call("GET", f"/jobs/{job.id}/logs")["lines"]
    assert any("private-bits" in line["text"] for line in lines)

    rc, _, err = plane.cli("submit", "--project", "ml", "--", "true", GPULAYER_TOKEN=carol)
    assert rc != 0 and "not a member of project" in err


def test_project_secrets_reach_only_that_projects_jobs(plane):
    admin = plane.client()
    admin.add_project("nlp")
    frank = admin.add_user("frank", projects=[("nlp", "manager")])["token"]
    grace = admin.add_user("grace", projects=[("nlp", "member")])["token"]
    rc, _, err = plane.cli("secret", "set", "HF", "--project", "nlp", input="nlp-value\n", GPULAYER_TOKEN=frank)
    assert rc == 0, err
    rc, _, err = plane.cli("secret", "set", "HF", input="default-value\n")    # the admin's: project default
    assert rc == 0, err
    rc, _, err = plane.cli("secret", "set", "HF", input="x\n", GPULAYER_TOKEN=grace)
    assert rc != 0 and "managers" in err

    job = _as(plane, grace).submit({"command": ["sh", "-c", "echo got-$HF"], "secrets": ["HF"]})
    job.wait(timeout=30)
    assert any("got-nlp-value" in line["text"] for line in job.logs())
    assert [s["name"] for s in _as(plane, grace).secrets()] == ["HF"]


def test_removed_user_is_cut_off_and_tokens_belong_to_users(plane):
    admin = plane.client()
    heidi = admin.add_user("heidi")["token"]
    rc, out, err = plane.cli("token", "create", "--kind", "client", "--name", "laptop", GPULAYER_TOKEN=heidi)
    assert rc == 0, err
    second = out.strip()
    assert _as(plane, second).whoami()["user"] == "heidi"
    rc, _, err = plane.cli("token", "create", "--name", "join-me", GPULAYER_TOKEN=heidi)
    assert rc != 0 and "only an admin" in err
    rc, _, err = plane.cli("user", "remove", "heidi")
    assert rc == 0 and "2 tokens revoked" in err, err
    for token in (heidi, second):
        rc, _, err = plane.cli("whoami", GPULAYER_TOKEN=token)
        assert rc != 0 and "Traceback" not in err
    rc, _, err = plane.cli("user", "remove", "admin")
    assert rc != 0 and "first admin" in err


def test_explorer_is_for_admins_only(plane):
    member = plane.client().add_user("ivan")["token"]
    assert plane.request("GET", "/explorer/jobs.json").status_code == 200                # the admin's token
    refused = plane.request("GET", "/explorer/jobs.json", token=member)
    assert refused.status_code == 401 and refused.json()["ok"] is False
