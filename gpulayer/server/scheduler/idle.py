"""Idle GPUs taken back (issue 40, point 2; docs/workers.md "Idle GPUs").

A job, its project or the fleet sets an idle policy: a timeout, a threshold (GPU utilisation under it is
idle) and an action. Upkeep's `idle` job finds, from `gpu_samples` on a reader (`idle_tasks`, off the
writer), the running tasks whose every held GPU stayed under the threshold for the whole timeout (gaps in
the samples are not idleness), then acts in one write transaction (`reclaim`), once per assignment:

- `notify`: an event `task_idle` (public name `task.idle`: the job's webhooks and mail hear it);
- `requeue`: the task is asked to stop as a preemption victim is (its signal, the preempt grace, SIGKILL;
  preemption.requeue puts it back in the queue with the same attempt when its worker reports the stop: not
  a failed attempt, its checkpoint directory follows it), reason `idle`;
- `cancel`: the job (an array's element alone) is cancelled.

A task with a shell or SSH session open (interactive work) is warned first (`task_idle`, action `warn`)
and acted on only once it has stayed idle `warning_s` after the warning. Every `task_idle` event carries
the policy and the samples that justified it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import apsw

from gpulayer.server.errors import InvalidRequest
from gpulayer.server.scheduler import events, jobs
from gpulayer.server.store.queries import QUERIES, one, row, rows

BATCH = 256          # idle tasks acted on per round at most (the rest at the next)
SERIES = 120         # samples of each GPU an event carries at most (the newest; counts say how many there were)
DEFAULT_BELOW_PCT = 5.0
DEFAULT_ACTION = "notify"
DEFAULT_WARNING_S = 600.0


@dataclass(frozen=True)
class Fleet:
    """The fleet's default policy (`server start --idle-timeout ...`; timeout None: none) and the check's
    settings: how long a warned interactive task has, and the largest gap between samples that still counts
    as a series (two sample intervals and an upkeep tick: a sample may wait a tick in memory)."""

    timeout_s: float | None = None
    below_pct: float = DEFAULT_BELOW_PCT
    action: str = DEFAULT_ACTION
    warning_s: float = DEFAULT_WARNING_S
    gap_s: float = 5.0


def check_timeout(timeout_s: float | None, sample_interval_s: float, field: str) -> None:
    """An idle timeout shorter than one sample interval (the heartbeat interval) could judge no series:
    InvalidRequest `idle_timeout_too_short`."""
    if timeout_s is not None and timeout_s < sample_interval_s:
        raise InvalidRequest(f"{field}: {timeout_s:g} seconds is under one GPU sample interval "
                             f"({sample_interval_s:g} s, the heartbeat interval): no series could show it idle",
                             code="idle_timeout_too_short", field=field)


def check_threshold(below_pct: float | None, field: str) -> None:
    if below_pct is not None and not 0 <= below_pct <= 100:
        raise InvalidRequest(f"{field}: {below_pct:g}% is outside 0-100%", code="invalid_idle_threshold", field=field)


def idle_tasks(conn: apsw.Connection, now: float, fleet: Fleet, limit: int = BATCH) -> list[dict]:
    """The running tasks idle past their policy now (the `idle_tasks` query), their `gpus` parsed."""
    if fleet.timeout_s is None and not one(conn, "idle_policy_possible")["possible"]:
        return []
    found = rows(conn, "idle_tasks", now=now, gap_s=fleet.gap_s, warning_s=fleet.warning_s,
                 fleet_timeout_s=fleet.timeout_s, fleet_below_pct=fleet.below_pct, fleet_action=fleet.action,
                 limit=limit)
    return [{**r, "gpus": _gpus(r["gpus"])} for r in found]


def _gpus(text: str) -> list[dict]:
    gpus = json.loads(text)
    for gpu in gpus:
        gpu["series"] = gpu["series"][-SERIES:]
    return sorted(gpus, key=lambda g: g["index"])


def reclaim(conn: apsw.Connection, now: float, fleet: Fleet, found: list[dict]) -> list[tuple[int, str]]:
    """Upkeep's idle round: act on the idle tasks `found` (idle_tasks, read before on a reader, off the writer)
    that still hold the same assignment and were not acted on since; [(task id, what was done)] (warn, notify,
    requeue, cancel)."""
    done = []
    for task in found:
        if row(conn, "idle_task_unchanged", task_id=task["task_id"], assigned_at=task["assigned_at"]) is None:
            continue  # it ended, was placed again, or was acted on meanwhile
        action = task["action"]
        if task["interactive"] and action != "notify":
            if task["warned_at"] is None:
                action = "warn"
            elif task["warned_at"] > now - fleet.warning_s:
                continue  # warned: its warning period runs
        if action == "requeue" and not _requeue(conn, now, task):
            continue
        if action == "cancel":
            _cancel(conn, now, task)
        conn.execute(QUERIES["insert_idle_reclaim"], {"task_id": task["task_id"], "job_id": task["job_id"],
                                                      "assigned_at": task["assigned_at"], "action": action,
                                                      "now": now})
        events.record(conn, now, "task_idle", job_id=task["job_id"], task_id=task["task_id"],
                      worker_id=task["worker_id"], action=action, policy_action=task["action"],
                      timeout_s=task["timeout_s"], below_pct=task["below_pct"],
                      interactive=bool(task["interactive"]), gpus=task["gpus"],
                      **({"warning_s": fleet.warning_s} if action == "warn" else {}))
        done.append((task["task_id"], action))
    return done


def _requeue(conn: apsw.Connection, now: float, task: dict) -> bool:
    """Ask its worker to stop it (a gang's every active rank with it) as a preemption victim; False when it
    was stopping already."""
    targets = [task["task_id"]]
    if task["gang"]:
        targets = [t["id"] for t in rows(conn, "attempt_tasks", job_id=task["job_id"], attempt=task["attempt"])
                   if t["state"] in ("assigned", "running")]
    asked = False
    for task_id in targets:
        marked = row(conn, "request_idle_preemption", task_id=task_id, now=now)
        if marked is None:
            continue
        conn.execute(QUERIES["mark_preempted"], {"task_id": task_id})
        events.record(conn, now, "task_preempt_requested", job_id=marked["job_id"], task_id=task_id,
                      worker_id=marked["worker_id"], for_task_id=task_id, for_job_id=marked["job_id"],
                      reason="idle")
        asked = True
    return asked


def _cancel(conn: apsw.Connection, now: float, task: dict) -> None:
    """Cancel its job, or, in an array, its element alone."""
    if task["array_size"] is not None:
        jobs.cancel_element(conn, task["job_id"], task["index"], now)
    else:
        jobs.cancel(conn, task["job_id"], now)
