"""Pages of the list routes against a real server (issue 22, item 3): a 100,000-element array's events come a
bounded page at a time, with a cursor that walks each exactly once; the CLI and the Python client still list
everything."""
from __future__ import annotations

import json

import pytest

from gpulayer.server.config import ControlPlaneConfig
from gpulayer.server.http import paging
from gpulayer.server.http.app import new_deps
from gpulayer.server.scheduler import events, teams
from gpulayer.server.store.queries import rows
from gpulayer.testing import ControlPlaneProcess

ELEMENTS = 100_000
USERS = 1_100   # past the users route's default page (1,000)
EVENTS = paging.ROUTES["/v1/jobs/{job_id}/events"]


def _seed(home) -> int:
    """A 100,000-element array with one event per element (as a cascade that cancels each writes them), and
    more users than a page holds; written in-process on the state file before the server starts."""
    deps = new_deps(ControlPlaneConfig(home=home))
    try:
        job_id = deps.scheduler.submit({"command": ["true"], "array": f"0-{ELEMENTS - 1}", "name": "sweep"})

        def per_element(conn, now):
            for task in rows(conn, "job_tasks", job_id=job_id):
                events.record(conn, now, "task_cancelled", job_id=job_id, task_id=task["task_id"],
                              index=task["index"])
            for n in range(USERS):
                teams.add_user(conn, f"user{n:04d}", False, [], None, now)

        deps.store.write(per_element, deps.clock())
        return job_id
    finally:
        deps.store.close()


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    plane = ControlPlaneProcess(tmp_path_factory.mktemp("paging"))
    plane.init()
    plane.job_id = _seed(plane.home)
    with plane.start():
        yield plane


def test_a_big_arrays_events_come_a_bounded_page_at_a_time_and_the_cursor_walks_each_once(plane):
    total = plane.sql("SELECT count(*) FROM events WHERE job_id = ?", (plane.job_id,))[0][0]
    assert total > ELEMENTS
    first = plane.request("GET", f"/v1/jobs/{plane.job_id}/events")
    assert first.status_code == 200, first.text
    page = first.json()
    assert len(page["events"]) == EVENTS.default and page["next"] == page["events"][-1]["seq"]
    assert len(first.content) < 1 << 20   # 13.7 MB before pages
    seen = [e["seq"] for e in page["events"]]
    while page["next"] is not None:
        answer = plane.request("GET", f"/v1/jobs/{plane.job_id}/events",
                               params={"after": page["next"], "limit": EVENTS.maximum})
        assert answer.status_code == 200, answer.text
        page = answer.json()
        assert len(page["events"]) <= EVENTS.maximum and len(answer.content) < 8 << 20
        seen += [e["seq"] for e in page["events"]]
    assert len(seen) == total and seen == sorted(set(seen))


def test_the_job_of_a_big_array_lists_a_bounded_set_of_tasks_and_pages_them_by_index(plane):
    answer = plane.request("GET", f"/v1/jobs/{plane.job_id}")
    job = answer.json()
    assert job["array"]["size"] == ELEMENTS and len(job["tasks"]) <= 200 and len(answer.content) < 1 << 20
    element = plane.get_json(f"/v1/jobs/{plane.job_id}", params={"index": ELEMENTS - 1})
    assert [t["index"] for t in element["tasks"]] == [ELEMENTS - 1]


def test_the_python_client_and_the_cli_still_list_every_event_and_user(plane):
    total = plane.sql("SELECT count(*) FROM events WHERE job_id = ?", (plane.job_id,))[0][0]
    with plane.client() as client:
        found = client.get_job(plane.job_id).events()
        assert [e["seq"] for e in found] == sorted({e["seq"] for e in found}) and len(found) == total
        assert len(client.users()) == USERS + 1   # and the first admin
    rc, out, err = plane.cli("job", "events", str(plane.job_id), "--json", timeout=300)
    assert rc == 0, err
    assert len(json.loads(out)) == total
    rc, out, err = plane.cli("user", "list", "--json")
    assert rc == 0, err
    assert len(json.loads(out)) == USERS + 1
