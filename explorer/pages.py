"""The explorer's falcon resources: parse the request, run named queries, render.

Every page answers HTML; tables, the SQL page and canned queries also answer
`.json` and `.csv`. Errors go through `handle_error`, one shape per format.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import falcon
import jinja2

from . import browse, fleet, render
from .queries import CANNED, QUERIES, param_defaults
from gpulayer.server.store.readonly_sql import SQLITE_INTEGERS, QueryError, ReadOnlyDatabase, Result, first, row_dicts

DATA_FORMATS = ("json", "csv")
LOG_TAIL_LINES = 200
JOB_PAGE_ROWS = 200   # tasks and events a job page lists; it links the paged table pages for the rest
WORKER_PAGE_TASKS = 100  # the ended tasks a worker page lists (with every one it runs now)
COUNT_TIME_LIMIT_S = 0.25  # the index page counts every table; a big one shows "many" instead


class ExplorerError(Exception):
    """An answer other than 200, with a message for people."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Context:
    """What every resource needs, injected by create_app."""

    db: ReadOnlyDatabase
    env: jinja2.Environment
    links: render.Links
    clock: Callable[[], float]
    auth_enabled: bool

    def __post_init__(self) -> None:
        # Globals, not render arguments: imported macros see them too.
        self.env.globals.update(links=self.links, cell=self.cell, labels_of=render.labels_of,
                                gpu_models=render.gpu_models, isolation=render.isolation, auth_enabled=self.auth_enabled, canned=CANNED,
                                capped=fleet.capped)

    def html(self, resp: falcon.Response, template: str, status: str = falcon.HTTP_200, **data: Any) -> None:
        resp.status = status
        resp.content_type = falcon.MEDIA_HTML
        resp.text = self.env.get_template(template).render(**data)

    def data_urls(self, path: str, params: dict[str, Any]) -> dict[str, str]:
        """{'json': url, 'csv': url} for the same query as `path` with `params`."""
        return {fmt: self.links(f"{path}.{fmt}", **params) for fmt in DATA_FORMATS}

    def cell(self, column: str, value: Any, relation: str | None = None) -> Any:
        return render.cell(self.links, column, value, relation)


def split_format(name: str) -> tuple[str, str]:
    """'jobs.json' -> ('jobs', 'json'); no known suffix -> (name, 'html')."""
    stem, dot, suffix = name.rpartition(".")
    if dot and suffix in DATA_FORMATS:
        return stem, suffix
    return name, "html"


def request_format(req: falcon.Request) -> str:
    return split_format(req.path)[1]


def send_data(resp: falcon.Response, fmt: str, columns: list[str], rows: list[tuple], **extra: Any) -> None:
    """A result as JSON (`{"ok": true, "columns", "rows", ...}`) or CSV."""
    if fmt == "csv":
        resp.content_type = "text/csv; charset=utf-8"
        resp.text = render.csv_body(columns, rows)
    else:
        resp.content_type = falcon.MEDIA_JSON
        resp.text = render.json_body({"ok": True, "columns": columns, "rows": rows, **extra})


def handler_for(ctx: Context) -> Callable[..., None]:
    """The one error handler: JSON and CSV get `{"ok": false, "error"}`, HTML a page."""

    def handle_error(req: falcon.Request, resp: falcon.Response, error: Exception, params: dict) -> None:
        if isinstance(error, ExplorerError):
            status, message = error.status, error.message
        elif isinstance(error, (QueryError, browse.BadRequest)):
            status, message = falcon.HTTP_400, str(error)
        else:
            raise error
        if request_format(req) in DATA_FORMATS:
            resp.status = status
            resp.content_type = falcon.MEDIA_JSON
            resp.text = render.json_body({"ok": False, "error": message})
        else:
            ctx.html(resp, "error.html", status, title=status, message=message,
                     error=error if isinstance(error, QueryError) else None)

    return handle_error


def bind(req: falcon.Request, names: list[str], now: float) -> tuple[dict[str, Any], dict[str, str]]:
    """Values for named parameters from the query string: (to bind, as typed in the form).

    Numbers are bound as numbers; `now`, `since`, `until` left empty get
    their defaults (param_defaults).
    """
    defaults = param_defaults(now)
    values: dict[str, Any] = {}
    typed: dict[str, str] = {}
    for name in names:
        text = req.get_param(name) or ""
        typed[name] = text
        if text == "" and name in defaults:
            values[name] = defaults[name]
            typed[name] = f"{defaults[name]:.0f}"
        else:
            values[name] = _number_or_text(text) if text != "" else None
    return values, typed


