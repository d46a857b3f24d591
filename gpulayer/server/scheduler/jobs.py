"""Jobs: submit and cancel as transactions, and how a job reads on the wire."""
from __future__ import annotations

import json

from gpulayer.server.scheduler import events

from gpulayer.server.scheduler import outcomes, waiting
from gpulayer.server.errors import InvalidRequest, NotFound, TooManyQueued
from gpulayer.server.scheduler.spec import array_indices, referenced_digests
from gpulayer.server.store.queries import PAGE_BYTES, QUERIES, page, row, rows

ARRAY_TASKS_SHOWN = 100     # an array's job view lists at most this many tasks (active first, then failed)
ARRAY_FAILED_SHOWN = 1000   # and at most this many failed indices
PREEMPTIONS_SHOWN = 100     # a job view lists its latest preemptions, at most this many


def submit(conn, spec: dict, now: float, user_id: int = 1, project_id: int = 1) -> int:
    """Insert a validated (normalised) spec and its first attempt's tasks, owned by `user_id` in `project_id`
    (teams.submit_owner); returns the job id."""
    missing = [name for name in spec["secrets"]
               if row(conn, "get_secret", project_id=project_id, name=name) is None]
    if missing:
        raise InvalidRequest(f"secrets: no secret named {missing[0]!r} in the job's project "
                             "(set it with `gpulayer secret set --project`)",
                             code="unknown_secret")
    for digest in sorted(referenced_digests(spec)):
        if row(conn, "touch_artifact", digest=digest, now=now) is None:
            raise InvalidRequest(f"artifact {digest} is not stored on the control plane: upload it first "
                                 "(PUT /v1/artifacts/{digest})", code="unknown_artifact")
    after = [(dep, _dependency(conn, dep["job"])) for dep in spec.get("after") or []]
    waiting = any(state in outcomes.ACTIVE_JOB for _, state in after)
    service = spec["service"]
    width = service["replicas"] if service else spec["nodes"]
    indices = elements(spec)
    cap = spec.get("max_running")
    job_id = row(conn, "insert_job", name=spec["name"], spec=json.dumps(spec), kind="service" if service else "batch",
                 priority=spec["priority"], labels=json.dumps(spec["labels"]), secrets=json.dumps(spec["secrets"]),
                 accelerator=spec["accelerator"],
                 gpus=spec["gpus"], cpus=spec["cpus"], memory_mb=spec["memory_mb"], width=width,
                 gang=int(spec["nodes"] > 1), max_attempts=spec["retry"]["max_attempts"],
                 retry_on=json.dumps(spec["retry"]["retry_on"]), now=now, state="waiting" if waiting else "queued",
                 array_size=len(indices) if spec.get("array") else None, max_running=cap,
                 user_id=user_id, project_id=project_id, preemptible=int(spec["preemptible"]))["id"]
    if len(indices) <= outcomes.BATCH:  # one statement for every task; held ones stay out of task_queue
        conn.execute(QUERIES["insert_tasks"], {"job_id": job_id, "indices": json.dumps(indices), "now": now,
                                               "priority": spec["priority"], "offset": 0,
                                               "released": 0 if waiting else (cap or len(indices))})
    else:  # a big array: BATCH elements a write, all held until the last is in (outcomes.insert_step)
        outcomes.insert_step(conn, now, job_id, 0)
    for dep, _ in after:
        row(conn, "insert_dependency", job_id=job_id, after_job_id=dep["job"], condition=dep["condition"])
    extra: dict = {"array_size": len(indices)} if spec.get("array") else {}
    if waiting:
        extra["waiting_for"] = [dep["job"] for dep, state in after if state in outcomes.ACTIVE_JOB]
    events.record(conn, now, "job_submitted", job_id=job_id, name=spec["name"], width=width, **extra)
    failed = next(((dep, state) for dep, state in after
                   if state not in outcomes.ACTIVE_JOB and not outcomes.dependency_met(dep["condition"], state)), None)
    if failed is not None:  # it can never run: cancelled at once, as if that dependency had just ended
        outcomes.cancel_dependent(conn, now, job_id, failed[0]["job"], failed[1], first_step=True)
    return job_id


def elements(spec: dict) -> list[int]:
    """The indices of a validated spec's tasks: an array's elements, else its replicas or ranks."""
    if spec.get("array"):
        return array_indices(spec["array"])
    return list(range(spec["service"]["replicas"] if spec["service"] else spec["nodes"]))


