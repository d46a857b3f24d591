"""Charts as SVG text, drawn on the server: axes, a UTC time scale, step lines, stacked bars, a timeline bar.

No script and no `style` attribute (the explorer's Content-Security-Policy allows only its own
stylesheet): colours come from classes that app.css defines (`series-0` to `series-7`,
`phase-queued`, `mark-preempted`, ...). Every chart is `role="img"` with a `<title>` and a
`<desc>` that screen readers read; every label is escaped. Each line carries `data-points` and
each bar or segment is an element of its own, so a test counts what was drawn without pixels.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from markupsafe import Markup

WIDTH = 760
HEIGHT = 220
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 52, 16, 28, 30
LEGEND_ROW = 16
SERIES_CLASSES = 8  # series-0 .. series-7 in app.css; more series reuse them
# Tick spacings a time axis may use, in seconds: minutes to weeks.
TICK_HALF_WIDTH = 28  # half a time label's width (`22:11:42`), px: a tick nearer the right edge ends there
TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 300, 900, 1800, 3600, 2 * 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 2 * 86400, 7 * 86400)


@dataclass(frozen=True)
class Series:
    """One line: a name for the legend and (unix seconds, value) points in time order."""

    name: str
    points: Sequence[tuple[float, float]]
    kind: str = ""  # an extra class: "measured" draws dashed


@dataclass(frozen=True)
class Segment:
    """A span of a timeline bar: [start, end) in unix seconds, its kind ("queued", "running", ...)."""

    start: float
    end: float
    kind: str
    label: str = ""


@dataclass(frozen=True)
class Mark:
    """An instant on a timeline bar (a restart, a preemption), with what happened."""

    at: float
    kind: str
    label: str


@dataclass
class _Plot:
    """The drawing area inside the margins and the data ranges it maps."""

    width: int
    height: int
    top: float
    x_lo: float
    x_hi: float
    y_hi: float
    elements: list[Markup] = field(default_factory=list)

    @property
    def left(self) -> float:
        return MARGIN_LEFT

    @property
    def right(self) -> float:
        return self.width - MARGIN_RIGHT

    @property
    def bottom(self) -> float:
        return self.height - MARGIN_BOTTOM

    def x(self, value: float) -> float:
        span = (self.x_hi - self.x_lo) or 1.0
        return self.left + (min(max(value, self.x_lo), self.x_hi) - self.x_lo) / span * (self.right - self.left)

    def y(self, value: float) -> float:
        return self.bottom - (max(value, 0.0) / (self.y_hi or 1.0)) * (self.bottom - self.top)


def nice_step(top: float, ticks: int = 4) -> float:
    """A round tick spacing (1, 2 or 5 times a power of ten) that covers `top` in about `ticks` steps."""
    if top <= 0 or not math.isfinite(top):
        return 1.0
    raw = top / ticks
    power = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if raw <= factor * power:
            return factor * power
    return 10 * power


def value_ticks(top: float, ticks: int = 4) -> list[float]:
    """0 and round values up to the first at or above `top`."""
    step = nice_step(top, ticks)
    count = max(1, math.ceil(top / step - 1e-9))
    return [i * step for i in range(count + 1)]


def time_ticks(start: float, end: float, most: int = 8) -> tuple[list[float], int]:
    """Tick times between `start` and `end` on whole UTC steps, and the step (seconds) chosen."""
    span = max(end - start, 1.0)
    step = next((s for s in TIME_STEPS if span / s <= most), TIME_STEPS[-1] * math.ceil(span / TIME_STEPS[-1] / most))
    offset = 4 * 86400 if step % (7 * 86400) == 0 else 0  # weeks start on Monday (the epoch was a Thursday)
    first = math.ceil((start - offset) / step) * step + offset
    return [first + i * step for i in range(int((end - first) // step) + 1)], step


def time_label(at: float, step: float) -> str:
    """A tick's text: the date for day steps and longer, else the UTC time of day (with seconds for steps under
    a minute: a short job's timeline)."""
    moment = datetime.fromtimestamp(at, UTC)
    return moment.strftime("%m-%d") if step >= 86400 else moment.strftime("%H:%M" if step >= 60 else "%H:%M:%S")


