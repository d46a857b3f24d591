"""The home page, a job page of an array and the pictures, over falcon.testing on a real state file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import apsw
import falcon.testing
import pytest
from explorer_state import HOUR, NOW, SCHEMA, file_digest
from fleet_state import ARRAY_JOB, ARRAY_SIZE, ENDED, EVIL_PROJECT, RUNNING, build_fleet

from explorer import charts, create_app, fleet, render
from gpulayer.server.store.readonly_sql import QueryTimeout, ReadOnlyDatabase


@pytest.fixture(scope="module")
def fleet_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fleet") / "state.db"
    build_fleet(path)
    return path


@pytest.fixture(scope="module")
def client(fleet_path: Path) -> falcon.testing.TestClient:
    return falcon.testing.TestClient(create_app(str(fleet_path), clock=lambda: NOW))


@pytest.fixture(scope="module")
def home(client: falcon.testing.TestClient) -> str:
    answer = client.simulate_get("/")
    assert answer.status_code == 200, answer.text
    return answer.text


@pytest.fixture(scope="module")
def array_page(client: falcon.testing.TestClient) -> str:
    answer = client.simulate_get(f"/-/jobs/{ARRAY_JOB}")
    assert answer.status_code == 200, answer.text
    return answer.text


def svg_of(page: str, chart_id: str) -> str:
    found = re.search(rf'<svg [^>]*id="{chart_id}".*?</svg>', page, re.DOTALL)
    assert found, f"no svg #{chart_id}"
    return found.group(0)


def section(page: str, heading: str) -> str:
    return page.split(f"<h2>{heading}")[1].split("<h2>")[0]


def test_home_lists_jobs_now_newest_first_with_command_owner_project_and_progress(home: str) -> None:
    now = section(home, "Jobs now")
    ids = [int(i) for i in re.findall(r'<a href="/-/jobs/(\d+)">', now)]
    assert ids == [ARRAY_JOB, 8, 7, 6, 5, 4, 3, 1]
    sweep = now.split("</tr>")[1]  # the first row after the heading row
    assert "python sweep.py --seed &#39;{index}&#39;" in sweep
    assert "<td>alice</td>" in sweep and "<td>vision</td>" in sweep
    ended = ENDED  # element 7's first attempt failed, its second succeeded: still one element
    assert f'<progress max="{ARRAY_SIZE}" value="{ended}"' in sweep
    assert f"{ended:,} of {ARRAY_SIZE:,} ended, {RUNNING} running, {ARRAY_SIZE - ENDED - RUNNING:,} queued" in sweep
    assert ">10h 00m<" in sweep  # its age


def test_home_lists_jobs_ended_in_the_last_day(home: str) -> None:
    ended = section(home, "Ended in the last 24 hours")
    assert [int(i) for i in re.findall(r'<a href="/-/jobs/(\d+)">', ended)] == [9]  # job 2 ended 3 days ago
    assert ">1h 00m ago<" in ended


def test_home_shows_each_workers_gpus_held_free_unhealthy_and_measured(home: str) -> None:
    workers = section(home, "Workers")
    strip = svg_of(workers, "gpus-1")
    cells = re.findall(r'<rect class="gpu gpu-(\w+)"', strip)
    # job 1 holds GPUs 0-1, three array elements 2-4; GPU 7 is unhealthy
    assert cells == ["busy"] * 5 + ["free"] * 2 + ["unhealthy"]
    assert strip.count('class="util"') == 8
    assert "GPU 7: unhealthy, 50 % utilized, 40,000 of 81,920 MB memory" in strip
    assert "gpu-a: 5 of 8 GPUs held by tasks, 1 unhealthy" in strip
    assert 'id="gpus-2"' not in workers  # cpu-b has no GPU


def test_home_shows_quota_use_per_project(home: str) -> None:
    quota = section(home, "Quota use per project")
    assert "<td>default</td>" in quota and "<td>vision</td>" in quota


def test_tasks_chart_has_both_series_a_title_and_a_description(home: str) -> None:
    chart = svg_of(home, "chart-tasks")
    assert '<title id="chart-tasks-title">Tasks queued and running</title>' in chart
    assert re.search(r'<desc id="chart-tasks-desc">Tasks queued and running, average per 30 minutes', chart)
    lines = dict(re.findall(r'data-series="(\w+)" data-points="(\d+)"', chart))
    assert lines == {"queued": "48", "running": "48"}


def test_project_weeks_chart_stacks_the_ledger_by_week_and_escapes_names(home: str) -> None:
    chart = svg_of(home, "chart-project-weeks")
    bars = re.findall(r'<rect class="bar series-\d" data-category="([\d-]+)" data-series="([^"]+)"', chart)
    assert sorted(bars) == sorted([("11-13", "default"), ("11-06", "vision"), ("11-06", "&lt;svg onload=alert(1)&gt;")])
    assert "11-13 · default: 10.0 GPU-hours" in chart
    assert EVIL_PROJECT not in chart and "<svg onload" not in chart
    assert len(re.findall(r'<text class="tick x"', chart)) >= charts.WEEKS


def test_gpu_chart_per_worker_with_its_measured_use(home: str) -> None:
    chart = svg_of(home, "chart-gpus-1")
    assert "gpu-a: GPUs busy" in chart
    series = dict(re.findall(r'data-series="([^"]+)" data-points="(\d+)"', chart))
    assert series == {"GPUs held by tasks": "48", "GPUs busy (measured)": "4"}  # samples of the last 2 hours only
    assert 'class="ceiling"' in chart  # its 8 GPUs
    assert "measured GPU utilization" in chart or "measured utilization" in chart


def test_array_job_page_summarises_elements_by_state_and_index_ranges(array_page: str) -> None:
    table = array_page.split('<table class="rows array">')[1].split("</table>")[0]
    rows = re.findall(r'<span class="state (\w+)">.*?<td class="num">([\d,]+)</td>\s*<td class="ranges">([^<]*)', table, re.DOTALL)
    assert rows == [
        ("queued", f"{ARRAY_SIZE - ENDED - RUNNING:,}", f"{ENDED + RUNNING}-{ARRAY_SIZE - 1}"),
        ("running", "3", f"{ENDED}-{ENDED + RUNNING - 1}"),
        ("succeeded", f"{ENDED:,}", f"0-{ENDED - 1}"),
    ]


def test_job_page_says_where_rows_are_cut_and_links_the_rest(array_page: str) -> None:
    assert f"Showing 200 of {ARRAY_SIZE + 1:,} tasks." in array_page
    assert f'href="/tasks?job_id={ARRAY_JOB}"' in array_page
    assert "<code>python sweep.py --seed &#39;{index}&#39;</code>" in array_page
    assert "<dt>owner</dt><dd>alice</dd>" in array_page and "<dt>project</dt><dd>vision</dd>" in array_page


def test_job_timeline_marks_restarts_and_preemptions(array_page: str) -> None:
    chart = svg_of(array_page, "chart-job-timeline")
    assert re.findall(r'<rect class="segment phase-(\w+)"', chart) == ["queued", "running"]
    marks = re.findall(r'<line class="mark mark-(\w+)"', chart)
    assert marks == ["preempted", "restarted"]  # a report with restarts 0 is no restart
    assert "reason=priority" in chart and "restarts=1" in chart
    assert "marks: 1 preempted, 1 restarted" in chart


def test_service_endpoints_are_links_and_the_ingress_is_shown(client: falcon.testing.TestClient) -> None:
    page = client.simulate_get("/-/jobs/8").text
    assert '<a class="endpoint" href="http://10.0.0.1:30001/">10.0.0.1:30001</a>' in page
    assert '<a class="ingress" href="/ingress/8/">/ingress/8</a>' in page
    for url in ("/endpoints", "/-/queries/running_tasks", "/tasks?job_id=8"):  # wherever an endpoint shows
        assert '<a class="endpoint" href="http://10.0.0.2:30002/">10.0.0.2:30002</a>' in client.simulate_get(url).text


@pytest.mark.parametrize(
    "endpoint, url",
    [
        ("10.0.0.1:30001", "http://10.0.0.1:30001/"),
        ("[fd00::1]:8000", "http://[fd00::1]:8000/"),
        ("javascript:alert(1)", None),
        ("h:1/x", None),
        (None, None),
    ],
)
def test_only_plain_host_port_endpoints_become_links(endpoint: str | None, url: str | None) -> None:
    assert render.endpoint_url(endpoint) == url


def test_rendering_every_new_page_writes_nothing(client: falcon.testing.TestClient, fleet_path: Path) -> None:
    before = file_digest(fleet_path)
    for url in ("/", f"/-/jobs/{ARRAY_JOB}", "/-/jobs/8", "/-/tables"):
        assert client.simulate_get(url).status_code == 200
    assert file_digest(fleet_path) == before


def test_without_gpu_samples_the_charts_show_held_gpus_only(  # no table, or (schema 18 on) no rows
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    build_fleet(path, samples=False)
    page = falcon.testing.TestClient(create_app(str(path), clock=lambda: NOW)).simulate_get("/").text
    chart = svg_of(page, "chart-gpus-1")
    assert dict(re.findall(r'data-series="([^"]+)" data-points="(\d+)"', chart)) == {"GPUs held by tasks": "48"}
    assert 'class="util"' not in svg_of(page, "gpus-1")


def test_averages_per_bucket_are_exact(tmp_path: Path) -> None:
    """A 2-GPU run from 0.5 to 2.5 buckets, a 4-GPU task running since 3.25 buckets: the average GPUs held in
    each half-hour bucket is what the spans cover of it."""
    path = tmp_path / "state.db"
    db = apsw.Connection(str(path))
    db.execute(SCHEMA.read_text())
    window = charts.last_day(NOW)
    step = window.step
    with db:
        db.execute("INSERT INTO workers (id, name, gpus, registered_at, last_seen_at) VALUES (1, 'w', 8, 0, 0)")
        db.execute("INSERT INTO jobs (id, spec, state, gpus, created_at) VALUES (1, '{}', 'running', 4, 0)")
        db.execute(
            "INSERT INTO tasks (id, job_id, state, worker_id, lease_expires_at, created_at, assigned_at,"
            " started_at) VALUES (1, 1, 'running', 1, ?, ?, ?, ?)",
            (NOW + 30, window.since + 3 * step, window.since + 3.25 * step, window.since + 3.25 * step),
        )
        db.execute(
            "INSERT INTO tasks (id, job_id, state, created_at, assigned_at, started_at, finished_at) VALUES (9, 1, 'succeeded', ?, ?, ?, ?)",
            (window.since, window.since + 0.5 * step, window.since + 0.5 * step, window.since + 2.5 * step),
        )
        db.execute(
            "INSERT INTO usage (task_id, job_id, attempt, user_id, project_id, worker_id, gpus, cpus,"
            " started_at, ended_at, gpu_seconds, cpu_seconds, outcome)"
            " VALUES (9, 1, 1, 1, 1, 1, 2, 0, ?, ?, 0, 0, 'succeeded')",
            (window.since + 0.5 * step, window.since + 2.5 * step),
        )
    db.close()
    with ReadOnlyDatabase(str(path)).session() as session:
        held = charts.averages(
            [
                dict(zip(("series", "bucket", "change", "weighted"), row, strict=True))
                for row in session.query(charts.QUERIES["page_chart_gpus"].sql, window.params()).rows
            ],
            window,
        )
        tasks = charts.averages(
            [
                dict(zip(("series", "bucket", "change", "weighted"), row, strict=True))
                for row in session.query(charts.QUERIES["page_chart_tasks"].sql, window.params()).rows
            ],
            window,
        )
    assert held[1][:6] == pytest.approx([1.0, 2.0, 1.0, 3.0, 4.0, 4.0])
    assert held[1][-1] == pytest.approx(4.0)
    assert tasks["running"][:5] == pytest.approx([0.5, 1.0, 0.5, 0.75, 1.0])
    assert tasks["queued"][:4] == pytest.approx([0.5, 0.0, 0.0, 0.25])  # task 9 until 0.5, task 1 from 3 to 3.25


def test_a_job_page_of_a_one_task_job_has_no_array_table(client: falcon.testing.TestClient) -> None:
    page = client.simulate_get("/-/jobs/1").text
    assert '<table class="rows array">' not in page and 'id="chart-job-timeline"' in page
    assert "Showing" not in page.split("<h2>Tasks")[1].split("<h2>")[0]


def test_hours_and_counts_for_people() -> None:
    assert [fleet.age_text(s) for s in (5, 125, 3 * HOUR + 300, 2 * 86400 + 4 * HOUR)] == ["5s", "2m", "3h 05m", "2d 4h"]
    assert fleet.capped(100_000) == "100,000" and fleet.capped(fleet.COUNT_CAP) == "more than 1,000,000"
    assert fleet.command_text(json.dumps(["sh", "-c", "echo hi"])) == "sh -c 'echo hi'"


def test_home_says_where_it_cuts_the_jobs(client: falcon.testing.TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fleet, "HOME_JOBS", 3)
    page = client.simulate_get("/").text
    assert "Showing 3 of 8 jobs queued, waiting or running." in page
    assert len(re.findall(r'<a href="/-/jobs/(\d+)">', section(page, "Jobs now"))) == 3


def test_a_picture_stopped_by_the_time_limit_leaves_the_page_standing(client: falcon.testing.TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    def stopped(*args: object) -> None:
        raise QueryTimeout("query took longer than 1.0 s and was stopped")

    monkeypatch.setattr(charts, "tasks_chart", stopped)
    answer = client.simulate_get("/")
    assert answer.status_code == 200
    assert "Tasks over time not drawn: query took longer than 1.0 s and was stopped" in answer.text
    assert 'id="chart-project-weeks"' in answer.text