def check_queued_elements(conn, user: str, user_id: int, adding: int, cap: int) -> None:
    """TooManyQueued when the user's tasks not yet ended (queued, held, running; of jobs not being
    cancelled) and the `adding` of a new job would pass `cap` (counted up to just past the cap)."""
    found = row(conn, "user_queued_elements", user_id=user_id, limit=cap + 1)["n"]
    if found + adding > cap:
        shown = f"{found:,}" if found <= cap else f"more than {cap:,}"
        raise TooManyQueued(f"user {user} has {shown} tasks (array elements) not yet ended; this job's "
                            f"{adding:,} would pass the cap of {cap:,} a user (`gpulayer server start "
                            f"--max-queued-elements`): wait until some have ended, or cancel some",
                            limit=cap, queued=found, adding=adding)


def _dependency(conn, job_id: int) -> str:
    """The state of a job named in `after`; InvalidRequest when there is none (so no cycle can be made)."""
    found = row(conn, "get_job", job_id=job_id)
    if found is None:
        raise no_dependency(job_id)
    return found["state"]


def no_dependency(job_id: int) -> InvalidRequest:
    """The answer to an `after` that names no job, and (teams.submit) one the submitter may not see: the same."""
    return InvalidRequest(f"after: no job {job_id} (a job runs after jobs that exist)", code="unknown_job")


def cancel(conn, job_id: int, now: float) -> bool:
    """Cancel a job: queued tasks end now, running ones through their worker's heartbeat; a big array's
    in bounded steps (outcomes.end_step), the job ending `cancelled` after its last.

    Returns False when the job had already ended (cancel is then a no-op). Raises NotFound.
    """
    job = row(conn, "get_job", job_id=job_id)
    if job is None:
        raise NotFound(f"no job {job_id}")
    if job["state"] not in outcomes.ACTIVE_JOB:
        return False
    outcomes.cancel(conn, now, job_id, "cancelled")
    return True


def cancel_element(conn, job_id: int, index: int, now: float) -> bool:
    """Cancel one element of an array: queued (held or not) or assigned, it ends now; running, through its
    worker's heartbeat. False when the element (or the array) had already ended. Raises NotFound, or
    InvalidRequest for a job that is no array."""
    job = row(conn, "job_for_update", job_id=job_id)
    if job is None:
        raise NotFound(f"no job {job_id}")
    if job["array_size"] is None:
        raise InvalidRequest(f"index: job {job_id} is no array (to cancel the whole job, send no index)")
    if not rows(conn, "element_tasks", job_id=job_id, index=index):
        raise NotFound(f"job {job_id} has no element {index}")
    if job["state"] not in outcomes.ACTIVE_JOB:
        return False
    task = row(conn, "cancel_element", job_id=job_id, index=index, now=now)
    if task is None:
        return False
    if task["state"] == "running":
        events.record(conn, now, "task_cancel_requested", job_id=job_id, task_id=task["id"],
                      worker_id=task["worker_id"], index=index)
        return True
    events.record(conn, now, "task_cancelled", job_id=job_id, task_id=task["id"], index=index)
    # A held element frees no place under the cap; the array ends if it was the last element left.
    outcomes.settle_element(conn, now, job, {"id": task["id"], "state": "cancelled"}, freed=not task["held"])
    return True


def _task_view(conn, task: dict) -> dict:
    task = dict(task)
    task["outputs"] = json.loads(task["outputs"])
    task["index"] = task.pop("index")
    restarted = task["restarts"] and task["state"] == "running"
    found = row(conn, "task_restart_message", task_id=task["task_id"]) if restarted else None
    task["restart_message"] = found["text"] if found else None
    return task


def render(conn, job_id: int, index: int | None = None) -> dict:
    """The Job as the API returns it (NotFound when there is none); `index`: only that element's (replica's,
    rank's) tasks."""
    job = row(conn, "get_job", job_id=job_id)
    if job is None:
        raise NotFound(f"no job {job_id}")
    # its tasks stopped to make room for other work (docs/teams.md), oldest first
    return {**_render(conn, job, index),
            "preemptions": rows(conn, "job_preemptions", job_id=job_id, limit=PREEMPTIONS_SHOWN)}


