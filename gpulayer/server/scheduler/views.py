"""How jobs read: one job, a page of jobs, a log page, outputs, events, endpoints; as their caller may see them.

Every route that answers a Job (`GET /v1/jobs`, `GET /v1/jobs/{id}`, submit and
cancel's answers) renders it here, and what a caller may only see of it
(`redact`, `hide_unseen`) is applied here, in the read transaction its caller
opens: `job` answers `GET /v1/jobs/{id}` in one. Who may see, read or manage a
job is teams.py's (`check_job`, `level`, `unseen`); nothing here writes.
"""
from __future__ import annotations

import datetime
import json

import apsw

from gpulayer.server.errors import NotFound
from gpulayer.server.scheduler import autoscale, outcomes, teams, waiting
from gpulayer.server.store.queries import PAGE_BYTES, page, row, rows

ARRAY_TASKS_SHOWN = 100     # an array's job view lists at most this many tasks (active first, then failed)
ARRAY_FAILED_SHOWN = 1000   # and at most this many failed indices
PREEMPTIONS_SHOWN = 100     # a job view lists its latest preemptions, at most this many
HIDDEN_SPEC = ("env", "command", "files", "outputs", "source", "inputs")  # what a `see` view leaves out
HIDDEN_TASK = ("endpoint", "address", "restart_message")                  # blanked (None) per task


# -- one job -------------------------------------------------------------------

def job(conn: apsw.Connection, principal, job_id: int, index: int | None = None) -> dict:
    """`GET /v1/jobs/{id}` (and cancel's answer): the job as `principal` may see it, in the caller's one read.

    Raises NotFound when the caller may not see it (or there is none), or it has no element `index`."""
    meta = teams.check_job(conn, principal, job_id, "see")
    return hide_unseen(conn, principal, [apply_meta(render(conn, job_id, index), meta)])[0]


def render(conn: apsw.Connection, job_id: int, index: int | None = None) -> dict:
    """The Job as the API returns it, before ownership (NotFound when there is none); `index`: only that
    element's (replica's, rank's) tasks."""
    found = row(conn, "get_job", job_id=job_id)
    if found is None:
        raise NotFound(f"no job {job_id}")
    # its tasks stopped to make room for other work (docs/teams.md), oldest first
    return {**_render(conn, found, index),
            "preemptions": rows(conn, "job_preemptions", job_id=job_id, limit=PREEMPTIONS_SHOWN),
            "scaling": autoscale.view(conn, found)}


def rendered_for(conn: apsw.Connection, principal, job_id: int) -> dict:
    """render with its owner and project, as `principal` may see it (submit's answer)."""
    return annotate(conn, [render(conn, job_id)], principal)[0]


def _no_element(found: dict, index: int) -> NotFound:
    return NotFound(f"job {found['id']} has no {'element' if found['array_size'] else 'task with index'} {index}")


def _element_tasks(conn: apsw.Connection, found: dict, index: int) -> list[dict]:
    """The tasks of element (replica, rank) `index` of the job row `found`, newest attempt first; NotFound
    when it has none."""
    tasks = rows(conn, "element_tasks", job_id=found["id"], index=index)
    if not tasks:
        raise _no_element(found, index)
    return tasks


def _render(conn: apsw.Connection, found: dict, index: int | None = None) -> dict:
    tasks = _element_tasks(conn, found, index) if index is not None else None
    array, ended = _array_view(conn, found) if found["array_size"] is not None else (None, False)
    if index is None and array is not None:  # an array lists what runs and what failed; `array` counts them all
        tasks = rows(conn, "array_tasks_shown", job_id=found["id"], limit=ARRAY_TASKS_SHOWN,
                     ended_limit=ARRAY_TASKS_SHOWN if ended else 0)
    elif index is None:
        tasks = rows(conn, "job_tasks", job_id=found["id"])
    shown = [_task_view(conn, t) for t in tasks or []]
    after = rows(conn, "job_dependencies_of", job_id=found["id"])
    return {"id": found["id"], "name": found["name"], "state": found["state"], "kind": found["kind"],
            "attempt": found["attempt"], "revision": found["revision"],
            "created_at": found["created_at"], "finished_at": found["finished_at"],
            "exit_code": found["exit_code"], "reason": found["reason"],
            "waiting_reason": waiting_reason(conn, found, shown, after),
            "reservation": reservation(conn, found["id"]),
            "spec": json.loads(found["spec"]), "tasks": shown,
            "array": array,
            "after": after}