def _number(value: float) -> str:
    """A value as a short label: 1.5k, 12, 0.25."""
    if abs(value) >= 10_000:
        return f"{value / 1000:.0f}k"
    if abs(value) >= 1000:
        return f"{value / 1000:.1f}k"
    return f"{value:.0f}" if value == int(value) else f"{value:.2g}"


def _f(value: float) -> str:
    return f"{value:.1f}"


def _open(chart_id: str, title: str, desc: str, width: int, height: int, kind: str) -> list[Markup]:
    """The <svg> element with its title and description (what a screen reader says)."""
    return [
        Markup(
            '<svg xmlns="http://www.w3.org/2000/svg" class="chart {}" id="{}" viewBox="0 0 {} {}" '
            'width="{}" height="{}" role="img" aria-labelledby="{}-title {}-desc">'
        ).format(kind, chart_id, width, height, width, height, chart_id, chart_id),
        Markup('<title id="{}-title">{}</title><desc id="{}-desc">{}</desc>').format(chart_id, title, chart_id, desc),
        Markup('<text class="chart-title" x="{}" y="16">{}</text>').format(MARGIN_LEFT, title),
    ]


def _value_axis(plot: _Plot, ticks: list[float], unit: str) -> None:
    for tick in ticks:
        y = _f(plot.y(tick))
        plot.elements.append(
            Markup('<line class="grid" x1="{}" x2="{}" y1="{}" y2="{}"/><text class="tick y" x="{}" y="{}">{}</text>').format(
                _f(plot.left), _f(plot.right), y, y, _f(plot.left - 6), y, _number(tick)
            )
        )
    middle = _f((plot.top + plot.bottom) / 2)
    plot.elements.append(Markup('<text class="unit y" transform="translate(11 {}) rotate(-90)" text-anchor="middle">{}</text>').format(middle, unit))
    plot.elements.append(
        Markup('<line class="axis" x1="{}" x2="{}" y1="{}" y2="{}"/>').format(_f(plot.left), _f(plot.right), _f(plot.bottom), _f(plot.bottom))
    )


def _time_axis(plot: _Plot) -> None:
    ticks, step = time_ticks(plot.x_lo, plot.x_hi)
    for tick in ticks:
        x = _f(plot.x(tick))
        near_end = plot.x(tick) > plot.right - TICK_HALF_WIDTH  # its label would run past the chart's edge
        plot.elements.append(
            Markup('<line class="tick-mark" x1="{}" x2="{}" y1="{}" y2="{}"/><text class="tick x{}" x="{}" y="{}">{}</text>').format(
                x, x, _f(plot.bottom), _f(plot.bottom + 4), " end" if near_end else "", x, _f(plot.bottom + 16),
                time_label(tick, step)
            )
        )
    plot.elements.append(Markup('<text class="unit x" x="4" y="{}">UTC</text>').format(_f(plot.bottom + 16)))


def _legend(names: Sequence[str], kinds: Sequence[str], width: int, y: float) -> list[Markup]:
    """One row of swatches and names, wrapped to the chart's width."""
    out, x, row = [], float(MARGIN_LEFT), y
    for i, (name, kind) in enumerate(zip(names, kinds, strict=True)):
        room = 24 + 7 * len(name)
        if x + room > width and x > MARGIN_LEFT:
            x, row = float(MARGIN_LEFT), row + LEGEND_ROW
        out.append(
            Markup(
                '<g class="legend-item"><rect class="swatch series-{} {}" x="{}" y="{}" width="12" height="8"/><text x="{}" y="{}">{}</text></g>'
            ).format(i % SERIES_CLASSES, kind, _f(x), _f(row - 8), _f(x + 16), _f(row), name)
        )
        x += room
    return out


def _legend_rows(names: Sequence[str], width: int) -> int:
    rows, x = 1, float(MARGIN_LEFT)
    for name in names:
        room = 24 + 7 * len(name)
        if x + room > width and x > MARGIN_LEFT:
            x, rows = float(MARGIN_LEFT), rows + 1
        x += room
    return rows