def _render(conn, job: dict, index: int | None = None) -> dict:
    if index is not None:
        found = rows(conn, "element_tasks", job_id=job["id"], index=index)
        if not found:
            raise NotFound(f"job {job['id']} has no {'element' if job['array_size'] else 'task with index'} {index}")
    array, ended = _array_view(conn, job) if job["array_size"] is not None else (None, False)
    if index is None and array is not None:  # an array lists what runs and what failed; `array` counts them all
        found = rows(conn, "array_tasks_shown", job_id=job["id"], limit=ARRAY_TASKS_SHOWN,
                     ended_limit=ARRAY_TASKS_SHOWN if ended else 0)
    elif index is None:
        found = rows(conn, "job_tasks", job_id=job["id"])
    tasks = [_task_view(conn, t) for t in found]
    return {"id": job["id"], "name": job["name"], "state": job["state"], "kind": job["kind"],
            "attempt": job["attempt"], "created_at": job["created_at"], "finished_at": job["finished_at"],
            "exit_code": job["exit_code"], "reason": job["reason"],
            "waiting_reason": waiting_reason(conn, job, tasks),
            "spec": json.loads(job["spec"]), "tasks": tasks,
            "array": array,
            "after": rows(conn, "job_dependencies_of", job_id=job["id"])}


def _array_view(conn, job: dict) -> tuple[dict, bool]:
    """An array's progress: its elements counted by the state of their latest task, when the first
    started, and those that did not succeed (the cancelled ones among them named apart); and whether
    any of its tasks ended without success (a retried one included)."""
    found = rows(conn, "array_counts", job_id=job["id"])
    counts = {r["state"]: r["n"] for r in found if r["n"] > 0}
    unsuccessful = sum(counts.get(s, 0) for s in ("failed", "cancelled", "lost"))
    # none counted: the indices are not looked for (a walk of every task of the array)
    failed = rows(conn, "array_failed_indices", job_id=job["id"], limit=ARRAY_FAILED_SHOWN) if unsuccessful else []
    view = {"indices": json.loads(job["spec"])["array"], "size": job["array_size"], "max_running": job["max_running"],
            "counts": counts, "done": counts.get("succeeded", 0) + unsuccessful,
            "started_at": min((r["started_at"] for r in found if r["started_at"] is not None), default=None),
            "failed_indices": [f["index"] for f in failed],
            "cancelled_indices": [f["index"] for f in failed if f["state"] == "cancelled"]}
    return view, bool(unsuccessful) or any(r["replaced"] for r in found)


def _dependencies_reason(conn, job: dict) -> str:
    """What a waiting job waits for: "for job 41 to succeed", "for job 41 to succeed and job 42 to end"."""
    verbs = {"ok": "succeed", "notok": "fail", "any": "end"}
    open_ = [f"job {d['job']} to {verbs[d['condition']]}" for d in rows(conn, "job_dependencies_of", job_id=job["id"])
             if d["state"] in outcomes.ACTIVE_JOB]
    return "for " + " and ".join(open_) if open_ else "for its dependencies"


def waiting_reason(conn, job: dict, tasks: list[dict] | None = None) -> str | None:
    """Why a queued job is not placed: what no online worker has (labels, size, secrets' labels), else
    that the workers that fit are busy; None when a worker could take it now.

    A running job with a task in the queue is told the same way, for that task:
    a service's replica back in the queue (`tasks`, the rendered tasks), an
    array's element released but not placed (one held by the array's %N cap
    waits for nothing to be told).
    """
    if job["state"] in outcomes.ACTIVE_JOB and job["reason"] is not None:
        return f"being cancelled ({job['reason']}): its tasks end in batches"  # outcomes.end_step
    if job["state"] == "waiting":
        return _dependencies_reason(conn, job)
    if job["state"] == "running":
        if not _task_in_queue(conn, job, tasks or []):
            return None
    elif job["state"] != "queued":
        return None
    found = row(conn, "job_waiting_reason", job_id=job["id"])
    if found and found["why"]:
        return waiting.unplaced(found)
    quota = row(conn, "job_quota_reason", job_id=job["id"])  # a project's quota, a user's limit
    return (quota and quota["reason"]) or (waiting.busy(found) if found and found["busy"] else None)


def _task_in_queue(conn, job: dict, tasks: list[dict]) -> bool:
    """Whether a running job has a task in the queue: an array's released element, a service's replica."""
    if job["array_size"] is not None:  # its view lists no queued element: asked of the state file
        return row(conn, "array_element_released", job_id=job["id"]) is not None
    return job["kind"] == "service" and any(t["state"] == "queued" and t["attempt"] == job["attempt"]
                                            for t in tasks)


