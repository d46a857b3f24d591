"""Every page over falcon.testing: status, content, escaping, JSON and CSV shapes, paging."""
from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import falcon.testing
import pytest
from explorer_state import EVIL_NAME, NOW, SECRET_MARKERS, file_digest

from explorer import create_app
from explorer.queries import CANNED

TABLES = ["tokens", "workers", "jobs", "tasks", "events", "logs", "artifacts", "rendezvous", "secrets", "reservations",
          "provision_requests"]
VIEWS = ["endpoints", "job_summary", "worker_load", "job_runtime_model", "task_expected_end", "reservation_room"]
ESCAPED_NAME = "&lt;b&gt;&#34;x&#34;,y&lt;/b&gt;"


def page_urls() -> list[str]:
    urls = ["/", "/-/tables", "/-/query", "/-/query?sql=select+1", "/-/workers"]
    for name in TABLES + VIEWS:
        urls += [f"/{name}", f"/{name}.json", f"/{name}.csv"]
    for name in CANNED:
        urls += [f"/-/queries/{name}", f"/-/queries/{name}.json", f"/-/queries/{name}.csv"]
    urls += [f"/-/jobs/{job}" for job in range(1, 10)]
    return urls


@pytest.mark.parametrize("url", page_urls())
def test_every_page_answers_200_and_shows_no_secret(client: falcon.testing.TestClient, url: str) -> None:
    result = client.simulate_get(url)
    assert result.status_code == 200, result.text
    assert not any(marker in result.text for marker in SECRET_MARKERS)
    if url.endswith(".json"):
        assert result.json["ok"] is True
    elif url.endswith(".csv"):
        assert result.headers["content-type"].startswith("text/csv")
    elif url != "/-/static/app.css":
        assert result.headers["content-type"].startswith("text/html")
        assert "<script" not in result.text


def test_index_lists_tables_views_counts_and_canned_queries(client: falcon.testing.TestClient) -> None:
    page = client.simulate_get("/-/tables").text
    for name in TABLES + VIEWS:
        assert f'href="/{name}"' in page
    assert re.search(r'href="/jobs">jobs</a></td>\s*<td>table</td>\s*<td class="num">9</td>', page)
    for name in CANNED:
        assert f'href="/-/queries/{name}"' in page
    assert 'action="/-/query"' in page


def test_html_escapes_the_job_name_everywhere(client: falcon.testing.TestClient) -> None:
    for url in ["/jobs", "/job_summary", "/-/jobs/1", "/-/queries/gpu_hours_by_job_name",
                "/-/query?sql=select+name+from+jobs", "/events", "/-/queries/job_timeline?job_id=1"]:
        page = client.simulate_get(url).text
        assert "<b>" not in page, url
        assert ESCAPED_NAME in page or "&lt;b&gt;" in page, url
    logs = client.simulate_get("/-/jobs/1").text
    assert "epoch 1 &lt;loss&gt; 0.5" in logs and "warning: &amp; co" in logs


def test_query_json_shape_and_escaping(client: falcon.testing.TestClient) -> None:
    result = client.simulate_get("/-/query.json", params={"sql": "select id, name from jobs where id = :id", "id": "1"})
    assert result.json == {"ok": True, "columns": ["id", "name"], "rows": [[1, EVIL_NAME]], "truncated": False}


def test_query_csv_is_quoted(client: falcon.testing.TestClient) -> None:
    sql = "select id, name, null as empty from jobs where id = 1"
    result = client.simulate_get("/-/query.csv", params={"sql": sql})
    assert result.text == 'id,name,empty\r\n1,"<b>""x"",y</b>",\r\n'
    assert list(csv.reader(io.StringIO(result.text))) == [["id", "name", "empty"], ["1", EVIL_NAME, ""]]


def test_table_csv_round_trips(client: falcon.testing.TestClient) -> None:
    rows = list(csv.DictReader(io.StringIO(client.simulate_get("/jobs.csv").text)))
    assert len(rows) == 9 and rows[0]["name"] == EVIL_NAME and rows[0]["spec"].startswith('{"command"')


@pytest.mark.parametrize(("sql", "message"), [
    ("delete from jobs", "DELETE from jobs is not allowed"),
    ("select 1; delete from jobs", "only one statement per query"),
    ("attach 'x.db' as x", "ATTACH"),
    ("select load_extension('x')", "load_extension() is not allowed"),
    ("pragma journal_mode=delete", "PRAGMA journal_mode is not allowed"),
    ("select * from tokens", "tokens.token_hash is hidden"),
    ("select nope from jobs", "no such column: nope (line 1, column 8: 'nope from jobs')"),
    ("", "give the query as ?sql=..."),
])
def test_query_json_errors_are_400(client: falcon.testing.TestClient, state: Path, sql: str, message: str) -> None:
    before = file_digest(state)
    for suffix in (".json", ".csv"):
        result = client.simulate_get(f"/-/query{suffix}", params={"sql": sql})
        assert result.status_code == 400
        assert result.json["ok"] is False and message in result.json["error"]
        assert set(result.json) == {"ok", "error"}
    assert file_digest(state) == before


