"""Every list route pages (issue 22, item 3): `limit` and a cursor in, a bounded page and `next` out; bad
values are a 400; a page holds a few MB whatever its rows' size (docs/protocol.md, "Pages")."""
from __future__ import annotations

import hashlib
import re

import pytest

from apihelpers import bearer
from gpulayer.server.http import app as http_app
from gpulayer.server.http import paging
from gpulayer.server.scheduler import checkpoints, events
from gpulayer.server.store.queries import PAGE_BYTES, row

SEEDED = 5
SMALL = paging.Paging(2, 3)   # a route's page, shrunk so that a few rows fill several pages
LONG_TEXT = 60_000            # a log line near the 64 KiB a worker may send


def _run(api, client_h, wh, name: str) -> dict:
    """Submit a job named `name`; the worker takes and starts it: its assignment."""
    api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["x"], "name": name})
    task = api.simulate_post("/v1/worker/acquire", headers=wh, json={}).json["task"]
    assert api.simulate_post(f"/v1/worker/tasks/{task['task_id']}/start", headers=wh, json={}).status_code == 200
    return task


@pytest.fixture
def listed(api, deps, client_h, worker, clock):
    """SEEDED items (at least) in every list route: {route: (path, params, key of the list, key of an item)}."""
    _, wh = worker("w0")
    for n in range(1, SEEDED):
        worker(f"w{n}")
    for n in range(SEEDED):
        task = _run(api, client_h, wh, f"run{n}")   # a job, a usage row per job name, log lines of the last
        api.simulate_post(f"/v1/worker/tasks/{task['task_id']}/finish", headers=wh,
                          json={"exit_code": 0, "outcome": "succeeded"})
        assert api.simulate_post("/v1/tokens", headers=client_h, json={"name": f"t{n}"}).status_code == 201
        assert api.simulate_put(f"/v1/secrets/S{n}", headers=client_h, json={"value": "v"}).status_code == 200
        assert api.simulate_post("/v1/users", headers=client_h, json={"name": f"u{n}"}).status_code == 201
        assert api.simulate_post("/v1/projects", headers=client_h, json={"name": f"p{n}"}).status_code == 201
        hook = api.simulate_post("/v1/webhooks", headers=client_h, json={"url": f"https://93.184.215.14/h{n}",
                                                                         "events": ["job.failed"]})
        assert hook.status_code == 201, hook.text
        assert api.simulate_post("/v1/alerts", headers=client_h, json={
            "name": f"a{n}", "sql": "SELECT 1", "webhook": hook.json["id"]}).status_code == 201
    task = _run(api, client_h, wh, "talker")
    lines = [{"stream": "stdout", "text": f"line {n}", "at": 1.0} for n in range(SEEDED)]
    api.simulate_post(f"/v1/worker/tasks/{task['task_id']}/logs", headers=wh, json={"lines": lines})
    job_id = task["job_id"]

    def seed(conn, now):
        for n in range(SEEDED):
            events.record(conn, now, "task_cancelled", job_id=job_id, task_id=task["task_id"], n=n)
            row(conn, "insert_provision_request", provisioner="slurm", profile=f"p{n}", token_jti=None, now=now)
            checkpoints.record(conn, ckpt_worker, checkpointed["task_id"], None, steps[n], now, keep=SEEDED)

    ckpt_worker, ckpt_h = worker("w-checkpoints")
    checkpointed = _run(api, client_h, ckpt_h, "checkpointed")
    steps = []
    for n in range(SEEDED):
        data = f"step {n}".encode()
        steps.append([{"path": "step", "digest": "sha256:" + hashlib.sha256(data).hexdigest(), "size": len(data),
                       "mode": 0o644}])
        assert api.simulate_put(f"/v1/artifacts/{steps[-1][0]['digest']}", headers=ckpt_h, body=data).status_code == 201
    deps.store.write(seed, clock())
    return {"/v1/jobs": ("/v1/jobs", {}, "jobs", "id"),
            "/v1/jobs/{job_id}/events": (f"/v1/jobs/{job_id}/events", {}, "events", "seq"),
            "/v1/jobs/{job_id}/logs": (f"/v1/jobs/{job_id}/logs", {}, "lines", "seq"),
            "/v1/jobs/{job_id}/checkpoints": (f"/v1/jobs/{checkpointed['job_id']}/checkpoints", {}, "checkpoints",
                                              "id"),
            "/v1/workers": ("/v1/workers", {}, "workers", "id"),
            "/v1/provisioners": ("/v1/provisioners", {}, "requests", "id"),
            "/v1/tokens": ("/v1/tokens", {}, "tokens", "jti"),
            "/v1/secrets": ("/v1/secrets", {}, "secrets", "name"),
            "/v1/users": ("/v1/users", {}, "users", "name"),
            "/v1/projects": ("/v1/projects", {}, "projects", "name"),
            "/v1/usage": ("/v1/usage", {"by": "job-name"}, "rows", "key"),
            "/v1/webhooks": ("/v1/webhooks", {}, "webhooks", "id"),
            "/v1/alerts": ("/v1/alerts", {}, "alerts", "id")}