def listing_page(conn, state: str | None, limit: int, before: int | None, scope: dict | None = None,
                 budget: int = PAGE_BYTES) -> tuple[list[dict], bool]:
    """A page of jobs newest first (at most `limit`, rendered until their JSON reaches `budget`), and whether
    older ones follow; `scope` (teams.list_scope): whose jobs, and what the caller may see."""
    scope = scope or {"owner_id": None, "project_id": None, "viewer_id": None}
    query = "list_jobs" if scope["owner_id"] is None else "list_jobs_of_owner"  # one user's: its index alone
    found, more = page(conn, query, limit, budget, state=state, before=before, **scope)
    rendered: list[dict] = []
    size = 0
    for job in found:
        if size >= budget:  # each job renders its tasks: the page is cut by what it renders, not its rows
            return rendered, True
        rendered.append(_render(conn, job))
        size += len(json.dumps(rendered[-1]))
    return rendered, more


def outputs(conn, job_id: int, index: int | None = None) -> dict[str, str]:
    """{path: digest} collected by the job's succeeded tasks (latest attempt wins); `index`: of that element
    (replica, rank) alone."""
    found: dict[str, str] = {}
    tasks = rows(conn, "job_tasks", job_id=job_id) if index is None else \
        rows(conn, "element_tasks", job_id=job_id, index=index)
    for task in reversed(tasks):
        if task["state"] == "succeeded":
            found.update(json.loads(task["outputs"]))
    return found


def element_outputs(conn, job_id: int) -> dict[str, dict[str, str]]:
    """An array's outputs by element: {index (as text, a JSON key): {path: digest}}, each element's latest
    succeeded task's; elements that wrote the same path keep their own file."""
    found: dict[str, dict[str, str]] = {}
    for task in reversed(rows(conn, "job_tasks", job_id=job_id)):
        if task["state"] == "succeeded" and task["outputs"] not in (None, "{}"):
            found.setdefault(str(task["index"]), {}).update(json.loads(task["outputs"]))
    return found


def endpoints(conn, job_id: int) -> dict:
    """The current attempt's replica endpoints; ready when every replica has one.

    Only a running service serves: once the job has ended (cancelled, a replica
    ended for good) the list is empty, even while its workers are still
    stopping replicas that have not cleared their endpoint yet.
    """
    job = row(conn, "get_job", job_id=job_id)
    if job is None:
        raise NotFound(f"no job {job_id}")
    if job["state"] != "running":
        return {"endpoints": [], "ready": False}
    replicas = rows(conn, "job_endpoints", job_id=job_id)
    found = [r["endpoint"] for r in replicas if r["endpoint"] and r["state"] == "running"]
    return {"endpoints": found, "ready": bool(replicas) and len(found) == len(replicas)}


def events_of(conn, job_id: int) -> list[dict]:
    """Every event of a job, oldest first (NotFound when there is no such job)."""
    return events_page(conn, job_id, 0, -1)[0]


def events_page(conn, job_id: int, after: int, limit: int, budget: int = PAGE_BYTES) -> tuple[list[dict], bool]:
    """A job's events after the sequence number `after`, oldest first: at most `limit` (-1: all) and about
    `budget` bytes, and whether more follow. Raises NotFound when there is no such job."""
    if row(conn, "get_job", job_id=job_id) is None:
        raise NotFound(f"no job {job_id}")
    if limit < 0:
        found, more = rows(conn, "job_events", job_id=job_id, after=after, limit=-1), False
    else:
        found, more = page(conn, "job_events", limit, budget, job_id=job_id, after=after)
    return [{**e, "data": json.loads(e["data"])} for e in found], more


def log_lines(conn, job_id: int, after: int, limit: int, index: int | None = None) -> list[dict]:
    """Log lines of a job after sequence number `after`; `index`: of that element (replica, rank) alone."""
    if index is not None:  # a page: at most `limit` lines and about PAGE_BYTES of text
        return page(conn, "element_logs", limit, job_id=job_id, index=index, after=after)[0]
    return page(conn, "job_logs", limit, job_id=job_id, after=after)[0]


def job_ended(conn, job_id: int, index: int | None = None) -> bool:
    """True once the job is finished (succeeded, failed, cancelled or lost); with `index`, once that
    element's (replica's, rank's) latest task has ended, or the job has."""
    job = row(conn, "get_job", job_id=job_id)
    if job is not None and job["finished_at"] is None and index is not None:
        latest = rows(conn, "element_tasks", job_id=job_id, index=index)
        return bool(latest) and latest[0]["finished_at"] is not None
    return job is not None and job["finished_at"] is not None