def _number_or_text(text: str) -> Any:
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


class HomePage:
    """`/`: the fleet for people: jobs now and lately ended, workers and their GPUs, quotas, pictures."""

    def __init__(self, ctx: Context):
        self.ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        now = self.ctx.clock()
        with self.ctx.db.session() as session:
            facts = fleet.home(session, now)
            pictures = fleet.pictures(session, now)
        self.ctx.html(resp, "home.html", title="Fleet", now=now, pictures=pictures, **facts)


class TablesPage:
    """`/-/tables`: every table and view with its row count, the canned queries, a SQL form."""

    def __init__(self, ctx: Context):
        self.ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        with self.ctx.db.session() as session:
            found = browse.relations(session)
            counts = {name: browse.count(session, name, COUNT_TIME_LIMIT_S) for name in found}
        self.ctx.html(resp, "index.html", title="GPUlayer state", relations=found, counts=counts)


class TablePage:
    """`/{table}` (+ `.json`, `.csv`): rows with filters, sorting and `_next` paging."""

    def __init__(self, ctx: Context):
        self.ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response, table: str) -> None:
        name, fmt = split_format(table)
        params = {k: (v[-1] if isinstance(v, list) else v) for k, v in req.params.items()}
        if "_filter_column" in params or params.get("_sort") == "":
            raise falcon.HTTPSeeOther(self.ctx.links.relation(name, "", _from_form(params)))
        with self.ctx.db.session() as session:
            relation = browse.describe(session, name)
            if relation is None:
                raise ExplorerError(falcon.HTTP_404, f"no table or view named {name!r}")
            request = browse.parse_browse(relation, params, self.ctx.db.max_rows)
            columns, rows, token = browse.page(session, relation, request)
        next_url = self.ctx.links.relation(name, "" if fmt == "html" else f".{fmt}",
                                           {**params, "_next": token}) if token else None
        if fmt in DATA_FORMATS:
            send_data(resp, fmt, columns, rows, table=name, truncated=token is not None,
                      next=token, next_url=next_url)
            return
        filters = {k: v for k, v in params.items() if not k.startswith("_")}
        sort_links = {c: self.ctx.links.relation(name, "", {**filters, **_sort_toggle(request, c)}) for c in columns}
        self.ctx.html(resp, "table.html", title=name, relation=relation, request=request, columns=columns,
                      rows=rows, next_url=next_url, params=params, filters=list(filters.items()),
                      sort_links=sort_links)


def _sort_toggle(request: browse.Browse, column: str) -> dict[str, str]:
    """Sort by `column`; a second click on the sorted column reverses it."""
    if request.sort == column and not request.desc:
        return {"_sort_desc": column}
    return {"_sort": column}


def _from_form(params: dict[str, str]) -> dict[str, str]:
    """The table page's filter form (`_filter_column`, `_filter_value`) as `column=value`."""
    clean = {k: v for k, v in params.items() if k not in ("_filter_column", "_filter_value", "_next") and v != ""}
    column = params.get("_filter_column")
    if column and params.get("_filter_value", "") != "":
        clean[column] = params["_filter_value"]
    return clean


class QueryPage:
    """`/-/query` (+ `.json`, `.csv`): any one read-only statement, `:named` parameters as fields."""

    def __init__(self, ctx: Context):
        self.ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        fmt = request_format(req)
        sql = req.get_param("sql") or ""
        if fmt in DATA_FORMATS and not sql.strip():
            raise ExplorerError(falcon.HTTP_400, "give the query as ?sql=...")
        typed: dict = {}
        result, error, elapsed = None, None, 0.0
        with self.ctx.db.session() as session:
            try:
                if sql.strip():
                    values, typed = bind(req, session.parameters(sql), self.ctx.clock())
                    started = time.monotonic()
                    result = session.query(sql, values)
                    elapsed = time.monotonic() - started
                    if fmt in DATA_FORMATS:  # (sql is never empty there)
                        send_data(resp, fmt, result.columns, result.rows, truncated=result.truncated)
                        return
            except QueryError as e:
                if fmt in DATA_FORMATS:
                    raise
                error = e
        self.ctx.html(resp, "query.html", falcon.HTTP_400 if error else falcon.HTTP_200,
                      title="SQL", sql=sql, params=typed, result=result, error=error, elapsed=elapsed,
                      max_rows=self.ctx.db.max_rows, action=self.ctx.links("/-/query"), query=None,
                      data_urls=self.ctx.data_urls("/-/query", {"sql": sql, **typed}))


