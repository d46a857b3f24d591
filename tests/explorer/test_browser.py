"""The explorer in a real headless Chromium, served for real behind a token.

Debian's chromium driven by playwright's Python API (never `playwright
install`). Screenshots of the SQL page and the workers page land in
tests/output/ (gitignored), kept by CI as artifacts.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from chromium import OUTPUT, behind_token, executable, tab
from explorer_state import CLIENT_TOKEN, EVIL_NAME

pytestmark = pytest.mark.browser

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
if executable() is None:
    pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)", allow_module_level=True)


@pytest.fixture
def served(state: Path) -> Iterator[str]:
    """The explorer behind a client token at /explorer/ on a free loopback port."""
    with behind_token(state) as url:
        yield url


@pytest.fixture
def page(served: str) -> Iterator[sync_api.Page]:
    with tab(sync_api) as opened:
        yield opened


def test_log_in_browse_query_and_follow_links(served: str, page: sync_api.Page) -> None:
    OUTPUT.mkdir(exist_ok=True)
    expect = sync_api.expect

    # Not logged in: the workers page sends us to the login form, which sends us back.
    page.goto(f"{served}/-/workers")
    expect(page.locator("h1")).to_have_text("Log in")
    page.fill("input[name=token]", CLIENT_TOKEN)
    page.click("form.login button[type=submit]")
    expect(page.locator("h1")).to_have_text("Workers")
    expect(page.locator("table.workers")).to_contain_text("gpu-a")
    expect(page.locator("table.workers")).to_contain_text("needs_upgrade")
    page.screenshot(path=str(OUTPUT / "explorer-workers.png"), full_page=True)

    # The SQL page: run a query, see its rows (the job name shown as text, not markup).
    page.click("nav >> text=SQL")
    page.fill("textarea[name=sql]", "select id as job_id, name, state, gpus from jobs order by id")
    page.click("form.sql button[type=submit]")
    rows = page.locator("table.rows tbody tr")
    expect(rows).to_have_count(9)
    expect(rows.first).to_contain_text(EVIL_NAME)
    assert page.locator("table.rows b").count() == 0
    page.screenshot(path=str(OUTPUT / "explorer-sql.png"), full_page=True)

    # Follow a job id to its page.
    rows.first.locator("a", has_text="1").first.click()
    expect(page.locator("h1")).to_contain_text(f"Job 1: {EVIL_NAME}")
    expect(page.locator("pre.logs")).to_contain_text("epoch 1 <loss> 0.5")

    # A canned query from the index.
    page.click("nav >> text=Tables")
    page.click("ul.canned >> text=queued_jobs")
    expect(page.locator("h1")).to_have_text("queued_jobs")
    expect(page.locator("table.rows")).to_contain_text("gpus_busy")  # a `waits_for` word, not a sentence

    assert (OUTPUT / "explorer-sql.png").stat().st_size > 10_000
    assert (OUTPUT / "explorer-workers.png").stat().st_size > 10_000