def test_query_html_error_points_at_the_token(client: falcon.testing.TestClient) -> None:
    result = client.simulate_get("/-/query", params={"sql": "select id,\n  bogus from jobs"})
    assert result.status_code == 400
    assert "no such column: bogus" in result.text
    assert "At line 2, column 3:" in result.text
    assert "<mark>b</mark>ogus from jobs" in result.text
    assert "select id,\n  bogus" in result.text  # the form keeps the SQL to fix


def test_time_limit_over_http(state: Path) -> None:
    client = falcon.testing.TestClient(create_app(str(state), time_limit_s=0.2))
    sql = "with recursive c(x) as (select 1 union all select x + 1 from c) select count(*) from c"
    result = client.simulate_get("/-/query.json", params={"sql": sql})
    assert result.status_code == 400
    assert result.json == {"ok": False, "error": "query took longer than 0.2 s and was stopped"}
    assert "query took longer than 0.2 s and was stopped" in client.simulate_get("/-/query", params={"sql": sql}).text


def test_row_limit_over_http(state: Path) -> None:
    client = falcon.testing.TestClient(create_app(str(state), max_rows=10))
    result = client.simulate_get("/-/query.json", params={"sql": "select seq from events"})
    assert result.json["truncated"] is True and len(result.json["rows"]) == 10
    assert "the query returned more (row limit 10)" in client.simulate_get(
        "/-/query", params={"sql": "select seq from events"}).text


def test_query_page_turns_named_parameters_into_fields(client: falcon.testing.TestClient) -> None:
    page = client.simulate_get("/-/query", params={"sql": "select name from jobs where id = :job_id",
                                                   "job_id": "7"}).text
    assert '<input name="job_id" value="7">' in page
    assert "<td>fits</td>" in page
    assert 'href="/-/query.json?sql=select+name+from+jobs+where+id+%3D+%3Ajob_id&amp;job_id=7"' in page


def collect(client: falcon.testing.TestClient, url: str, key: int = 0) -> list:
    """Every row's `key` column over every page, following next_url."""
    seen = []
    while url:
        body = client.simulate_get(url).json
        seen += [row[key] for row in body["rows"]]
        url = body["next_url"]
    return seen


@pytest.mark.parametrize(("url", "expected"), [
    ("/events.json?_size=40", list(range(1, 254))),
    ("/events.json?_size=40&_sort_desc=at", None),
    ("/tasks.json?_size=3&_sort=worker_id", [3, 4, 5, 6, 7, 1, 2, 8, 9, 10]),
    ("/tasks.json?_size=3&_sort_desc=worker_id", [10, 9, 1, 2, 8, 3, 4, 5, 6, 7]),
    ("/tasks.json?_size=2&_sort=endpoint&state=running", [1, 8, 9]),
    ("/job_summary.json?_size=4&_sort=name", [1, 7, 9, 4, 3, 8, 5, 2, 6]),
])
def test_paging_visits_every_row_once(client: falcon.testing.TestClient, url: str, expected: list | None) -> None:
    seen = collect(client, url)
    assert len(seen) == len(set(seen))
    if expected is None:
        assert sorted(seen) == list(range(1, 254))
    else:
        assert seen == expected


def test_table_page_links_next_and_job_ids(client: falcon.testing.TestClient) -> None:
    page = client.simulate_get("/events?_size=5").text
    assert 'href="/events?_size=5&amp;_next=5"' in page
    tasks = client.simulate_get("/tasks").text
    assert '<a href="/-/jobs/1">1</a>' in tasks
    assert '<a href="/-/workers/1">1</a>' in tasks  # a worker id opens the worker's page
    jobs = client.simulate_get("/jobs").text
    assert '<a href="/-/jobs/9">9</a>' in jobs
    assert '<time title="1699996400.0">2023-11-14 21:13:20</time>' in jobs


