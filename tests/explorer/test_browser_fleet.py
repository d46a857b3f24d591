"""The home page and an array's job page in a real headless Chromium: the SVG pictures are there, drawn
(their elements have a size on screen), labelled for screen readers, and the page's CSP refused nothing.

Debian's chromium driven by playwright (never `playwright install`), as test_browser.py does. Screenshots
land in tests/output/ (gitignored), kept by CI as artifacts; the checks read the DOM, never pixels.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from chromium import OUTPUT, executable, serving, tab
from explorer_state import NOW
from fleet_state import ARRAY_JOB, ARRAY_SIZE, build_fleet

from explorer import create_app

pytestmark = pytest.mark.browser

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
if executable() is None:
    pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)", allow_module_level=True)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The explorer over the fleet state, open, on a free loopback port."""
    path = tmp_path_factory.mktemp("fleet") / "state.db"
    build_fleet(path)
    with serving(create_app(str(path), clock=lambda: NOW)) as url:
        yield url


@pytest.fixture(scope="module")
def browser_page(served: str) -> Iterator[tuple[sync_api.Page, list[str]]]:
    """A tab, and the console messages it logged (a CSP refusal is one)."""
    with tab(sync_api) as page:
        messages: list[str] = []
        page.on("console", lambda message: messages.append(message.text))
        yield page, messages


def drawn(locator: sync_api.Locator) -> int:
    """How many of the located elements have a size on screen."""
    return sum(
        1 for box in (locator.nth(i).bounding_box() for i in range(locator.count())) if box is not None and box["width"] > 0 and box["height"] > 0
    )


def test_home_page_pictures_in_chromium(served: str, browser_page: tuple[sync_api.Page, list[str]]) -> None:
    page, messages = browser_page
    OUTPUT.mkdir(exist_ok=True)
    page.goto(f"{served}/")
    sync_api.expect(page.locator("h1")).to_contain_text("Fleet")

    tasks = page.locator("svg#chart-tasks")
    assert drawn(tasks) == 1
    assert tasks.get_attribute("role") == "img"
    assert tasks.locator("desc").text_content().startswith("Tasks queued and running, average per 30 minutes")
    lines = tasks.locator("polyline.line")
    assert drawn(lines) == 2
    assert [lines.nth(i).get_attribute("data-points") for i in range(2)] == ["48", "48"]
    assert "queued" in tasks.text_content() and "running" in tasks.text_content()  # legend labels

    weeks = page.locator("svg#chart-project-weeks")
    assert drawn(weeks.locator("rect.bar")) == 3
    assert "<svg onload=alert(1)>" in weeks.text_content()  # the evil project name, as text

    gpus = page.locator("svg#chart-gpus-1")
    assert drawn(gpus.locator("polyline.line")) == 2  # held and measured
    strip = page.locator("svg#gpus-1")
    assert drawn(strip.locator("rect.gpu")) == 8 and strip.locator("rect.gpu-unhealthy").count() == 1

    # Jobs now: the array with its progress bar; a job id links to its page.
    first_row = page.locator("table.jobs").first.locator("tbody tr").first
    sync_api.expect(first_row).to_contain_text("python sweep.py --seed '{index}'")
    assert first_row.locator("progress").get_attribute("max") == str(ARRAY_SIZE)
    page.screenshot(path=str(OUTPUT / "explorer-fleet.png"), full_page=True)

    first_row.locator("a", has_text=str(ARRAY_JOB)).click()
    sync_api.expect(page.locator("h1")).to_contain_text(f"Job {ARRAY_JOB}: sweep")
    timeline = page.locator("svg#chart-job-timeline")
    assert drawn(timeline.locator("rect.segment")) == 2
    assert timeline.locator("line.mark").count() == 2
    sync_api.expect(page.locator("table.array")).to_contain_text("1500-1502")
    sync_api.expect(page.locator("p.cut").first).to_contain_text(f"Showing 200 of {ARRAY_SIZE + 1:,} tasks")
    page.screenshot(path=str(OUTPUT / "explorer-job-array.png"), full_page=True)

    assert not [m for m in messages if "Content Security Policy" in m], messages
    assert (OUTPUT / "explorer-fleet.png").stat().st_size > 20_000
