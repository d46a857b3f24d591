"""Turning results into HTML (jinja2, autoescaped), JSON and CSV."""
from __future__ import annotations

import base64
import csv
import io
import json
import math
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from markupsafe import Markup, escape

TEMPLATES = Path(__file__).with_name("templates")

# Columns whose integer values link to a page: (column) or (relation, column).
JOB_ID_COLUMNS = frozenset({"job_id"})
JOB_ID_IN = {"jobs": "id"}
WORKER_ID_COLUMNS = frozenset({"worker_id"})
WORKER_ID_IN = {"workers": "id"}
RECORD_LINKS = {"task_id": "tasks"}
# host:port or [v6]:port: anything else an endpoint holds is shown, never linked.
_ENDPOINT = re.compile(r"^(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]):\d{1,5}$")


def environment() -> jinja2.Environment:
    """The template environment: autoescape on for every template."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = format_time
    env.filters["pretty_json"] = pretty_json
    return env


class Links:
    """Every URL of the explorer, under its base path."""

    def __init__(self, base_path: str):
        self.base = base_path.rstrip("/")

    def __call__(self, path: str = "/", **query: Any) -> str:
        params = {k: v for k, v in query.items() if v is not None}
        return self.base + path + ("?" + urlencode(params) if params else "")

    def job(self, job_id: Any) -> str:
        return self(f"/-/jobs/{job_id}")

    def worker(self, worker_id: Any) -> str:
        return self(f"/-/workers/{worker_id}")

    def relation(self, name: str, suffix: str = "", params: dict[str, Any] | None = None) -> str:
        return self(f"/{name}{suffix}", **(params or {}))


def cell(links: Links, column: str, value: Any, relation: str | None = None) -> Markup:
    """One value as HTML: job and worker ids link to their pages, times read as UTC."""
    if value is None:  # a job's name left out reads as such, not as SQL's null
        return Markup('<span class="null" title="submitted without --name">unnamed</span>' if column == "job_name"
                      else '<span class="null">null</span>')
    if isinstance(value, bytes):
        return Markup('<span class="null">&lt;{} bytes&gt;</span>').format(len(value))
    if isinstance(value, int) and not isinstance(value, bool):
        if column in JOB_ID_COLUMNS or JOB_ID_IN.get(relation or "") == column:
            return Markup('<a href="{}">{}</a>').format(links.job(value), value)
        if column in WORKER_ID_COLUMNS or WORKER_ID_IN.get(relation or "") == column:
            return Markup('<a href="{}">{}</a>').format(links.worker(value), value)
        if column in RECORD_LINKS and relation != RECORD_LINKS[column]:
            return Markup('<a href="{}">{}</a>').format(links.relation(RECORD_LINKS[column], params={"id": value}),
                                                        value)
    if column == "endpoint" and (url := endpoint_url(value)) is not None:
        return Markup('<a class="endpoint" href="{}">{}</a>').format(url, value)
    if isinstance(value, (int, float)) and _is_time(column):
        return Markup('<time title="{}">{}</time>').format(value, format_time(value))
    return escape(value)


def endpoint_url(endpoint: Any) -> str | None:
    """http://host:port/ for an endpoint that is a plain host:port, else None (shown as text)."""
    if isinstance(endpoint, str) and _ENDPOINT.match(endpoint):
        return f"http://{endpoint}/"
    return None


def _is_time(column: str) -> bool:
    return column == "at" or column.endswith("_at") or column.endswith("_since")


def format_time(value: Any) -> str:
    """Unix seconds as 'YYYY-MM-DD HH:MM:SS' UTC; anything else as it is."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return "" if value is None else str(value)
    try:
        return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return str(value)


def pretty_json(text: Any) -> str:
    """A JSON text indented, or the value unchanged when it is not JSON."""
    try:
        return json.dumps(json.loads(text), indent=2, sort_keys=True)
    except (TypeError, ValueError):
        return "" if text is None else str(text)


def labels_of(text: Any) -> list[str]:
    """A JSON labels object as ['key=value', ...]."""
    try:
        labels = json.loads(text)
    except (TypeError, ValueError):
        return []
    return [f"{k}={v}" for k, v in sorted(labels.items())] if isinstance(labels, dict) else []


def isolation(text: Any) -> str:
    """A worker's JSON `isolation` for people: 'bwrap as gpulayer-task', 'none: tasks are not sandboxed: ...',
    '' when its agent did not say (an older one)."""
    try:
        found = json.loads(text)
    except (TypeError, ValueError):
        return ""
    if not isinstance(found, dict) or not found.get("sandbox"):
        return ""
    said = str(found["sandbox"]) + (f" as {found['user']}" if found.get("user") else "")
    return said + (f": {found['warning']}" if found.get("warning") else "")


def gpu_models(text: Any) -> str:
    """A JSON list of GPU models as '8× H100', '' when there is none."""
    try:
        models = json.loads(text)
    except (TypeError, ValueError):
        return ""
    if not isinstance(models, list):
        return ""
    counts: dict[str, int] = {}
    for model in models:
        counts[str(model)] = counts.get(str(model), 0) + 1
    return ", ".join(f"{n}× {model}" for model, n in counts.items())


def _plain(value: Any) -> Any:
    """A SQLite value as JSON can carry it."""
    if isinstance(value, bytes):
        return {"$base64": True, "encoded": base64.b64encode(value).decode("ascii")}
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def json_body(payload: dict[str, Any]) -> str:
    """A JSON document; rows' values made JSON-safe."""
    if "rows" in payload:
        payload = {**payload, "rows": [[_plain(v) for v in row] for row in payload["rows"]]}
    return json.dumps(payload, ensure_ascii=False, allow_nan=False)


# A spreadsheet runs a cell that starts with one of these as a formula (CSV injection).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """A value as a CSV cell: text that a spreadsheet would run prefixed with `'`, blobs in base64.

    Numbers stay as they are (-1 is not a formula); text such as '-1' gets the quote too.
    Base64 is left exact: its alphabet cannot spell a call or a DDE link.
    """
    if value is None:
        return ""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def csv_body(columns: list[str], rows: list[tuple[Any, ...]]) -> str:
    """RFC 4180 CSV: a header line, CRLF line ends, quoted where needed, no cell a formula."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow([csv_cell(c) for c in columns])
    for row in rows:
        writer.writerow([csv_cell(v) for v in row])
    return out.getvalue()
