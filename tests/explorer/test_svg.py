"""explorer/svg.py: scales, ticks, escaping and what each chart draws, counted in its elements."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from explorer import svg

SVG = "{http://www.w3.org/2000/svg}"
EVIL = '<script>alert("x")</script> & co'


def parsed(markup: str) -> ET.Element:
    """The chart as XML: it must be well-formed on its own."""
    return ET.fromstring(str(markup))


@pytest.mark.parametrize("top, ticks", [(7.3, [0, 2, 4, 6, 8]), (1, [0, 0.5, 1.0]), (1234, [0, 500, 1000, 1500]), (0, [0, 1.0])])
def test_value_ticks_are_round_and_cover_the_top(top: float, ticks: list[float]) -> None:
    assert svg.value_ticks(top) == pytest.approx(ticks)


def test_time_ticks_fall_on_whole_utc_steps() -> None:
    start = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC
    ticks, step = svg.time_ticks(start, start + 86400)
    assert step == 3 * 3600 and all(t % step == 0 for t in ticks) and start <= ticks[0] < start + step
    assert svg.time_label(ticks[0], step) == "00:00"
    weeks, week = svg.time_ticks(start, start + 50 * 86400)
    assert week == 7 * 86400 and all(svg.time_label(t, week) for t in weeks)
    assert all((t - 4 * 86400) % week == 0 for t in weeks)  # Mondays


def test_line_chart_is_accessible_escaped_and_counts_its_points() -> None:
    series = [svg.Series(EVIL, [(0, 1), (600, 3), (1200, 2)]), svg.Series("empty", [], "measured")]
    chart = svg.line_chart("c1", EVIL, EVIL, series, 0, 1800, unit="tasks", ceiling=4)
    root = parsed(chart)
    assert root.get("role") == "img" and root.get("aria-labelledby") == "c1-title c1-desc"
    assert root.find(f"{SVG}title").text == EVIL and root.find(f"{SVG}desc").text == EVIL
    assert "<script" not in chart
    lines = root.findall(f".//{SVG}polyline")
    assert [(line.get("data-series"), line.get("data-points")) for line in lines] == [(EVIL, "3"), ("empty", "0")]
    assert len(lines[0].get("points").split()) == 6  # a step: two corners a point
    assert "measured" in lines[1].get("class")
    assert root.find(f".//{SVG}line[@class='ceiling']") is not None
    assert "style=" not in chart  # the CSP allows no inline style


def test_bar_chart_draws_one_rect_per_nonzero_piece() -> None:
    chart = svg.bar_chart("c2", "t", "d", ["a", "b", "c"], {"p": [1.0, 0.0, 2.0], EVIL: [0.5, 0.0, 0.0]}, unit="GPU-hours")
    bars = parsed(chart).findall(f".//{SVG}rect[@data-category]")
    assert [(b.get("data-category"), b.get("data-series")) for b in bars] == [("a", "p"), ("a", EVIL), ("c", "p")]
    assert bars[1].find(f"{SVG}title").text == f"a · {EVIL}: 0.5 GPU-hours"
    assert float(bars[1].get("y")) + float(bars[1].get("height")) == pytest.approx(float(bars[0].get("y")), abs=0.2)


def test_timeline_bar_has_its_segments_and_marks() -> None:
    chart = svg.timeline_bar(
        "c3", "t", "d", [svg.Segment(0, 100, "queued"), svg.Segment(100, 400, "running")], [svg.Mark(250, "preempted", EVIL)], 0, 400
    )
    root = parsed(chart)
    assert [r.get("class") for r in root.findall(f".//{SVG}rect[@class]") if "segment" in r.get("class")] == [
        "segment phase-queued",
        "segment phase-running",
    ]
    mark = root.find(f".//{SVG}line[@class='mark mark-preempted']")
    assert mark is not None and EVIL in mark.find(f"{SVG}title").text


def test_gpu_strip_a_square_per_gpu_filled_by_its_use() -> None:
    cells = [svg.Cell("busy", 100.0, "GPU 0"), svg.Cell("free", None, "GPU 1"), svg.Cell("unhealthy", 0.0, EVIL)]
    root = parsed(svg.gpu_strip("g", EVIL, cells))
    assert [r.get("class") for r in root.findall(f"{SVG}rect")] == ["gpu gpu-busy", "util", "gpu gpu-free", "gpu gpu-unhealthy", "util"]
    assert re.fullmatch(r"[\d.]+", root.findall(f"{SVG}rect")[1].get("height"))
