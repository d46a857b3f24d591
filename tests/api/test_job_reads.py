"""Job reads (scheduler/views.py): one read transaction for `GET /v1/jobs/{id}`, `ended` on log pages,
the list's `name` and `since` filters, and logs and outputs answered without rendering the job.

The real app over a real state file; transactions are counted with apsw's exec tracer on the
store's own connections (every `BEGIN` the request ran).
"""
from __future__ import annotations

import pytest

from apihelpers import bearer
from gpulayer.server.store.queries import QUERIES

RENDER_ONLY = {QUERIES["job_preemptions"], QUERIES["job_dependencies_of"], QUERIES["job_waiting_fit"]}


@pytest.fixture
def traced(deps):
    """The SQL every connection of the store runs, as (connection kind, statement), from now on."""
    seen: list[tuple[str, str]] = []

    def tracer(kind):
        def trace(cursor, sql, bindings):
            seen.append((kind, sql.strip()))
            return True
        return trace
    # The store's own connections: the reader pool and the one writer (db.Store).
    for conn in deps.store._readers:
        conn.exec_trace = tracer("reader")
    deps.store._writer.exec_trace = tracer("writer")
    deps.auth.ticks = lambda: 0.0   # cached principals never age: a request reads no token once warm
    return seen


def begins(seen: list[tuple[str, str]], kind: str = "reader") -> int:
    return sum(1 for k, sql in seen if k == kind and sql.upper().startswith("BEGIN"))


def _add_user(api, client_h, name: str, projects: list[str]) -> dict:
    made = api.simulate_post("/v1/users", headers=client_h, json={
        "name": name, "projects": [{"project": p, "role": "member"} for p in projects]})
    assert made.status_code == 201, made.text
    return bearer(made.json["token"])


@pytest.fixture
def teams_jobs(api, client_h):
    """owner (in p1 and p2) has job `before` in p2 and job `job` in p1 after it; peer is in p1 only, so it
    may only see `job` (private project: redacted) and not `before` at all."""
    for name in ("p1", "p2"):
        assert api.simulate_post("/v1/projects", headers=client_h, json={"name": name}).status_code == 201
    owner = _add_user(api, client_h, "owner", ["p1", "p2"])
    peer = _add_user(api, client_h, "peer", ["p1"])
    spec = {"command": ["echo", "secret"], "env": {"KEY": "v"}, "labels": {"pool": "nowhere"}}
    before = api.simulate_post("/v1/jobs", headers=owner, json={**spec, "name": "first", "project": "p2"}).json["id"]
    job = api.simulate_post("/v1/jobs", headers=owner, json={**spec, "name": "second", "project": "p1",
                                                              "after": [{"job": before}]}).json["id"]
    return {"owner": owner, "peer": peer, "admin": client_h, "before": before, "job": job}


@pytest.mark.parametrize("caller", ["admin", "owner", "peer"])
def test_a_job_is_read_in_one_transaction(api, teams_jobs, traced, caller):
    headers, job_id = teams_jobs[caller], teams_jobs["job"]
    assert api.simulate_get(f"/v1/jobs/{job_id}", headers=headers).status_code == 200  # the principal cached
    traced.clear()
    answer = api.simulate_get(f"/v1/jobs/{job_id}", headers=headers)
    assert answer.status_code == 200, answer.text
    assert begins(traced) == 1 and begins(traced, "writer") == 0, traced
    job = answer.json
    assert job["owner"] == "owner" and job["project"] == "p1" and job["after"][0]["job"] == teams_jobs["before"]
    if caller == "peer":   # it may only see the job, and not the job it waits for (docs/security.md)
        assert job["redacted"] and "env" not in job["spec"] and "command" not in job["spec"]
        assert job["after"][0]["name"] is None and job["after"][0]["state"] is None
        assert job["waiting_reason"] == f"for job {teams_jobs['before']} to succeed"
    else:
        assert "redacted" not in job and job["spec"]["env"] == {"KEY": "v"}
        assert job["after"][0]["name"] == "first" and job["after"][0]["state"] == "queued"
    traced.clear()
    element = api.simulate_get(f"/v1/jobs/{job_id}", headers=headers, params={"index": 0})
    assert element.status_code == 200 and [t["index"] for t in element.json["tasks"]] == [0]
    assert begins(traced) == 1, traced


def test_refusals_of_a_job_read_are_one_transaction_too(api, teams_jobs, traced):
    peer, before = teams_jobs["peer"], teams_jobs["before"]
    api.simulate_get(f"/v1/jobs/{teams_jobs['job']}", headers=peer)
    traced.clear()
    hidden = api.simulate_get(f"/v1/jobs/{before}", headers=peer)
    assert hidden.status_code == 404 and hidden.json["error"]["code"] == "not_found" and begins(traced) == 1
    # A bad query for a job the caller may not see is still 404: ids do not leak through a 400.
    assert api.simulate_get(f"/v1/jobs/{before}", headers=peer, params={"index": "x"}).status_code == 404
    bad = api.simulate_get(f"/v1/jobs/{teams_jobs['job']}", headers=peer, params={"index": "x"})
    assert bad.status_code == 400 and "index" in bad.json["error"]["message"]
    missing = api.simulate_get(f"/v1/jobs/{teams_jobs['job']}", headers=peer, params={"index": 3})
    assert missing.status_code == 404 and missing.json["error"]["message"] == f"job {teams_jobs['job']} has no task with index 3"


def test_a_page_of_jobs_is_one_transaction(api, teams_jobs, traced):
    for caller in ("admin", "owner", "peer"):
        api.simulate_get("/v1/jobs", headers=teams_jobs[caller], params={"all": "true"})
        traced.clear()
        page = api.simulate_get("/v1/jobs", headers=teams_jobs[caller], params={"all": "true"}).json["jobs"]
        assert begins(traced) == 1, (caller, traced)
        assert [j["id"] for j in page] == ([teams_jobs["job"]] if caller == "peer" else
                                           [teams_jobs["job"], teams_jobs["before"]])