def test_filters_and_errors(client: falcon.testing.TestClient) -> None:
    assert [r[0] for r in client.simulate_get("/jobs.json?state=queued").json["rows"]] == [3, 4, 5, 6, 7]
    assert [r[0] for r in client.simulate_get("/jobs.json?state=queued&gpus=8").json["rows"]] == [6]
    assert [r[0] for r in client.simulate_get("/worker_load.json?free_gpus=6").json["rows"]] == [1]
    bad = client.simulate_get("/jobs.json?colour=red")
    assert bad.status_code == 400 and bad.json == {"ok": False, "error": "table jobs has no column 'colour'"}
    hidden = client.simulate_get("/tokens.json?token_hash=x")
    assert hidden.status_code == 400 and "hidden" in hidden.json["error"]
    assert client.simulate_get("/tokens.json?_sort=token_hash").status_code == 400
    assert client.simulate_get("/events.json?_next=junk").status_code == 400
    assert client.simulate_get("/nope").status_code == 404
    assert client.simulate_get("/nope.json").json == {"ok": False, "error": "no table or view named 'nope'"}
    assert client.simulate_get("/-/queries/nope").status_code == 404
    assert client.simulate_get("/-/jobs/99").status_code == 404


def test_filter_form_redirects_to_column_equals_value(client: falcon.testing.TestClient) -> None:
    result = client.simulate_get("/jobs", params={"_filter_column": "state", "_filter_value": "queued", "_sort": ""})
    assert result.status_code == 303 and result.headers["location"] == "/jobs?state=queued"


def test_hidden_columns_are_masked_on_table_pages(client: falcon.testing.TestClient) -> None:
    tokens = client.simulate_get("/tokens.json").json
    hidden = tokens["columns"].index("token_hash")
    assert {row[hidden] for row in tokens["rows"]} == {"(hidden)"}
    workers = client.simulate_get("/workers.csv").text
    assert "SECRETSESSION" not in workers and "(hidden)" in workers
    assert "SECRETCIPHER" not in client.simulate_get("/secrets").text


def test_queued_jobs_says_why_each_waits(client: falcon.testing.TestClient) -> None:
    body = client.simulate_get("/-/queries/queued_jobs.json").json
    reasons = {row[0]: row[body["columns"].index("waits_for")] for row in body["rows"]}
    assert reasons == {3: "labels", 4: "accelerator", 5: "size", 6: "gpus_busy", 7: None}
    assert body["rows"][0][0] == 3  # highest priority first


def test_queued_jobs_carries_the_latest_forecast(state) -> None:
    import apsw
    db = apsw.Connection(str(state))
    db.execute("INSERT INTO estimates (job_id, start_at, reason, workers, forecast_at) VALUES"
               " (6, ?, NULL, '[\"gpu-a\"]', ?), (5, NULL, 'no worker could ever run it: ...', '[]', ?)",
               (NOW + 600, NOW, NOW))
    db.close()
    client = falcon.testing.TestClient(create_app(str(state), clock=lambda: NOW))
    body = client.simulate_get("/-/queries/queued_jobs.json").json
    at, why = body["columns"].index("estimated_start_at"), body["columns"].index("estimate_reason")
    found = {row[0]: (row[at], row[why]) for row in body["rows"]}
    assert found[6] == (NOW + 600, None) and found[5] == (None, "no worker could ever run it: ...")
    assert found[7] == (None, None)  # not in the forecast (yet)


def test_canned_queries_answer_their_question(client: falcon.testing.TestClient) -> None:
    running = client.simulate_get("/-/queries/running_tasks.json").json
    endpoint = running["columns"].index("endpoint")
    assert sorted(r[endpoint] for r in running["rows"] if r[endpoint]) == ["10.0.0.1:30001", "10.0.0.2:30002"]
    lost = client.simulate_get("/-/queries/lost_tasks.json").json
    assert [(r[0], r[lost["columns"].index("worker_name")]) for r in lost["rows"]] == [(10, "gone-d")]
    later = client.simulate_get("/-/queries/lost_tasks.json", params={"now": str(NOW + 2 * 86400)}).json
    assert later["rows"] == []
    load = client.simulate_get("/-/queries/worker_load.json").json
    assert {r[1]: r[load["columns"].index("free_gpus")] for r in load["rows"]} == {
        "gpu-a": 6, "cpu-b": 0, "old-c": 2, "stale-e": 0}
    timeline = client.simulate_get("/-/queries/job_timeline.json?job_id=1").json
    assert [r[3] for r in timeline["rows"]] == ["job_submitted", "task_assigned", "task_started"]
    by_label = client.simulate_get("/-/queries/gpu_hours_by_label.json").json["rows"]
    assert by_label == [["team=ml", 8.0, 2], ["zone=a", 4.0, 1], ["(no labels)", 2.0, 1]]
    window = client.simulate_get("/-/queries/gpu_hours_by_job_name.json",
                                 params={"since": str(NOW - 3600), "until": str(NOW)}).json["rows"]
    assert window == [[EVIL_NAME, 2.0, 1]]


def test_canned_query_page_prefills_time_parameters(client: falcon.testing.TestClient) -> None:
    page = client.simulate_get("/-/queries/gpu_hours_by_label").text
    assert f'<input name="since" value="{NOW - 7 * 86400:.0f}">' in page
    assert f'<input name="until" value="{NOW:.0f}">' in page
    assert "GPU-hours used between :since and :until" in page


