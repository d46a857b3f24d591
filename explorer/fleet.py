"""What the home page and a job page show, from named queries: jobs with their command, owner and
progress; workers with their GPUs' state; an array's elements by state and index ranges.

Every query here is bounded: a LIMIT, a time window on an index, or a count capped at COUNT_CAP
("showing 1,000 of 100,000", or "of more than 1,000,000" past the cap).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup

from . import charts, svg
from .queries import QUERIES
from gpulayer.server.store.readonly_sql import QueryError, Session, first, row_dicts

HOME_JOBS = 100  # jobs queued, waiting or running: the newest
RECENT_S = 24 * 3600  # "recently ended": the last day
HOME_ENDED = 50
HOME_WORKERS = 200
SAMPLE_WINDOW_S = 300  # a GPU's latest measurement counts when it is at most 5 minutes old
COUNT_CAP = 1_000_000  # counts stop here: past it a page says "more than"
ARRAY_RANGES = 200  # index ranges an array summary lists at most


def command_text(value: Any) -> str:
    """A job's command (a JSON list of strings) as a shell would read it."""
    try:
        argv = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return str(value)
    if isinstance(argv, list) and all(isinstance(a, str) for a in argv):
        return shlex.join(argv)
    return "" if argv is None else str(value)


def age_text(seconds: float) -> str:
    """A duration as people say it: 45s, 12m, 3h 05m, 2d 4h."""
    seconds = max(int(seconds), 0)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d {seconds % 86400 // 3600}h"


@dataclass(frozen=True)
class Progress:
    """An array's or a multi-task job's tasks: ended, active and queued of `total`."""

    total: int
    queued: int
    active: int

    @property
    def ended(self) -> int:
        return max(self.total - self.queued - self.active, 0)

    @property
    def text(self) -> str:
        return f"{self.ended:,} of {self.total:,} ended, {self.active:,} running, {self.queued:,} queued"


def job_line(row: dict[str, Any], now: float) -> dict[str, Any]:
    """A home page row: the query's facts, the command as text, age and, for many tasks, progress."""
    total = row["array_size"] or row["width"]
    progress = None
    if total > 1:
        ended = row["finished_at"] is not None
        progress = Progress(total, 0 if ended else row["queued_tasks"], 0 if ended else row["active_tasks"])
    return {
        **row,
        "command_text": command_text(row["command"]),
        "progress": progress,
        "age": age_text(now - row["created_at"]),
        "ended_ago": age_text(now - row["finished_at"]) if row["finished_at"] is not None else None,
    }


def capped(count: int) -> str:
    """A count for people: 100,000, or 'more than 1,000,000' at the cap."""
    return f"more than {COUNT_CAP:,}" if count >= COUNT_CAP else f"{count:,}"


def home(session: Session, now: float) -> dict[str, Any]:
    """Everything the home page shows but its pictures."""
    active = row_dicts(session.query(QUERIES["page_home_jobs"].sql, {"limit": HOME_JOBS}))
    active_count = first(session.query(QUERIES["page_home_active_count"].sql, {"cap": COUNT_CAP}))
    ended = session.query(QUERIES["page_home_ended_jobs"].sql, {"since": now - RECENT_S, "until": now, "limit": HOME_ENDED})
    workers = session.query(QUERIES["page_home_workers"].sql, {"limit": HOME_WORKERS})
    samples: dict[tuple[int, int], dict[str, Any]] = {}
    if charts.has_table(session, charts.SAMPLES_TABLE):
        found = session.query(QUERIES["page_latest_gpu_samples"].sql, {"now": now, "window": SAMPLE_WINDOW_S}, max_rows=10_000)
        samples = {(r["worker_id"], r["gpu_index"]): r for r in row_dicts(found)}
    return {
        "active": [job_line(r, now) for r in active],
        "active_count": active_count["jobs"] if active_count else 0,
        "ended": [job_line(r, now) for r in row_dicts(ended)],
        "ended_truncated": ended.truncated or len(ended.rows) >= HOME_ENDED,
        "workers": [worker_line(w, samples) for w in row_dicts(workers)],
        "workers_truncated": len(workers.rows) >= HOME_WORKERS,
        "measured": bool(samples),
        "quota": session.query(QUERIES["quota_use_now"].sql),
        "limits": {"jobs": HOME_JOBS, "ended": HOME_ENDED, "workers": HOME_WORKERS, "recent_h": RECENT_S // 3600},
    }


def worker_line(row: dict[str, Any], samples: dict[tuple[int, int], dict[str, Any]]) -> dict[str, Any]:
    """A worker with a strip of its GPUs: busy (a task holds it), free or unhealthy, and measured use."""
    unhealthy = set(json.loads(row["unhealthy_indices"] or "[]"))
    busy = set(json.loads(row["busy_indices"] or "[]"))
    cells = []
    for index in range(row["gpus"]):
        state = "unhealthy" if index in unhealthy else "busy" if index in busy else "free"
        sample = samples.get((row["worker_id"], index))
        label = f"GPU {index}: {state}"
        utilization = None
        if sample is not None and sample["utilization_pct"] is not None:
            utilization = sample["utilization_pct"]
            label += f", {utilization:.0f} % utilized"
            if sample["memory_used_mb"] is not None and sample["memory_total_mb"]:
                label += f", {sample['memory_used_mb']:,} of {sample['memory_total_mb']:,} MB memory"
        cells.append(svg.Cell(state, utilization, label))
    title = f"{row['name']}: {len(busy)} of {row['gpus']} GPUs held by tasks" + (f", {len(unhealthy)} unhealthy" if unhealthy else "")
    strip = svg.gpu_strip(f"gpus-{row['worker_id']}", title, cells) if cells else Markup("")
    return {**row, "strip": strip, "busy_gpus": len(busy & set(range(row["gpus"]))), "unhealthy_count": len(unhealthy)}


def pictures(session: Session, now: float) -> dict[str, Any]:
    """The home page's pictures; one whose query is stopped (time limit) becomes a note, the rest still draw."""
    window = charts.last_day(now)
    out: dict[str, Any] = {"errors": {}}
    for name, draw in (
        ("tasks", lambda: charts.tasks_chart(session, window)),
        ("weeks", lambda: charts.project_weeks_chart(session, now)),
        ("idle", lambda: charts.idle_chart(session, now)),
        ("gpus", lambda: charts.gpu_charts(session, window)),
    ):
        try:
            out[name] = draw()
        except QueryError as e:
            out[name], out["errors"][name] = None, e.message
    return out


def job_extras(session: Session, job: dict[str, Any], now: float) -> dict[str, Any]:
    """A job page's additions: owner and project, command, counts of what it lists, its array summary, timeline."""
    counts = first(session.query(QUERIES["page_job_counts"].sql, {"job_id": job["job_id"], "cap": COUNT_CAP}))
    array = None
    if (job["array_size"] or job["width"]) > 1:
        ranges = session.query(QUERIES["page_job_array"].sql, {"job_id": job["job_id"], "limit": ARRAY_RANGES})
        array = array_summary(row_dicts(ranges))
    timeline, marks, marks_cut = charts.job_timeline(session, job, now)
    return {
        "command_text": command_text(job["command"]),
        "counts": counts or {},
        "array": array,
        "timeline": timeline,
        "marks": marks,
        "marks_cut": marks_cut,
    }


def worker_extras(session: Session, worker: dict[str, Any], now: float, task_limit: int) -> dict[str, Any]:
    """A worker page's additions: its GPUs (health, latest sample), their use over the last day, its tasks."""
    params = {"worker_id": worker["worker_id"], "now": now, "window": SAMPLE_WINDOW_S}
    gpus = row_dicts(session.query(QUERIES["page_worker_gpus"].sql, params))
    latest: dict[int, dict[str, Any]] = {}
    if charts.has_table(session, charts.SAMPLES_TABLE):
        latest = {r["gpu_index"]: r for r in row_dicts(session.query(QUERIES["page_worker_latest_samples"].sql, params))}
    for gpu in gpus:
        gpu["sample"] = latest.get(gpu["gpu_index"])
    tasks = session.query(QUERIES["page_worker_tasks"].sql, {**params, "limit": task_limit})
    return {"gpus": gpus, "chart": charts.worker_gpus_chart(session, worker, charts.last_day(now)), "tasks": tasks,
            "sample_window_s": SAMPLE_WINDOW_S}


def array_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per state: how many elements, and their index ranges as text ('0-9, 15, 20-99999')."""
    states: dict[str, dict[str, Any]] = {}
    for row in rows:
        entry = states.setdefault(row["state"], {"state": row["state"], "elements": row["in_state"], "ranges": [], "range_count": row["ranges"]})
        first_index, last_index = row["first_index"], row["last_index"]
        entry["ranges"].append(str(first_index) if first_index == last_index else f"{first_index}-{last_index}")
    for entry in states.values():
        entry["more_ranges"] = entry["range_count"] - len(entry["ranges"])
    return list(states.values())
