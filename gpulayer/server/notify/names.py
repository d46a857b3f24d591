"""Public event names: what a webhook subscribes to, mapped from the events table's kinds.

Most kinds map to one name; `job_finished` maps by the job's end state, `task_finished` by the task's, and
a job's first `task_started` is `job.started` to a webhook that asks for it (else `task.started`).
"""

from __future__ import annotations

# public name -> (internal kind, what it means); the order is the docs' (docs/notifications.md)
EVENTS: dict[str, tuple[str, str]] = {
    "job.submitted": ("job_submitted", "a job was accepted"),
    "job.released": ("job_released", "its dependencies ended as it needed: it may be placed"),
    "job.started": ("task_started", "the first task of the job started"),
    "job.requeued": ("job_retried", "the job starts a new attempt (retried, requeued)"),
    "job.succeeded": ("job_finished", "the job ended: every task exited 0"),
    "job.failed": ("job_finished", "the job ended failed (a task failed or timed out)"),
    "job.cancelled": ("job_finished", "the job was cancelled"),
    "job.lost": ("job_finished", "the job ended lost (a task was lost and not retried)"),
    "task.started": ("task_started", "a task (element, replica, rank) started on a worker"),
    "task.succeeded": ("task_finished", "a task exited 0"),
    "task.failed": ("task_finished", "a task ended otherwise (non-zero, timed out, stopped)"),
    "task.requeued": ("task_requeued", "a task went back to the queue (drain, lease given back)"),
    "task.preempted": ("task_preempted", "a task was stopped to make room, and requeued"),
    "task.lost": ("task_lost", "a task's lease expired or its worker left"),
    "task.idle": ("task_idle", "a task held its GPUs idle past its idle policy: warned, notified, requeued or "
                               "cancelled (its `action`, with the samples)"),
    "worker.registered": ("worker_registered", "a worker joined (admins' webhooks only)"),
    "worker.online": ("worker_online", "a worker came back online"),
    "worker.lost": ("worker_offline", "a worker stopped heartbeating: offline"),
    "worker.drained": ("worker_drained", "a draining worker's last task ended"),
    "gpu.unhealthy": ("gpu_unhealthy", "a worker reported a GPU fault (an Xid error, ...)"),
    "alert.fired": ("alert_fired", "an alert's query returned rows it did not return before"),
}
# `submit --mail-type` (Slurm's names) -> public names
MAIL_TYPES: dict[str, list[str]] = {
    "BEGIN": ["job.started"],
    "END": ["job.succeeded", "job.failed", "job.cancelled", "job.lost"],
    "FAIL": ["job.failed", "job.lost"],
    "REQUEUE": ["job.requeued"],
}
MAIL_TYPES["ALL"] = sorted({n for names in MAIL_TYPES.values() for n in names})


def kinds(names: list[str]) -> list[str]:
    """The internal kinds to read for a webhook that wants `names` (alert_fired always: an alert names it)."""
    return sorted({EVENTS[n][0] for n in names} | {"alert_fired"})


def public(event: dict, wanted: set[str], first_start: bool) -> str | None:
    """The public name of `event` (a row of `webhook_events`) for a webhook that wants `wanted`; None when it
    wants none of what the event is."""
    kind = event["kind"]
    if kind == "alert_fired":
        return "alert.fired"
    if kind == "job_finished":
        name = f"job.{event['data'].get('state')}"
    elif kind == "task_finished":
        name = "task.succeeded" if event["data"].get("state") == "succeeded" else "task.failed"
    elif kind == "task_started":
        name = "job.started" if first_start and "job.started" in wanted else "task.started"
    else:
        name = next((n for n, (k, _) in EVENTS.items() if k == kind), "")
    return name if name in wanted else None