def _walk(api, headers, path, params, key, cursor, followed) -> list[dict]:
    found: list[dict] = []
    params = dict(params)
    while True:
        page = api.simulate_get(path, headers=headers, params=params)
        assert page.status_code == 200, page.text
        found += page.json[key]
        following = page.json["next"]
        if following is None or (followed and not page.json[key]):
            return found
        params[cursor] = following


def test_the_table_names_every_list_route_seeded_here(listed):
    assert set(listed) == set(paging.ROUTES)
    for found in paging.ROUTES.values():   # a bounded default and maximum everywhere
        assert 1 <= found.default <= found.maximum <= 10_000


@pytest.mark.parametrize("route", sorted(paging.ROUTES))
def test_each_list_route_answers_a_bounded_page_and_next_walks_every_item_once(api, client_h, listed, route,
                                                                              monkeypatch):
    path, params, key, ident = listed[route]
    real = paging.ROUTES[route]
    answer = api.simulate_get(path, headers=client_h, params=params)
    assert answer.status_code == 200, answer.text
    whole = answer.json
    assert len(whole[key]) >= SEEDED and whole["next"] is (whole[key][-1]["seq"] if real.followed else None)
    small = paging.Paging(SMALL.default, SMALL.maximum, real.cursor, real.text, real.followed)
    monkeypatch.setitem(paging.ROUTES, route, small)
    first = api.simulate_get(path, headers=client_h, params=params).json
    assert len(first[key]) == small.default and first["next"] is not None
    walked = _walk(api, client_h, path, params, key, real.cursor, real.followed)
    assert [item[ident] for item in walked] == [item[ident] for item in whole[key]]
    assert _walk(api, client_h, path, {**params, "limit": small.maximum}, key, real.cursor, real.followed) == walked


@pytest.mark.parametrize("route", sorted(paging.ROUTES))
def test_a_bad_limit_or_cursor_is_a_400_with_the_error_shape(api, client_h, listed, route):
    path, params, _, _ = listed[route]
    found = paging.ROUTES[route]
    bad = [{"limit": "0"}, {"limit": str(found.maximum + 1)}, {"limit": "ten"}, {"limit": "1.5"}]
    bad += ([{found.cursor: "\x01"}, {found.cursor: "n" * 300}] if found.text else
            [{found.cursor: "-1"}, {found.cursor: "x"}, {found.cursor: str(1 << 63)}])
    for values in bad:
        answer = api.simulate_get(path, headers=client_h, params={**params, **values})
        assert answer.status_code == 400, (values, answer.text)
        assert answer.json["error"]["code"] == "invalid_field" and answer.json["error"]["message"], answer.json
        assert next(iter(values)) in answer.json["error"]["message"]


# Lists inside answers that are not pages: each bounded by what makes it (route, key: why).
BOUNDED = {("/v1/jobs/{job_id}", "tasks"): "an array's: ARRAY_TASKS_SHOWN active and ended, ?index= one element's; "
                                           "else its width (1,024) by its attempts",
           ("/v1/jobs/{job_id}", "preemptions"): "the latest PREEMPTIONS_SHOWN",
           ("/v1/jobs/{job_id}", "after"): "at most 100 dependencies",
           ("/v1/jobs/{job_id}/endpoints", "endpoints"): "one per replica (1,024)",
           ("/v1/jobs/{job_id}/gpus", "tasks"): "its running tasks' GPUs: MAX_TASK_GPUS rows, `truncated` past it",
           ("/v1/jobs/{job_id}/service", "replicas"): "one per revision live in the current attempt (two while rolling)",
           ("/v1/jobs/{job_id}/service", "updates"): "the latest UPDATES_SHOWN (rollout.py)",
           ("/v1/provisioners", "provisioners"): "the configuration file's",
           ("/v1/whoami", "projects"): "the caller's memberships"}