def line_chart(
    chart_id: str,
    title: str,
    desc: str,
    series: Sequence[Series],
    start: float,
    end: float,
    *,
    unit: str,
    ceiling: float | None = None,
    width: int = WIDTH,
    height: int = HEIGHT,
) -> Markup:
    """Lines over a UTC time axis from `start` to `end`; `ceiling` (a capacity) is drawn as a dashed line.

    Each series is a step line (a value holds until the next point), a `<polyline>` with
    `data-points` and `data-series`; a series with no point is still in the legend.
    """
    legend_height = LEGEND_ROW * _legend_rows([s.name for s in series], width)
    total = height + legend_height
    top_value = max([v for s in series for _, v in s.points] + [ceiling or 0.0, 1.0])
    ticks = value_ticks(top_value)
    plot = _Plot(width, total, MARGIN_TOP + legend_height, start, end, ticks[-1])
    _value_axis(plot, ticks, unit)
    _time_axis(plot)
    if ceiling is not None:
        y = _f(plot.y(ceiling))
        plot.elements.append(
            Markup('<line class="ceiling" x1="{}" x2="{}" y1="{}" y2="{}"><title>capacity: {}</title></line>').format(
                _f(plot.left), _f(plot.right), y, y, _number(ceiling)
            )
        )
    for i, line in enumerate(series):
        coords: list[str] = []
        for n, (at, value) in enumerate(line.points):
            following = line.points[n + 1][0] if n + 1 < len(line.points) else end
            coords += [f"{_f(plot.x(at))},{_f(plot.y(value))}", f"{_f(plot.x(following))},{_f(plot.y(value))}"]
        plot.elements.append(
            Markup('<polyline class="line series-{} {}" data-series="{}" data-points="{}" points="{}"><title>{}</title></polyline>').format(
                i % SERIES_CLASSES, line.kind, line.name, len(line.points), " ".join(coords), line.name
            )
        )
    head = _open(chart_id, title, desc, width, total, "line-chart")
    legend = _legend([s.name for s in series], [s.kind for s in series], width, MARGIN_TOP + 4)
    return Markup("").join([*head, *legend, *plot.elements, Markup("</svg>")])


def bar_chart(
    chart_id: str,
    title: str,
    desc: str,
    categories: Sequence[str],
    stacks: Mapping[str, Sequence[float]],
    *,
    unit: str,
    width: int = WIDTH,
    height: int = HEIGHT,
) -> Markup:
    """Stacked bars, one per category (left to right), one colour per key of `stacks` (each a value per category).

    Each piece is a `<rect class="bar">` with a `<title>` saying its category, key and value;
    zero pieces are not drawn.
    """
    names = list(stacks)
    legend_height = LEGEND_ROW * _legend_rows(names, width)
    totals = [sum(stacks[name][i] for name in names) for i in range(len(categories))]
    ticks = value_ticks(max(totals + [1.0]))
    plot = _Plot(width, height + legend_height, MARGIN_TOP + legend_height, 0, max(len(categories), 1), ticks[-1])
    _value_axis(plot, ticks, unit)
    slot = (plot.right - plot.left) / max(len(categories), 1)
    bar = max(2.0, slot * 0.7)
    for i, category in enumerate(categories):
        x = plot.left + i * slot + (slot - bar) / 2
        base = 0.0
        for k, name in enumerate(names):
            value = stacks[name][i]
            if value <= 0:
                continue
            y_top, y_base = plot.y(base + value), plot.y(base)
            plot.elements.append(
                Markup(
                    '<rect class="bar series-{}" data-category="{}" data-series="{}" x="{}" y="{}" '
                    'width="{}" height="{}"><title>{} · {}: {} {}</title></rect>'
                ).format(
                    k % SERIES_CLASSES, category, name, _f(x), _f(y_top), _f(bar), _f(max(y_base - y_top, 0.5)), category, name, f"{value:.1f}", unit
                )
            )
            base += value
        plot.elements.append(Markup('<text class="tick x" x="{}" y="{}">{}</text>').format(_f(x + bar / 2), _f(plot.bottom + 16), category))
    head = _open(chart_id, title, desc, width, height + legend_height, "bar-chart")
    legend = _legend(names, [""] * len(names), width, MARGIN_TOP + 4)
    return Markup("").join([*head, *legend, *plot.elements, Markup("</svg>")])


