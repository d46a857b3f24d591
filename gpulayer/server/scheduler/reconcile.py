"""Reconciling what workers report with a state file that may be behind them (a restore from a replica).

A control plane restored from a replica can miss up to one sync interval of
changes: a worker may run a task the restored state has `queued` (assigned in
the lost window), one it never heard of (submitted in the window), or no longer
run one it has `running` (its finish was lost). Each heartbeat is checked,
in its own transaction (docs/reliability.md, "Reconciliation"):

1. a reported task the state has `assigned` to this worker is marked running
   (its start went to the lost window; without a restore, `start` alone marks
   it, docs/protocol.md);
2. a reported task the state has `queued`, made before the
   restore (id <= the restored file's newest task id, so the very same task
   attempt, never a later one that reused its id), of its job's current
   attempt, not a gang rank, is adopted: assigned to this worker and running,
   on the GPU indices the worker reports, when the worker has room for it;
   a start or a finish for such a task that arrives before the worker's
   first heartbeat adopts it the same way (`adopt_for_call`);
3. any other reported task the worker does not hold is cancelled on it (the
   heartbeat's `cancel_task_ids`, as before); one that is queued or unknown
   here is held: while a worker still reports running it, nothing is
   assigned to anyone (`Restored.paused`), so one task attempt never runs
   twice at once, and a task that reuses its id is not handed out meanwhile;
4. a task the state has `running` on this worker since before
   the restore and that the worker no longer reports is lost (`worker_lost`,
   retried by policy);
5. after a restored control plane first starts, nothing is assigned until
   every worker the restored state has online has sent a heartbeat (so its
   tasks of the lost window are adopted or held first), or until one lease
   TTL has passed: the leases of the workers that did not report then
   expire (the start gives every lease one TTL), and their tasks are lost.

The rules apply for one lease TTL past the longest pause (`RULES_TTLS` TTLs
after the first start, across restarts of the restored home); after that a
restored plane is an ordinary one, and no report holds assignment any more.
A control plane that was not restored applies none of them: what a worker
reports that it does not hold is cancelled, as it always was.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import apsw

from gpulayer.server.scheduler import events, outcomes, preemption
from gpulayer.server.store.queries import row, rows

HOLD_INTERVALS = 3    # a queued task a worker stopped reporting is free again after this many intervals
RULES_TTLS = 2        # lease TTLs after the first start that the rules apply: the longest pause, then one more


@dataclass
class Restored:
    """What a restored control plane knows of its restore; `held` and `awaiting` are shared (locked).

    Every time is the clock's (the scheduler's, injected: tests pin it), in seconds.
    """

    watermark: int          # the restored file's newest task id: ids above it were made after the restore
    started_at: float       # this process's start: running tasks started before it are checked
    pause_until: float      # past this the pause ends, even with workers still awaited
    hold_s: float           # how long a report holds a queued task out of placement
    awaiting: set[int] = field(default_factory=set)   # workers online in the restored state, not heard from yet
    ends_at: float = float("inf")   # past this none of the rules apply
    held: dict[int, float] = field(default_factory=dict)   # task id -> when a worker last reported it
    lock: threading.Lock = field(default_factory=threading.Lock)
    clock: Callable[[], float] = time.time

    @classmethod
    def after_restore(cls, marker: dict, clock: Callable[[], float], heartbeat_interval_s: float,
                      lease_ttl_s: float, online_workers: set[int]) -> "Restored | None":
        """The rules for a plane started now (`clock()`); None once their time is over.

        On the first start (no `first_started_at` in the marker) assignment
        waits for `online_workers`, at most one lease TTL; a later start of the
        same home has no pause, and only what is left of the rules' time.
        """
        now = clock()
        first = marker.get("first_started_at")
        left = RULES_TTLS * lease_ttl_s - (now - float(first) if first is not None else 0.0)
        if left <= 0:
            return None
        return cls(watermark=int(marker.get("max_task_id") or 0), started_at=now,
                   pause_until=now + (lease_ttl_s if first is None else 0.0),
                   hold_s=HOLD_INTERVALS * heartbeat_interval_s,
                   awaiting=set(online_workers) if first is None else set(), ends_at=now + left, clock=clock)

    def active(self) -> bool:
        """True while the rules apply."""
        return self.clock() < self.ends_at

    def seen(self, worker_id: int) -> None:
        """The worker's heartbeat was reconciled: the pause no longer waits for it."""
        with self.lock:
            self.awaiting.discard(worker_id)

    def hold(self, task_id: int) -> None:
        with self.lock:
            self.held[task_id] = self.clock()

    def paused(self) -> bool:
        """True while nothing may be assigned: workers still awaited (rule 5), or a queued task some worker runs.

        Both end when the rules' time is over, however often workers report (a task that will not stop
        cannot hold the cluster's assignment for longer).
        """
        now = self.clock()
        if now >= self.ends_at:
            return False
        with self.lock:
            if self.awaiting and now < self.pause_until:
                return True
            for task_id, at in list(self.held.items()):
                if now - at > self.hold_s:
                    del self.held[task_id]
            return bool(self.held)

    def describe(self) -> dict:
        """For /v1/health: whether assignment is paused, which workers it awaits, which tasks are held."""
        now = self.clock()
        paused = self.paused()
        with self.lock:
            awaiting = sorted(self.awaiting) if now < self.pause_until else []
            held = sorted(self.held)
        return {"paused": paused, "awaiting_workers": awaiting, "held_task_ids": held,
                "pause_ends_in_s": round(max(0.0, min(self.pause_until, self.ends_at) - now), 2) if awaiting else 0.0,
                "rules_end_in_s": round(max(0.0, self.ends_at - now), 2), "watermark_task_id": self.watermark}