def _array_with_element_one_ended(api, client_h, worker) -> tuple[int, dict]:
    """An array of two: element 1 ran (two lines) and ended, element 0 runs on."""
    _, wh = worker(slots=2)
    job_id = api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["echo"], "array": "0-1"}).json["id"]
    tasks = api.simulate_post("/v1/worker/acquire", headers=wh, json={"max_tasks": 2}).json
    by_index = {t["index"]: t for t in [tasks["task"], *tasks["more"]]}
    for task in by_index.values():
        api.simulate_post(f"/v1/worker/tasks/{task['task_id']}/start", headers=wh, json={"pid": 7})
    one = by_index[1]["task_id"]
    lines = [{"stream": "stdout", "text": f"line {n}", "at": 1.0} for n in range(2)]
    api.simulate_post(f"/v1/worker/tasks/{one}/logs", headers=wh, json={"lines": lines})
    api.simulate_post(f"/v1/worker/tasks/{one}/finish", headers=wh, json={"exit_code": 0, "outcome": "succeeded"})
    return job_id, by_index


def test_a_log_page_says_when_the_job_or_element_has_ended(api, client_h, worker):
    job_id, _ = _array_with_element_one_ended(api, client_h, worker)
    logs = f"/v1/jobs/{job_id}/logs"
    element = api.simulate_get(logs, headers=client_h, params={"index": 1}).json
    assert [line["text"] for line in element["lines"]] == ["line 0", "line 1"] and element["ended"] is True
    cut = api.simulate_get(logs, headers=client_h, params={"index": 1, "limit": 1}).json
    assert [line["text"] for line in cut["lines"]] == ["line 0"] and cut["ended"] is False  # a line follows
    assert api.simulate_get(logs, headers=client_h, params={"index": 0}).json == {"lines": [], "next": 0,
                                                                                 "ended": False}
    assert api.simulate_get(logs, headers=client_h).json["ended"] is False  # element 0 runs on
    missing = api.simulate_get(logs, headers=client_h, params={"index": 5})
    assert missing.status_code == 404 and missing.json["error"]["message"] == f"job {job_id} has no element 5"


def test_logs_and_outputs_do_not_render_the_job(api, client_h, worker, traced):
    job_id, _ = _array_with_element_one_ended(api, client_h, worker)
    for path, params in ((f"/v1/jobs/{job_id}/logs", {}), (f"/v1/jobs/{job_id}/logs", {"index": 1}),
                         (f"/v1/jobs/{job_id}/outputs", {}), (f"/v1/jobs/{job_id}/outputs", {"index": 1})):
        api.simulate_get(path, headers=client_h, params=params)
        traced.clear()
        answer = api.simulate_get(path, headers=client_h, params=params)
        assert answer.status_code == 200, answer.text
        assert not RENDER_ONLY & {sql for _, sql in traced}, (path, params)
        assert begins(traced) == 2, (path, traced)   # the caller's right to the job, then the answer
    outputs = api.simulate_get(f"/v1/jobs/{job_id}/outputs", headers=client_h).json
    assert outputs == {"outputs": {}, "elements": {}}
    missing = api.simulate_get(f"/v1/jobs/{job_id}/outputs", headers=client_h, params={"index": 9})
    assert missing.status_code == 404 and missing.json["error"]["message"] == f"job {job_id} has no element 9"


def test_the_list_filters_by_name_and_age(api, client_h, clock):
    made = {}
    for name in ("sweep-1", "sweep-2", "other", "sweep[x]"):
        made[name] = api.simulate_post("/v1/jobs", headers=client_h, json={
            "command": ["true"], "name": name, "labels": {"pool": "nowhere"}}).json["id"]
        clock.advance(10)
    unnamed = api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["true"]}).json["id"]

    def ids(**params):
        answer = api.simulate_get("/v1/jobs", headers=client_h, params=params)
        assert answer.status_code == 200, answer.text
        return [j["id"] for j in answer.json["jobs"]]
    assert ids(name="sweep-*") == [made["sweep-2"], made["sweep-1"]]
    assert ids(name="sweep-?", limit=1) == [made["sweep-2"]]
    assert ids(name="[!s]*") == [made["other"]]          # fnmatch's negation, as the CLI's --name
    assert ids(name="sweep[[]x]") == [made["sweep[x]"]]
    assert ids(name="*") == [unnamed, made["sweep[x]"], made["other"], made["sweep-2"], made["sweep-1"]]
    assert ids(name="?*") == ids(name="*")[1:]   # a job with no name is named "" (as the CLI matched it)
    created = api.simulate_get(f"/v1/jobs/{made['other']}", headers=client_h).json["created_at"]
    assert ids(since=created, name="*") == [unnamed, made["sweep[x]"], made["other"]]
    assert ids(since=created, state="queued", name="s*") == [made["sweep[x]"]]
    assert ids(since=created + 1000) == []


@pytest.mark.parametrize("params, field", [({"since": "yesterday"}, "since"), ({"since": "-1"}, "since"),
                                           ({"since": "nan"}, "since"), ({"name": "x" * 257}, "name"),
                                           ({"state": "sleeping"}, "state")])
def test_bad_list_filters_are_400_and_change_nothing(api, client_h, params, field):
    answer = api.simulate_get("/v1/jobs", headers=client_h, params=params)
    assert answer.status_code == 400 and answer.json["error"]["code"] == "invalid_field", answer.text
    assert answer.json["error"]["message"].startswith(f"{field}:")