def reservation(conn: apsw.Connection, job_id: int) -> dict | None:
    """The room a waiting job holds from a time to come (EASY backfill, reservations.py): {workers (names),
    start_at (Unix time)}, or None."""
    held = rows(conn, "job_reservation", job_id=job_id)
    return {"workers": [r["name"] for r in held], "start_at": held[0]["start_at"]} if held else None


def _task_view(conn: apsw.Connection, task: dict) -> dict:
    task = dict(task)
    task["outputs"] = json.loads(task["outputs"])
    task["index"] = task.pop("index")
    # its device indices while it holds them, and a fractional task's share of its GPU (0: whole GPUs)
    task["gpus"] = json.loads(task.pop("gpu_indices")) if task["state"] in ("assigned", "running") else []
    restarted = task["restarts"] and task["state"] == "running"
    found = row(conn, "task_restart_message", task_id=task["task_id"]) if restarted else None
    task["restart_message"] = found["text"] if found else None
    return task


def _array_view(conn: apsw.Connection, found: dict) -> tuple[dict, bool]:
    """An array's progress: its elements counted by the state of their latest task, when the first
    started, and those that did not succeed (the cancelled ones among them named apart); and whether
    any of its tasks ended without success (a retried one included)."""
    counted = rows(conn, "array_counts", job_id=found["id"])
    counts = {r["state"]: r["n"] for r in counted if r["n"] > 0}
    unsuccessful = sum(counts.get(s, 0) for s in ("failed", "cancelled", "lost"))
    # none counted: the indices are not looked for (a walk of every task of the array)
    failed = rows(conn, "array_failed_indices", job_id=found["id"], limit=ARRAY_FAILED_SHOWN) if unsuccessful else []
    view = {"indices": json.loads(found["spec"])["array"], "size": found["array_size"],
            "max_running": found["max_running"], "counts": counts, "done": counts.get("succeeded", 0) + unsuccessful,
            "started_at": min((r["started_at"] for r in counted if r["started_at"] is not None), default=None),
            "failed_indices": [f["index"] for f in failed],
            "cancelled_indices": [f["index"] for f in failed if f["state"] == "cancelled"]}
    return view, bool(unsuccessful) or any(r["replaced"] for r in counted)


def waiting_reason(conn: apsw.Connection, found: dict, tasks: list[dict] | None = None, after: list[dict] | None = None) -> str | None:
    """Why a queued job (the row `found`) is not placed: what no online worker has (labels, size, secrets'
    labels), else that the workers that fit are busy; None when a worker could take it now.

    A running job with a task in the queue is told the same way, for that task:
    a service's replica back in the queue (`tasks`, the rendered tasks), an
    array's element released but not placed (one held by the array's %N cap
    waits for nothing to be told). `after`: its job_dependencies_of rows, when read already.
    """
    if found["state"] in outcomes.ACTIVE_JOB and found["reason"] is not None:
        return f"being cancelled ({found['reason']}): its tasks end in batches"  # outcomes.end_step
    if found.get("hold"):  # job hold / submit --hold (jobcontrol.py): an array's running elements go on
        return "held: it starts once released (`gpulayer job release`)"
    if found["state"] == "waiting" and found.get("begin_at") is not None:
        when = datetime.datetime.fromtimestamp(found["begin_at"], datetime.timezone.utc)
        return f"begin_time: it starts at {when.isoformat(timespec='seconds').replace('+00:00', 'Z')} (--begin)"
    if found["state"] == "waiting":
        return _dependencies_reason(after if after is not None else
                                    rows(conn, "job_dependencies_of", job_id=found["id"]))
    if found["state"] == "running":
        if not _task_in_queue(conn, found, tasks or []):
            return None
    elif found["state"] != "queued":
        return None
    facts = waiting.facts(conn, found["id"])
    if facts and facts["why"]:
        return waiting.unplaced(facts)
    held = waiting.held_back(row(conn, "job_quota_reason", job_id=found["id"]))  # a project's quota, a user's limit
    return held or (waiting.busy(facts, reservation(conn, found["id"])) if facts and facts["busy"] else None)