class CannedPage:
    """`/-/queries/{name}` (+ `.json`, `.csv`): a query from queries.sql."""

    def __init__(self, ctx: Context):
        self.ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        name, fmt = split_format(name)
        query = CANNED.get(name)
        if query is None:
            raise ExplorerError(falcon.HTTP_404, f"no canned query named {name!r}")
        with self.ctx.db.session() as session:
            values, typed = bind(req, session.parameters(query.sql), self.ctx.clock())
            started = time.monotonic()
            result = session.query(query.sql, values)
            elapsed = time.monotonic() - started
        if fmt in DATA_FORMATS:
            send_data(resp, fmt, result.columns, result.rows, truncated=result.truncated, query=name)
            return
        self.ctx.html(resp, "query.html", title=name, sql=query.sql, params=typed, result=result, error=None,
                      elapsed=elapsed, max_rows=self.ctx.db.max_rows, query=query,
                      action=self.ctx.links(f"/-/queries/{name}"),
                      data_urls=self.ctx.data_urls(f"/-/queries/{name}", typed))


class WorkersPage:
    """`/-/workers`: attached workers, what they use and have free, and queued tasks none can take."""

    def __init__(self, ctx: Context):
        self.ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        with self.ctx.db.session() as session:
            workers = row_dicts(session.query(QUERIES["page_workers"].sql))
            unmatched = session.query(QUERIES["page_unmatched_tasks"].sql)
            provisioning = session.query(QUERIES["page_provision_requests"].sql)
        self.ctx.html(resp, "workers.html", title="Workers", workers=workers, unmatched=unmatched,
                      provisioning=provisioning)


class WorkerPage:
    """`/-/workers/{worker_id}`: one worker: what it has and uses, its cordon, its GPUs (health, latest sample, use
    over the last day from gpu_samples) and the tasks it runs and ran."""

    def __init__(self, ctx: Context):
        self.ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response, worker_id: int) -> None:
        if worker_id not in SQLITE_INTEGERS:
            raise ExplorerError(falcon.HTTP_404, f"no worker {worker_id}")
        now = self.ctx.clock()
        with self.ctx.db.session() as session:
            worker = first(session.query(QUERIES["page_worker"].sql, {"worker_id": worker_id}))
            if worker is None:
                raise ExplorerError(falcon.HTTP_404, f"no worker {worker_id}")
            extras = fleet.worker_extras(session, worker, now, WORKER_PAGE_TASKS)
        self.ctx.html(resp, "worker.html", title=f"Worker {worker['name']}", worker=worker,
                      task_limit=WORKER_PAGE_TASKS, **extras)


class JobPage:
    """`/-/jobs/{job_id}`: the job, its tasks, endpoints, replicas over time, events and the tail of its logs."""

    def __init__(self, ctx: Context):
        self.ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response, job_id: int) -> None:
        if job_id not in SQLITE_INTEGERS:
            raise ExplorerError(falcon.HTTP_404, f"no job {job_id}")
        params = {"job_id": job_id}
        with self.ctx.db.session() as session:
            job = first(session.query(QUERIES["page_job"].sql, params))
            if job is None:
                raise ExplorerError(falcon.HTTP_404, f"no job {job_id}")
            sections: dict[str, Result] = {
                "tasks": session.query(QUERIES["page_job_tasks"].sql, params, max_rows=JOB_PAGE_ROWS),
                "endpoints": session.query(QUERIES["page_job_endpoints"].sql, params),
                "scaling": session.query(QUERIES["page_job_scaling"].sql, params, max_rows=JOB_PAGE_ROWS),
                "events": session.query(QUERIES["job_timeline"].sql, params, max_rows=JOB_PAGE_ROWS),
            }
            logs = session.query(QUERIES["page_job_logs"].sql, {**params, "limit": LOG_TAIL_LINES})
            extras = fleet.job_extras(session, job, self.ctx.clock())
        self.ctx.html(resp, "job.html", title=f"Job {job_id}", job=job, sections=sections,
                      logs=row_dicts(logs), log_tail=LOG_TAIL_LINES, max_rows=self.ctx.db.max_rows, **extras)


class Stylesheet:
    """`/-/static/app.css`."""

    def __init__(self, css: bytes):
        self.css = css

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = "text/css; charset=utf-8"
        resp.cache_control = ["max-age=300"]
        resp.data = self.css