def timeline_bar(
    chart_id: str, title: str, desc: str, segments: Sequence[Segment], marks: Sequence[Mark], start: float, end: float, *, width: int = WIDTH
) -> Markup:
    """One horizontal bar from `start` to `end`: a `<rect class="segment phase-KIND">` per segment, a
    `<line class="mark mark-KIND">` per mark, each with a `<title>` that says what and when (UTC)."""
    height = MARGIN_TOP + 34 + MARGIN_BOTTOM
    plot = _Plot(width, height, MARGIN_TOP, start, end, 1.0)
    bar_top, bar_height = MARGIN_TOP + 6, 22
    for segment in segments:
        x0, x1 = plot.x(segment.start), plot.x(segment.end)
        plot.elements.append(
            Markup('<rect class="segment phase-{}" x="{}" y="{}" width="{}" height="{}"><title>{}: {} to {}{}</title></rect>').format(
                segment.kind,
                _f(x0),
                bar_top,
                _f(max(x1 - x0, 1.0)),
                bar_height,
                segment.kind,
                _when(segment.start),
                _when(segment.end),
                f" ({segment.label})" if segment.label else "",
            )
        )
    for mark in marks:
        x = _f(plot.x(mark.at))
        plot.elements.append(
            Markup('<line class="mark mark-{}" x1="{}" x2="{}" y1="{}" y2="{}"><title>{} at {}: {}</title></line>').format(
                mark.kind, x, x, bar_top - 5, bar_top + bar_height + 5, mark.kind, _when(mark.at), mark.label
            )
        )
    _time_axis(plot)
    kinds = list(dict.fromkeys([s.kind for s in segments] + [m.kind for m in marks]))
    legend = [
        Markup('<g class="legend-item"><rect class="swatch {}-{}" x="{}" y="10" width="12" height="8"/><text x="{}" y="18">{}</text></g>').format(
            "mark" if kind in {m.kind for m in marks} else "phase",
            kind,
            _f(width - MARGIN_RIGHT - 110 * (len(kinds) - i)),
            _f(width - MARGIN_RIGHT - 110 * (len(kinds) - i) + 16),
            kind,
        )
        for i, kind in enumerate(kinds)
    ]
    head = _open(chart_id, title, desc, width, height, "timeline")
    return Markup("").join([*head, *legend, *plot.elements, Markup("</svg>")])


def _when(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S")


@dataclass(frozen=True)
class Cell:
    """One GPU of a worker: its state (busy, free, unhealthy), measured utilization (0-100) if known, a label."""

    state: str
    utilization: float | None
    label: str


def gpu_strip(chart_id: str, title: str, cells: Sequence[Cell]) -> Markup:
    """A row of squares, one per GPU (`<rect class="gpu gpu-STATE">`), filled from the bottom by its measured
    utilization (`<rect class="util">`) where known; each square's `<title>` says it in words."""
    size, gap = 14, 3
    width = max(len(cells), 1) * (size + gap)
    out = [
        Markup(
            '<svg xmlns="http://www.w3.org/2000/svg" class="gpu-strip" id="{}" viewBox="0 0 {} {}" width="{}" '
            'height="{}" role="img" aria-labelledby="{}-title"><title id="{}-title">{}</title>'
        ).format(chart_id, width, size, width, size, chart_id, chart_id, title)
    ]
    for i, cell in enumerate(cells):
        x = i * (size + gap)
        out.append(
            Markup('<rect class="gpu gpu-{}" x="{}" y="0" width="{}" height="{}"><title>{}</title></rect>').format(
                cell.state, x, size, size, cell.label
            )
        )
        if cell.utilization is not None:
            filled = size * min(max(cell.utilization, 0.0), 100.0) / 100.0
            out.append(Markup('<rect class="util" x="{}" y="{}" width="{}" height="{}"/>').format(x + 3, _f(size - filled), size - 6, _f(filled)))
    out.append(Markup("</svg>"))
    return Markup("").join(out)