def _dependencies_reason(after: list[dict]) -> str:
    """What a waiting job waits for (`after`: its job_dependencies_of rows): "for job 41 to succeed", "for job
    41 to succeed and job 42 to end"."""
    verbs = {"ok": "succeed", "notok": "fail", "any": "end"}
    open_ = [f"job {d['job']} to {verbs[d['condition']]}" for d in after if d["state"] in outcomes.ACTIVE_JOB]
    return "for " + " and ".join(open_) if open_ else "for its dependencies"


def _task_in_queue(conn: apsw.Connection, found: dict, tasks: list[dict]) -> bool:
    """Whether a running job has a task in the queue: an array's released element, a service's replica."""
    if found["array_size"] is not None:  # its view lists no queued element: asked of the state file
        return row(conn, "array_element_released", job_id=found["id"]) is not None
    return found["kind"] == "service" and any(t["state"] == "queued" and t["attempt"] == found["attempt"]
                                              for t in tasks)


# -- a page of jobs --------------------------------------------------------------

def listing(conn: apsw.Connection, principal, filters: dict, limit: int, before: int | None) -> tuple[list[dict], bool]:
    """`GET /v1/jobs`: a page of jobs newest first as `principal` may see them, and whether older ones follow,
    in one read. `filters`: `state`, `name` (a glob), `since` (created at or after, Unix seconds) and whose jobs
    (`user`, `project`, `all`: list_scope)."""
    scope = list_scope(conn, principal, user=filters.get("user"), project=filters.get("project"),
                       everything=bool(filters.get("all")))
    found, more = listing_page(conn, filters.get("state"), limit, before, scope, name=filters.get("name"),
                               since=filters.get("since"))
    return annotate(conn, found, principal), more


def list_scope(conn: apsw.Connection, principal, *, user: str | None, project: str | None, everything: bool) -> dict:
    """list_jobs' filters: your own jobs by default; `user`, `project`, or `everything` you may see."""
    scope: dict = {"owner_id": None, "project_id": None, "viewer_id": None if principal.admin else principal.user_id}
    if user is not None:
        found = row(conn, "user_by_name", name=user)
        scope["owner_id"] = found["id"] if found else -1   # no such user: no jobs (names do not leak)
    if project is not None:
        found = row(conn, "project_by_name", name=project)
        scope["project_id"] = found["id"] if found else -1
    if user is None and project is None and not everything:
        scope["owner_id"] = principal.user_id
    return scope


def listing_page(conn: apsw.Connection, state: str | None, limit: int, before: int | None, scope: dict | None = None,
                 budget: int = PAGE_BYTES, *, name: str | None = None,
                 since: float | None = None) -> tuple[list[dict], bool]:
    """A page of jobs newest first (at most `limit`, rendered until their JSON reaches `budget`), and whether
    older ones follow; `scope` (list_scope): whose jobs, and what the caller may see; `name`: a glob
    (glob_pattern), `since`: created at or after."""
    scope = scope or {"owner_id": None, "project_id": None, "viewer_id": None}
    query = "list_jobs" if scope["owner_id"] is None else "list_jobs_of_owner"  # one user's: its index alone
    found, more = page(conn, query, limit, budget, state=state, before=before,
                       name=None if name is None else glob_pattern(name), since=since, **scope)
    shown: list[dict] = []
    size = 0
    for found_job in found:
        if size >= budget:  # each job renders its tasks: the page is cut by what it renders, not its rows
            return shown, True
        shown.append(_render(conn, found_job))
        size += len(json.dumps(shown[-1]))
    return shown, more


def glob_pattern(name: str) -> str:
    """A shell glob as fnmatch reads it (`sweep-*`, `run-?`, `[ab]*`, `[!x]*`), written for SQLite's GLOB so
    that both match the same names: `[!` negates in fnmatch, `[^` in GLOB; a set that starts with `^` is
    literal in fnmatch (so the `^` moves to its end); a `[` that no `]` closes is literal in fnmatch (`[[]`).
    (A reversed range, `[z-a]`, matches nothing in fnmatch and its first end in GLOB.)"""
    out, i = [], 0
    while i < len(name):
        end = _set_end(name, i) if name[i] == "[" else -1
        if name[i] != "[":
            out.append(name[i])
        elif end < 0:
            out.append("[[]")
        else:
            members = name[i + 1:end]
            if members.startswith("!"):
                members = "^" + members[1:]
            elif members.startswith("^"):
                members = members.lstrip("^") + "^" if members.lstrip("^") else ""
            out.append(f"[{members}]" if members else "^")
            i = end
        i += 1
    return "".join(out)


