"""What a new user saw in the explorer in Chromium (issue 36, item 27), each page looked at in a real headless
Chromium at 1400x900, behind the token as the control plane serves it: the login page says who it is for and
where the token is; an unnamed job reads `unnamed`, not `null`; a job's events say `after_s` to the millisecond;
its tasks table fits the width; a 1.6 s job's timeline has time marks; a worker id opens the worker's own page
(its GPUs, their use over the last day from gpu_samples, its tasks, its cordon).

Debian's chromium driven by playwright (never `playwright install`), as test_browser.py does. Screenshots land
in tests/output/ (gitignored); the checks read the DOM, never pixels.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import apsw
import pytest
from chromium import OUTPUT, behind_token, executable, tab
from explorer_state import CLIENT_TOKEN, NOW, ensure_gpu_samples

pytestmark = pytest.mark.browser

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
if executable() is None:
    pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)", allow_module_level=True)

SHORT_JOB, UNNAMED_QUEUED = 30, 31


def add_short_job_and_samples(path: Path) -> None:
    """An unnamed job that ran 1.6 s on gpu-a (events a fraction of a second apart), an unnamed queued job,
    two hours of samples of gpu-a's GPUs 0 and 1, and old-c cordoned."""
    db = apsw.Connection(str(path))
    with db:
        spec = json.dumps({"command": ["python", "-c", "print(1)"], "gpus": 1})
        db.execute("INSERT INTO jobs (id, name, state, spec, kind, gpus, created_at, finished_at, exit_code)"
                   " VALUES (?, NULL, 'succeeded', ?, 'batch', 1, ?, ?, 0)", (SHORT_JOB, spec, NOW - 100.2, NOW - 98.0))
        db.execute("INSERT INTO jobs (id, name, state, spec, kind, created_at) VALUES (?, NULL, 'queued', ?, 'batch', ?)",
                   (UNNAMED_QUEUED, spec, NOW - 50))
        db.execute('INSERT INTO tasks (id, job_id, "index", state, worker_id, created_at, assigned_at, started_at,'
                   " finished_at, exit_code, gpu_indices) VALUES (300, ?, 0, 'succeeded', 1, ?, ?, ?, ?, 0, '[0]')",
                   (SHORT_JOB, NOW - 100.2, NOW - 100.0, NOW - 99.6, NOW - 98.0))
        for at, kind in ((NOW - 100.2, "job_submitted"), (NOW - 100.198038768768, "task_assigned"),
                         (NOW - 99.6, "task_started"), (NOW - 98.0, "task_finished")):
            db.execute("INSERT INTO events (at, kind, job_id, task_id, worker_id) VALUES (?, ?, ?, 300, 1)",
                       (at, kind, SHORT_JOB))
        ensure_gpu_samples(db)
        db.executemany("INSERT INTO gpu_samples VALUES (1, ?, ?, ?, ?, 81920)",
                       [(gpu, at, 30.0 + 40 * gpu, 20000 + gpu * 1000) for gpu in range(2)
                        for at in range(int(NOW - 2 * 3600), int(NOW), 60)])
        db.execute("INSERT INTO worker_cordons (worker_id, state, reason, since) VALUES (3, 'cordoned', 'disk check', ?)",
                   (NOW - 3600,))
    db.close()


@pytest.fixture
def served(state: Path) -> Iterator[tuple[str, sync_api.Page]]:
    """The explorer behind a client token (over the state plus a short job), and a tab."""
    add_short_job_and_samples(state)
    with behind_token(state) as url, tab(sync_api) as page:
        yield url, page


def _fits(page: sync_api.Page, selector: str) -> list[list[int]]:
    """[scrollWidth, clientWidth] of each `selector`'s box that scrolls sideways."""
    return page.evaluate(f"() => [...document.querySelectorAll({selector!r})]"
                         ".map(e => [e.scrollWidth, e.clientWidth]).filter(([s, c]) => s > c)")


def test_login_job_and_worker_pages_as_a_new_user_sees_them(served: tuple[str, sync_api.Page]) -> None:
    url, page = served
    OUTPUT.mkdir(exist_ok=True)
    expect = sync_api.expect

    page.goto(f"{url}/")
    form = page.locator("form.login")
    expect(form).to_contain_text("admins")
    expect(form).to_contain_text("client.json")
    expect(form).to_contain_text("gpulayer user add NAME --admin")
    page.screenshot(path=str(OUTPUT / "explorer-login.png"), full_page=True)
    page.fill("input[name=token]", CLIENT_TOKEN)
    page.click("form.login button[type=submit]")

    # The fleet: the unnamed queued job reads "unnamed".
    row = page.locator("table.jobs tbody tr", has=page.locator(f"a:text-is('{UNNAMED_QUEUED}')"))
    expect(row.locator("td").nth(1)).to_have_text("unnamed")

    # The short job: rounded after_s, time marks on its timeline, a tasks table that fits at 1400 px.
    page.goto(f"{url}/-/jobs/{SHORT_JOB}")
    events = page.locator("h2:text('Events') ~ div.scroll table.rows").first
    after = events.locator("tbody tr td:nth-child(3)").all_inner_texts()
    assert after == ["0.0", "0.002", "0.6", "2.2"], after
    marks = page.locator("#chart-job-timeline text.tick.x").all_text_contents()
    assert len(marks) >= 2 and all(re.fullmatch(r"\d\d:\d\d:\d\d", m) for m in marks), marks
    assert _fits(page, "div.scroll") == []
    page.screenshot(path=str(OUTPUT / "explorer-short-job.png"), full_page=True)
    page.goto(f"{url}/-/jobs/1")
    assert _fits(page, "div.scroll") == []

    # Its worker's id opens the worker's page: GPUs, their use over the day, its tasks.
    page.goto(f"{url}/-/jobs/{SHORT_JOB}")
    page.locator("h2:text('Tasks') ~ div.scroll table.rows a", has_text=re.compile("^1$")).first.click()
    expect(page.locator("h1")).to_contain_text("Worker gpu-a")
    assert page.url.endswith("/explorer/-/workers/1")
    gpus = page.locator("table.gpus tbody tr")
    expect(gpus).to_have_count(8)
    expect(gpus.first).to_contain_text("30 %")
    lines = page.locator("#chart-worker-1-gpus polyline")
    assert lines.count() == 8 and [lines.nth(i).get_attribute("data-points") != "0" for i in range(3)] == [True, True, False]
    expect(page.locator("h2:text('Tasks') ~ div.scroll table.rows")).to_contain_text("unnamed")
    page.screenshot(path=str(OUTPUT / "explorer-worker.png"), full_page=True)

    # A cordoned worker's page says so, and how to undo it; the workers page links each worker there.
    page.goto(f"{url}/-/workers")
    page.locator("table.workers a", has_text="old-c").click()
    expect(page.locator("p.cordon")).to_contain_text("disk check")
    expect(page.locator("p.cordon")).to_contain_text("gpulayer worker uncordon old-c")
    expect(page.locator("p.cordon")).to_contain_text("2023-11-14 21:13:20")
    page.screenshot(path=str(OUTPUT / "explorer-worker-cordoned.png"), full_page=True)