def test_workers_page(client: falcon.testing.TestClient) -> None:
    page = client.simulate_get("/-/workers").text
    for worker_id, name in ((1, "gpu-a"), (2, "cpu-b"), (3, "old-c"), (5, "stale-e")):
        assert f'<td><a href="/-/workers/{worker_id}">{name}</a></td>' in page
    assert "gone-d" not in page
    assert '<span class="label">gpu=h100</span>' in page
    assert "2 / <strong>6</strong> <small>of 8</small>" in page  # gpu-a: 2 GPUs used, 6 free
    unmatched = page.split("Queued tasks no attached worker can take")[1]
    assert [int(i) for i in re.findall(r'<a href="/-/jobs/(\d+)">', unmatched)] == [3, 4, 5]


def test_job_page_shows_tasks_events_endpoints_and_logs(client: falcon.testing.TestClient) -> None:
    job = client.simulate_get("/-/jobs/1").text
    assert f"Job 1: {ESCAPED_NAME}" in job
    assert "task_started" in job and "epoch 1 &lt;loss&gt; 0.5" in job
    service = client.simulate_get("/-/jobs/8").text
    assert "<h2>Endpoints</h2>" in service and "10.0.0.2:30002" in service


def test_mounted_under_a_prefix_every_link_keeps_it(state: Path) -> None:
    client = falcon.testing.TestClient(create_app(str(state), base_path="/explorer"))
    for url in ["/explorer", "/explorer/", "/explorer/jobs", "/explorer/-/workers", "/explorer/-/jobs/1",
                "/explorer/-/query?sql=select+1", "/explorer/-/queries/queued_jobs"]:
        result = client.simulate_get(url)
        assert result.status_code == 200, url
        for link in re.findall(r'(?:href|action)="([^"]+)"', result.text):
            assert link.startswith("/explorer/"), (url, link)
    assert client.simulate_get("/jobs").status_code == 404


def test_workers_page_shows_cordons_and_unhealthy_gpus(state, client: falcon.testing.TestClient) -> None:
    import apsw
    db = apsw.Connection(str(state))
    gpu_a = db.execute("SELECT id FROM workers WHERE name = 'gpu-a'").fetchall()[0][0]
    db.execute("INSERT INTO worker_cordons (worker_id, state, reason, since, deadline) "
               "VALUES (?, 'draining', 'swap <GPU> 3', 1, 2)", (gpu_a,))
    db.execute("INSERT INTO worker_gpus (worker_id, \"index\", uuid, healthy, reason, changed_at) "
               "VALUES (?, 3, 'GPU-3', 0, 'Xid 79', 1)", (gpu_a,))
    db.close()
    page = client.simulate_get("/-/workers").text
    assert '<span class="state draining">draining</span> swap &lt;GPU&gt; 3' in page
    assert "<strong>1</strong>: 3: Xid 79" in page
    assert "2 / <strong>5</strong> <small>of 8</small>" in page  # the bad GPU is neither used nor free


def test_queued_jobs_says_when_only_unhealthy_gpus_would_fit(state, client: falcon.testing.TestClient) -> None:
    import apsw
    db = apsw.Connection(str(state))
    gpu_a = db.execute("SELECT id FROM workers WHERE name = 'gpu-a'").fetchall()[0][0]
    db.execute("INSERT INTO worker_gpus (worker_id, \"index\", uuid, healthy, reason, changed_at) "
               "VALUES (?, 3, 'GPU-3', 0, 'Xid 79', 1)", (gpu_a,))
    db.close()
    body = client.simulate_get("/-/queries/queued_jobs.json").json
    reasons = {row[0]: row[body["columns"].index("waits_for")] for row in body["rows"]}
    assert reasons[6] == "unhealthy" and reasons[7] is None


def test_workers_page_shows_each_workers_isolation(state, client: falcon.testing.TestClient) -> None:
    import apsw
    db = apsw.Connection(str(state))
    db.execute("UPDATE workers SET isolation = ? WHERE name = 'gpu-a'",
               ('{"sandbox": "bwrap", "user": "gpulayer-task", "root_tasks": false}',))
    db.execute("UPDATE workers SET isolation = ? WHERE name = 'cpu-b'",
               ('{"sandbox": "none", "warning": "tasks are not sandboxed: bwrap is not installed <here>"}',))
    db.close()
    page = client.simulate_get("/-/workers").text
    assert "<td>bwrap as gpulayer-task</td>" in page
    assert "<td>none: tasks are not sandboxed: bwrap is not installed &lt;here&gt;</td>" in page
    assert "<th>isolation</th>" in page