def _set_end(name: str, start: int) -> int:
    """Where the set opened at `start` closes, as fnmatch reads it (a `]` right after `[` or `[!` is a
    member); -1 when nothing closes it."""
    i = start + 1
    if i < len(name) and name[i] == "!":
        i += 1
    if i < len(name) and name[i] == "]":
        i += 1
    return name.find("]", i)


# -- logs, outputs, events, endpoints ----------------------------------------------

def log_page(conn: apsw.Connection, job_id: int, after: int, limit: int, index: int | None = None) -> tuple[list[dict], bool]:
    """Log lines of a job after sequence number `after` (`index`: of that element, replica or rank alone), at
    most `limit` and about PAGE_BYTES of text; and whether the job (that element) had ended with this page
    its last: no more lines will come. One snapshot, so no line is written between the two.

    Raises NotFound when there is no such job (or element)."""
    found = row(conn, "get_job", job_id=job_id)
    if found is None:
        raise NotFound(f"no job {job_id}")
    ended = found["finished_at"] is not None
    if index is not None:
        latest = _element_tasks(conn, found, index)[0]
        ended = ended or latest["finished_at"] is not None
        lines, more = page(conn, "element_logs", limit, job_id=job_id, index=index, after=after)
    else:
        lines, more = page(conn, "job_logs", limit, job_id=job_id, after=after)
    return lines, ended and not more


def outputs(conn: apsw.Connection, job_id: int, index: int | None = None) -> dict:
    """`GET /v1/jobs/{id}/outputs`: {path: digest} collected by the job's succeeded tasks (latest attempt wins)
    in `outputs`; `index`: of that element (replica, rank) alone; an array's, without `index`, also each
    element's own in `elements`. Raises NotFound when there is no such job (or element)."""
    found = row(conn, "get_job", job_id=job_id)
    if found is None:
        raise NotFound(f"no job {job_id}")
    tasks = rows(conn, "job_tasks", job_id=job_id) if index is None else _element_tasks(conn, found, index)
    merged: dict[str, str] = {}
    for task in reversed(tasks):
        if task["state"] == "succeeded":
            merged.update(json.loads(task["outputs"]))
    answer: dict = {"outputs": merged}
    if index is None and found["array_size"] is not None:  # elements that write the same path keep their own file
        answer["elements"] = _element_outputs(tasks)
    return answer


def _element_outputs(tasks: list[dict]) -> dict[str, dict[str, str]]:
    """An array's outputs by element: {index (as text, a JSON key): {path: digest}}, each element's latest
    succeeded task's (`tasks`: job_tasks)."""
    found: dict[str, dict[str, str]] = {}
    for task in reversed(tasks):
        if task["state"] == "succeeded" and task["outputs"] not in (None, "{}"):
            found.setdefault(str(task["index"]), {}).update(json.loads(task["outputs"]))
    return found


def endpoints(conn: apsw.Connection, job_id: int) -> dict:
    """The current attempt's replica endpoints; ready when every replica has one.

    Only a running service serves: once the job has ended (cancelled, a replica
    ended for good) the list is empty, even while its workers are still
    stopping replicas that have not cleared their endpoint yet.
    """
    found = row(conn, "get_job", job_id=job_id)
    if found is None:
        raise NotFound(f"no job {job_id}")
    if found["state"] != "running":
        return {"endpoints": [], "ready": False}
    replicas = rows(conn, "job_endpoints", job_id=job_id)
    serving = [r["endpoint"] for r in replicas if r["endpoint"] and r["state"] == "running"]
    return {"endpoints": serving, "ready": bool(replicas) and len(serving) == len(replicas)}


def events_page(conn: apsw.Connection, job_id: int, after: int, limit: int, budget: int = PAGE_BYTES) -> tuple[list[dict], bool]:
    """A job's events after the sequence number `after`, oldest first: at most `limit` (-1: all) and about
    `budget` bytes, and whether more follow. Raises NotFound when there is no such job."""
    if row(conn, "get_job", job_id=job_id) is None:
        raise NotFound(f"no job {job_id}")
    if limit < 0:
        found, more = rows(conn, "job_events", job_id=job_id, after=after, limit=-1), False
    else:
        found, more = page(conn, "job_events", limit, budget, job_id=job_id, after=after)
    return [{**e, "data": json.loads(e["data"])} for e in found], more