def test_every_list_a_get_route_answers_is_a_page_or_bounded_by_what_makes_it(api, client_h, listed):
    job_id = re.search(r"/v1/jobs/(\d+)/", listed["/v1/jobs/{job_id}/events"][0]).group(1)
    seen = set()
    for template, cls, suffix in http_app.ROUTES:
        path = re.sub(r"\{(\w+)(?::\w+)?\}", lambda m: "{" + m.group(1) + "}", template)
        if not hasattr(cls, "on_get" + (f"_{suffix}" if suffix else "")) or set(re.findall(r"\{(\w+)", path)) - {
                "job_id"}:
            continue
        answer = api.simulate_get(path.replace("{job_id}", job_id), headers=client_h,
                                  params=listed.get(path, (None, {}))[1])
        assert answer.status_code < 500, (path, answer.text)   # (404: this plane has no CA file)
        media = answer.json if answer.headers.get("content-type", "").startswith("application/json") else {}
        for key, value in media.items() if isinstance(media, dict) else ():
            if isinstance(value, list):
                seen.add(path)
                assert path in paging.ROUTES or (path, key) in BOUNDED, f"{path} answers an unpaged list {key!r}"
    assert set(paging.ROUTES) <= seen | {"/v1/usage"}   # (usage answers `rows` under the same rule)


def test_a_page_is_cut_at_a_few_mb_whatever_its_limit_allows(api, client_h, worker):
    _, wh = worker()
    task = _run(api, client_h, wh, "loud")
    for batch in range(2):   # 120 lines of 60 KB: over 7 MB
        lines = [{"stream": "stdout", "text": f"{batch}-{n}:" + "x" * LONG_TEXT, "at": 1.0} for n in range(60)]
        assert api.simulate_post(f"/v1/worker/tasks/{task['task_id']}/logs", headers=wh,
                                 json={"lines": lines}).json["accepted"] == 60
    path = f"/v1/jobs/{task['job_id']}/logs"
    page = api.simulate_get(path, headers=client_h, params={"limit": 10_000})
    assert len(page.json["lines"]) < 120 and len(page.content) < PAGE_BYTES + 2 * LONG_TEXT
    walked = _walk(api, client_h, path, {"limit": 10_000}, "lines", "after", True)
    assert [line["text"].split(":")[0] for line in walked] == [f"{b}-{n}" for b in range(2) for n in range(60)]

    spec = {"command": ["x"], "env": {f"BIG{n}": "y" * 60_000 for n in range(15)}}  # near the 1 MiB body limit
    ids = [api.simulate_post("/v1/jobs", headers=client_h, json=spec).json["id"] for _ in range(6)]
    page = api.simulate_get("/v1/jobs", headers=client_h)
    assert len(page.json["jobs"]) < 6 and page.json["next"] == page.json["jobs"][-1]["id"]
    assert len(page.content) < PAGE_BYTES + 2_000_000
    walked = _walk(api, client_h, "/v1/jobs", {}, "jobs", "before", False)
    assert [j["id"] for j in walked][:6] == ids[::-1]


def test_a_member_pages_only_its_own_client_tokens(api, client_h):
    made = api.simulate_post("/v1/users", headers=client_h, json={"name": "mia"}).json
    for n in range(3):
        api.simulate_post("/v1/tokens", headers=bearer(made["token"]), json={"kind": "client", "name": f"m{n}"})
    page = api.simulate_get("/v1/tokens", headers=bearer(made["token"]), params={"limit": 2}).json
    assert [t["name"] for t in page["tokens"]] == ["mia", "m0"] and page["next"] is not None
    rest = api.simulate_get("/v1/tokens", headers=bearer(made["token"]), params={"after": page["next"]}).json
    assert [t["name"] for t in rest["tokens"]] == ["m1", "m2"] and rest["next"] is None
    assert all(t["user"] == "mia" and "n" not in t for t in page["tokens"] + rest["tokens"])