def online_workers(conn: apsw.Connection) -> set[int]:
    """The workers the (restored) state has online: rule 5's pause waits for them."""
    return {r["id"] for r in rows(conn, "reconcile_online_workers")}


def reported(conn: apsw.Connection, worker_id: int, tasks: list[dict], now: float, lease: float, restored: Restored | None) -> None:
    """Apply the rules to one heartbeat's `tasks`, before its answer is made (adopted tasks are not cancelled)."""
    if restored is None or not restored.active():
        return
    restored.seen(worker_id)
    _unreported(conn, worker_id, {t["task_id"] for t in tasks}, now, restored)  # first: frees their room
    held = {t["id"]: t["state"] for t in rows(conn, "worker_held_tasks", worker_id=worker_id)} if tasks else {}
    for task in tasks:
        task_id = task["task_id"]
        if task_id in held:
            if held[task_id] != "assigned":
                continue
            started = row(conn, "start_task", task_id=task_id, worker_id=worker_id, pid=None, now=now)
            if started is not None:
                events.record(conn, now, "task_started", job_id=started["job_id"], task_id=task_id,
                              worker_id=worker_id, reported=True)
        else:
            _foreign(conn, worker_id, task, now, lease, restored)


def _foreign(conn: apsw.Connection, worker_id: int, task: dict, now: float, lease: float, restored: Restored) -> None:
    """A reported task this worker does not hold: adopted (rule 2), else held while queued (rule 3)."""
    found = row(conn, "reconcile_task", task_id=task["task_id"])
    if found is not None and found["state"] != "queued":
        return  # another worker's, or ended: cancelled by the heartbeat's answer
    if found is not None and _adopt(conn, worker_id, task, found, now, lease, restored, ending=False):
        return
    # Cancelled by the answer. Held until the worker stops reporting it: a task made meanwhile may
    # reuse its id, and must not be handed out (to this worker above all) while the old one runs.
    restored.hold(task["task_id"])


def adopt_for_call(conn: apsw.Connection, worker_id: int, task_id: int, now: float, lease: float, restored: Restored,
                   *, ending: bool) -> None:
    """Rule 2 for a start or finish that reaches a restored plane before the worker's first heartbeat.

    Its task may be queued here (acquired in the lost window): adopted as a
    heartbeat would, so the call is accepted instead of answered 409 (which
    would make the agent stop a task that runs, or drop a result). `ending`
    (a finish): a GPU task is adopted without knowing its device indices.
    """
    if not restored.active():
        return
    found = row(conn, "reconcile_task", task_id=task_id)
    if found is not None and found["state"] == "queued":
        _adopt(conn, worker_id, {"task_id": task_id}, found, now, lease, restored, ending=ending)


def _adopt(conn: apsw.Connection, worker_id: int, task: dict, found: dict, now: float, lease: float, restored: Restored,
           *, ending: bool) -> bool:
    same = (found["id"] <= restored.watermark and not found["gang"] and found["attempt"] == found["job_attempt"]
            and found["job_state"] in ("queued", "running")
            and task.get("job_id") in (None, found["job_id"]) and task.get("attempt") in (None, found["attempt"]))
    if not same:
        return False
    free = row(conn, "worker_free", worker_id=worker_id)
    gpus = task.get("gpus")
    if free is None or free["free_slots"] <= 0:
        return False
    if found["gpus"] and not (ending and gpus is None):
        in_use = {r["i"] for r in rows(conn, "gpus_in_use", worker_id=worker_id)}
        if (gpus is None or len(gpus) != found["gpus"] or in_use & set(gpus)
                or any(i >= free["gpus"] for i in gpus)):
            return False
    taken = row(conn, "assign_task", task_id=found["id"], worker_id=worker_id, now=now, lease_expires_at=lease)
    if taken is None:
        return False
    if found["gpus"] and gpus is not None:
        row(conn, "set_gpu_indices", task_id=found["id"], gpu_indices=json.dumps(sorted(gpus)), gpu_share=0)
    row(conn, "start_task", task_id=found["id"], worker_id=worker_id, pid=None, now=now)
    row(conn, "mark_job_running", job_id=found["job_id"])
    events.record(conn, now, "task_assigned", job_id=found["job_id"], task_id=found["id"], worker_id=worker_id,
                  attempt=found["attempt"], reason="reconciled")
    events.record(conn, now, "task_started", job_id=found["job_id"], task_id=found["id"], worker_id=worker_id,
                  reported=True, reason="reconciled")
    return True


def _unreported(conn: apsw.Connection, worker_id: int, reported_ids: set[int], now: float, restored: Restored) -> None:
    """Rule 4: tasks running here since before the restore that the worker no longer runs are lost."""
    for task in rows(conn, "worker_running_since", worker_id=worker_id, before=restored.started_at):
        if task["id"] in reported_ids:
            continue
        if preemption.requeue(conn, worker_id, task, now, worker_lost=True):
            continue  # a preemption's victim that stopped: back to the queue, same attempt
        lost = row(conn, "lose_unreported_task", task_id=task["id"], worker_id=worker_id, now=now)
        if lost is None:
            continue
        events.record(conn, now, "task_lost", job_id=lost["job_id"], task_id=lost["id"], worker_id=worker_id,
                      reason="worker_lost", not_reported=True)
        outcomes.settle(conn, now, lost["job_id"], lost["attempt"],
                        {"id": lost["id"], "state": "lost", "reason": "worker_lost", "exit_code": None})