def events_seen(conn: apsw.Connection, principal, job_id: int, after: int, limit: int, level: str) -> tuple[list[dict], bool]:
    """`GET /v1/jobs/{id}/events`: events_page as `principal` may see it, its `level` on the job
    (teams.job_meta): what names a job it may not see made null (hide_unseen_events), and with `see`
    no endpoint or address (redact_events)."""
    found, more = events_page(conn, job_id, after, limit)
    found = hide_unseen_events(conn, principal, found)
    return (redact_events(found) if level == "see" else found), more


# -- what a caller may see -------------------------------------------------------

def apply_meta(rendered: dict, meta: dict) -> dict:
    """A rendered job with job_meta's owner and project, redacted when the caller may only see it."""
    rendered["owner"], rendered["project"] = meta["owner"], meta["project"]
    return redact(rendered) if meta["level"] == "see" else rendered


def annotate(conn: apsw.Connection, rendered: list[dict], principal=None) -> list[dict]:
    """Add `owner` and `project` (names) to rendered jobs; hide what `principal` may only see (redact)."""
    if not rendered:
        return rendered
    names = {r["id"]: r for r in rows(conn, "job_owners", ids=json.dumps([j["id"] for j in rendered]),
                                      user_id=getattr(principal, "user_id", None))}
    for shown in rendered:
        found = names.get(shown["id"])
        shown["owner"], shown["project"] = (found["owner"], found["project"]) if found else (None, None)
        if principal is not None and teams.level(principal, found) == "see":
            redact(shown)
    return hide_unseen(conn, principal, rendered) if principal is not None else rendered


def hide_unseen(conn: apsw.Connection, principal, rendered: list[dict]) -> list[dict]:
    """What rendered jobs say of other jobs the caller may not see (as for GET /v1/jobs/{id}), made null: in
    `after`, such a job's name and state (its id and the condition stay: they are the viewed job's own spec);
    in `preemptions`, the job and task a run was stopped for (another project's, say)."""
    ids = sorted({dep["job"] for shown in rendered for dep in shown.get("after") or []}
                 | {p["for_job_id"] for shown in rendered for p in shown.get("preemptions") or []})
    if not ids or principal.admin:
        return rendered
    unseen = teams.unseen(conn, principal, ids)
    for shown in rendered:
        for dep in shown.get("after") or []:
            if dep["job"] in unseen:
                dep["name"] = dep["state"] = None
        for pre in shown.get("preemptions") or []:
            if pre["for_job_id"] in unseen:
                pre["for_job_id"] = pre["for_task_id"] = None
    return rendered


def hide_unseen_events(conn: apsw.Connection, principal, found: list[dict]) -> list[dict]:
    """A job's events as the caller may see them: the job and task a preemption was for (for_job_id,
    for_task_id: task_preempt_requested, task_preempted) and the final state of a dependency
    (dependency_failed) become null when the caller may not see that other job (hide_unseen's rule)."""
    ids = sorted({e["data"][key] for e in found for key in ("for_job_id", "after")
                  if isinstance(e["data"].get(key), int)})
    if not ids or principal.admin:
        return found
    unseen = teams.unseen(conn, principal, ids)
    for event in found:
        data = event["data"]
        if data.get("for_job_id") in unseen:
            data["for_job_id"] = data["for_task_id"] = None
        if event["kind"] == "dependency_failed" and data.get("after") in unseen:
            data["state"] = None
    return found


def redact(rendered: dict) -> dict:
    """What a project member who may only see a job gets: no env, command, code or data digests (source,
    inputs, service weights; artifacts are fetched by digest), outputs, endpoints or log line."""
    spec = rendered.get("spec")
    if isinstance(spec, dict):
        rendered["spec"] = {k: v for k, v in spec.items() if k not in HIDDEN_SPEC}
        if isinstance(spec.get("service"), dict):
            rendered["spec"]["service"] = {k: v for k, v in spec["service"].items() if k != "weights"}
    for task in rendered.get("tasks") or []:
        task["outputs"] = {}
        task.update({k: None for k in HIDDEN_TASK if k in task})
    rendered["redacted"] = True
    return rendered


def redact_events(found: list[dict]) -> list[dict]:
    """A job's events as one who may only see the job gets them: no endpoint (task_reported) or address."""
    for event in found:
        event["data"] = {k: v for k, v in event["data"].items() if k not in HIDDEN_TASK}
    return found

