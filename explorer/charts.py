"""The explorer's pictures: named queries' rows turned into series, drawn by svg.py.

The time charts' SQL (page_chart_*) does the heavy part in one pass over the spans in a
window: per bucket of `step` seconds it sums the changes (+n when a span starts, -n when it
ends) and each change times the seconds from it to the bucket's end. From those two sums the
average over a bucket is exact: the level at its start (the changes of every bucket before)
plus its weighted changes over `step`. So a task that ran 5 minutes inside a 30-minute bucket
counts 1/6 there, and Python reads one row per bucket and series, never a row per task.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from markupsafe import Markup

from . import svg
from .queries import QUERIES, Query
from gpulayer.server.store.readonly_sql import QueryError, Result, Session, first, row_dicts

WINDOW_S = 24 * 3600  # the home page's time charts: the last day
BUCKETS = 48  # ... in half hours
WEEKS = 8  # GPU-hours per project: the last eight weeks
TOP_PROJECTS = 7  # more projects than this are summed as "other"
MAX_WORKER_CHARTS = 24  # the busiest workers get a chart each; the rest are counted
SAMPLES_TABLE = "gpu_samples"
MARK_LIMIT = 500
# A time chart's query answers a row per series and bucket: far under this; past it, the chart says so.
MAX_CHART_ROWS = 50_000
MARK_KINDS = {
    "task_preempted": "preempted",
    "task_requeued": "requeued",
    "task_lost": "lost",
    "job_retried": "retried",
    "element_retried": "retried",
    "job_held": "held",
    "job_released": "released",
    "task_reported": "restarted",
}


@dataclass(frozen=True)
class Window:
    """[since, until) cut into `buckets` of `step` seconds."""

    since: float
    until: float
    buckets: int

    @property
    def step(self) -> float:
        return (self.until - self.since) / self.buckets

    def params(self) -> dict[str, float]:
        return {"since": self.since, "until": self.until, "step": self.step}

    def starts(self) -> list[float]:
        return [self.since + i * self.step for i in range(self.buckets)]


def last_day(now: float) -> Window:
    return Window(now - WINDOW_S, now, BUCKETS)


def averages(rows: Iterable[dict[str, Any]], window: Window) -> dict[Any, list[float]]:
    """{series: the average level in each bucket} from page_chart_* rows (series, bucket, change, weighted)."""
    by_series: dict[Any, dict[int, tuple[float, float]]] = {}
    for row in rows:
        by_series.setdefault(row["series"], {})[int(row["bucket"])] = (row["change"], row["weighted"])
    out: dict[Any, list[float]] = {}
    for series, buckets in by_series.items():
        level, values = 0.0, []
        for b in range(window.buckets):
            change, weighted = buckets.get(b, (0.0, 0.0))
            values.append(max(level + weighted / window.step, 0.0))
            level += change
        out[series] = values
    return out


def _points(window: Window, values: list[float]) -> list[tuple[float, float]]:
    return list(zip(window.starts(), values, strict=True))


def tasks_chart(session: Session, window: Window) -> Markup:
    """Queued and running tasks over the window, averaged per bucket."""
    levels = averages(row_dicts(_chart_rows(session, QUERIES["page_chart_tasks"], window)), window)
    series = [svg.Series(name, _points(window, levels.get(name, [0.0] * window.buckets))) for name in ("queued", "running")]
    peak = {s.name: max((v for _, v in s.points), default=0) for s in series}
    desc = (
        f"Tasks queued and running, average per {window.step / 60:.0f} minutes, from {_utc(window.since)} "
        f"to {_utc(window.until)} UTC; peaks: {peak['queued']:.1f} queued, {peak['running']:.1f} running."
    )
    return svg.line_chart("chart-tasks", "Tasks queued and running", desc, series, window.since, window.until, unit="tasks")


@dataclass(frozen=True)
class WorkerChart:
    worker_id: int
    name: str
    gpus: int
    chart: Markup


def gpu_charts(session: Session, window: Window) -> tuple[list[WorkerChart], int, bool]:
    """A chart per worker: GPUs its tasks held and, where its agent sent samples (gpu_samples), its GPUs' measured
    utilization. The MAX_WORKER_CHARTS workers that held the most GPU time, then attached workers with GPUs by
    id. Also how many workers that held GPUs were left out, and whether any measurement was drawn."""
    held = averages(row_dicts(_chart_rows(session, QUERIES["page_chart_gpus"], window)), window)
    ranked = sorted(held, key=lambda w: (-sum(held[w]), w))
    idle = [r["worker_id"] for r in row_dicts(session.query(QUERIES["page_gpu_workers"].sql, {"limit": MAX_WORKER_CHARTS}))]
    shown = (ranked + [w for w in idle if w not in held])[:MAX_WORKER_CHARTS]
    ids = json.dumps(shown)
    workers = {r["worker_id"]: r for r in row_dicts(session.query(QUERIES["page_worker_names"].sql, {"ids": ids}))}
    measured: dict[Any, list[tuple[float, float]]] = {}  # worker: its buckets that have a sample
    if shown and has_table(session, SAMPLES_TABLE):
        found = session.query(
            QUERIES["page_chart_gpu_samples"].sql,
            {**window.params(), "buckets": window.buckets, "ids": ids},
            max_rows=len(shown) * window.buckets,
        )
        starts = window.starts()
        for row in row_dicts(found):
            if row["gpus_busy"] is not None and 0 <= row["bucket"] < window.buckets:
                measured.setdefault(row["series"], []).append((starts[int(row["bucket"])], row["gpus_busy"]))
    charts = []
    for worker_id in shown:
        facts = workers.get(worker_id, {"name": f"#{worker_id}", "gpus": 0})
        series = [svg.Series("GPUs held by tasks", _points(window, held.get(worker_id, [0.0] * window.buckets)))]
        if worker_id in measured:  # no line where its agent sent no sample: unknown is not idle
            series.append(svg.Series("GPUs busy (measured)", measured[worker_id], "measured"))
        desc = (
            f"Worker {facts['name']} ({facts['gpus']} GPUs): GPUs held by its tasks, average per "
            f"{window.step / 60:.0f} minutes"
            + (
                ", and its GPUs' measured utilization (the sum over its GPUs of each one's last sample in each bucket; 1 = one GPU fully busy)"
                if worker_id in measured
                else ""
            )
            + f", {_utc(window.since)} to {_utc(window.until)} UTC."
        )
        chart = svg.line_chart(
            f"chart-gpus-{worker_id}",
            f"{facts['name']}: GPUs busy",
            desc,
            series,
            window.since,
            window.until,
            unit="GPUs",
            ceiling=float(facts["gpus"] or 0) or None,
            height=160,
        )
        charts.append(WorkerChart(worker_id, facts["name"], facts["gpus"], chart))
    return charts, max(len(ranked) - MAX_WORKER_CHARTS, 0), bool(measured)


def week_start(at: float) -> float:
    """The Monday 00:00 UTC of the week of `at`."""
    day = datetime.fromtimestamp(at, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return day.timestamp() - day.weekday() * 86400


def project_weeks_chart(session: Session, now: float) -> Markup:
    """GPU-hours per project per week (the usage ledger, runs by the week they ended), the last WEEKS weeks."""
    since = week_start(now) - (WEEKS - 1) * 7 * 86400
    rows = row_dicts(session.query(QUERIES["gpu_hours_by_week"].sql, {"since": since, "until": now}))
    weeks = [datetime.fromtimestamp(since + i * 7 * 86400, UTC).strftime("%Y-%m-%d") for i in range(WEEKS)]
    totals: dict[str, float] = {}
    for row in rows:
        totals[row["project"]] = totals.get(row["project"], 0.0) + (row["gpu_hours"] or 0.0)
    ranked = sorted(totals, key=lambda p: (-totals[p], p))
    names = ranked[:TOP_PROJECTS] + (["other"] if len(ranked) > TOP_PROJECTS else [])
    stacks = {name: [0.0] * WEEKS for name in names}
    for row in rows:
        name = row["project"] if row["project"] in stacks and row["project"] != "other" else "other"
        if row["week_of"] in weeks and name in stacks:
            stacks[name][weeks.index(row["week_of"])] += row["gpu_hours"] or 0.0
    total = sum(totals.values())
    desc = (
        f"GPU-hours per project in each of the last {WEEKS} weeks (Monday first, by the week a run ended), "
        f"{total:.1f} GPU-hours in all" + (f"; most: {ranked[0]} {totals[ranked[0]]:.1f}" if ranked else "") + "."
    )
    return svg.bar_chart("chart-project-weeks", "GPU-hours per project per week", desc, [w[5:] for w in weeks], stacks, unit="GPU-hours")


def idle_chart(session: Session, now: float) -> Markup:
    """GPU-hours held idle and busy per project over the last seven days (the canned gpus_held_idle)."""
    rows = row_dicts(session.query(QUERIES["gpus_held_idle"].sql, {"since": now - 7 * 86400, "until": now}))
    per: dict[str, list[float]] = {}
    for row in rows:
        held, idle = per.setdefault(row["project"], [0.0, 0.0]), row["gpu_hours_idle"] or 0.0
        held[0], held[1] = held[0] + idle, held[1] + (row["gpu_hours_held"] or 0.0) - idle
    projects = sorted(per, key=lambda p: (-per[p][0], p))[:TOP_PROJECTS]
    idle_total = sum(v[0] for v in per.values())
    desc = (f"GPU-hours held by each project's tasks over the last 7 days, under their idle threshold (idle) and "
            f"over it (busy): {idle_total:.1f} GPU-hours held idle in all (the query gpus_held_idle).")
    return svg.bar_chart("chart-gpus-held-idle", "GPUs held idle per project (7 days)", desc, projects,
                         {"idle": [per[p][0] for p in projects], "busy": [per[p][1] for p in projects]},
                         unit="GPU-hours")


def job_timeline(session: Session, job: dict[str, Any], now: float) -> tuple[Markup, int, bool]:
    """Job `job`'s life as a bar (queued until its first task started, running until it ended or now)
    with its tasks' restarts, preemptions, requeues and losses marked; also how many marks and
    whether MARK_LIMIT cut them."""
    start = job["created_at"]
    end = job["finished_at"] or now
    segments = []
    started = job["first_started_at"]
    if started is None:
        segments.append(svg.Segment(start, end, "queued" if job["finished_at"] is None else job["state"]))
    else:
        segments.append(svg.Segment(start, started, "queued"))
        segments.append(svg.Segment(started, end, "running"))
        if job["finished_at"] is not None:
            segments.append(svg.Segment(end, end, job["state"]))
    result = session.query(QUERIES["page_job_marks"].sql, {"job_id": job["job_id"], "limit": MARK_LIMIT})
    marks = [svg.Mark(r["at"], MARK_KINDS.get(r["kind"], r["kind"]), _mark_label(r)) for r in row_dicts(result)]
    counts: dict[str, int] = {}
    for mark in marks:
        counts[mark.kind] = counts.get(mark.kind, 0) + 1
    said = ", ".join(f"{n} {kind}" for kind, n in counts.items()) or "no restart, preemption or requeue"
    desc = (
        f"Job {job['job_id']} from submission at {_utc(start)} UTC: queued "
        + (f"until its first task started at {_utc(started)}, then running " if started is not None else "")
        + (f"until it ended ({job['state']}) at {_utc(end)}" if job["finished_at"] is not None else "until now")
        + f"; marks: {said}."
    )
    chart = svg.timeline_bar("chart-job-timeline", f"Job {job['job_id']} timeline", desc, segments, marks, start, max(end, start + 1))
    return chart, len(marks), result.truncated


def worker_gpus_chart(session: Session, worker: dict[str, Any], window: Window) -> Markup | None:
    """Worker `worker`'s GPUs' measured utilization over `window`: a line per GPU (percent, each bucket's last
    sample; no point where none came); None for a worker without GPUs or where no table of samples exists."""
    if not worker["gpus"] or not has_table(session, SAMPLES_TABLE):
        return None
    found = session.query(QUERIES["page_chart_worker_gpu_samples"].sql,
                          {**window.params(), "buckets": window.buckets, "worker_id": worker["worker_id"]},
                          max_rows=worker["gpus"] * window.buckets)
    points: dict[int, list[tuple[float, float]]] = {i: [] for i in range(worker["gpus"])}
    starts = window.starts()
    for row in row_dicts(found):
        if row["busy_pct"] is not None and 0 <= row["bucket"] < window.buckets and row["series"] in points:
            points[row["series"]].append((starts[int(row["bucket"])], row["busy_pct"]))
    series = [svg.Series(f"GPU {i}", points[i], "measured") for i in sorted(points)]
    desc = (f"Worker {worker['name']}'s {worker['gpus']} GPUs: each one's measured utilization (its last sample in "
            f"each {window.step / 60:.0f} minutes, percent), {_utc(window.since)} to {_utc(window.until)} UTC"
            + ("" if any(points.values()) else "; its agent sent no sample then") + ".")
    return svg.line_chart(f"chart-worker-{worker['worker_id']}-gpus", f"{worker['name']}: GPU utilization", desc,
                          series, window.since, window.until, unit="% busy", ceiling=100.0, height=200)


def _mark_label(row: dict[str, Any]) -> str:
    try:
        data = json.loads(row["data"])
    except (TypeError, ValueError):
        data = {}
    details = ", ".join(f"{k}={v}" for k, v in sorted(data.items()) if k in ("restarts", "reason", "attempt", "index"))
    return f"task {row['task_id']}" + (f" ({details})" if details else "")


def _chart_rows(session: Session, query: Query, window: Window) -> Result:
    """The rows of a page_chart_* query; raises QueryError in the unlikely case of more than MAX_CHART_ROWS."""
    result = session.query(query.sql, window.params(), max_rows=MAX_CHART_ROWS)
    if result.truncated:
        raise QueryError(f"{query.name} answered more than {MAX_CHART_ROWS} rows (series times buckets)")
    return result


def has_table(session: Session, name: str) -> bool:
    found = first(session.query(QUERIES["page_has_table"].sql, {"table": name}))
    return bool(found and found["found"])


def _utc(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M")
