"""Preemption: stop lower-priority preemptible work, or borrowed work, to make room for a waiting task.

Upkeep runs `preempt` as one transaction. For each waiting task that no online
worker can take now (preemption_candidates, best first), it looks for a worker
where stopping victims would make room (preemption_victims): preemptible tasks
of a lower priority, or, when the waiting task's project is within its nominal
quota, tasks of a project holding more than its own (borrowed GPUs). Victims
are taken lowest priority first, then the most recently started, so the least
work is lost; a gang's ranks go together or not at all. The victims' workers
hear it through the heartbeat (`cancel_task_ids`, and `preempted_task_ids`
with `preempt_grace_s`): SIGTERM, the grace, then SIGKILL. When a victim's
finish arrives, `requeue` puts the task back in the queue with the same
attempt (reason `preempted`, event `task_preempted`); its next run sees
GPULAYER_PREEMPTED=1. A task never preempts one it was preempted for, so
preemption cannot loop.
"""
from __future__ import annotations

import json
from itertools import groupby

from gpulayer.server.scheduler import events, ledger
from gpulayer.server.store.queries import QUERIES, row, rows

PLANS = 16  # waiting tasks whose victims are searched for per upkeep round
CANDIDATES = 256  # waiting tasks read per round: those with nothing to take, or no worker they fit, cost no plan
WORKERS_TRIED = 64  # workers a waiting task's plan is tried on, those with the cheapest victims first
ACTIVE = ("assigned", "running")


def preempt(conn, now: float) -> list[int]:
    """Upkeep's preemption round: ask workers to stop victims for waiting tasks; the victims' task ids.

    Cheap when there is nothing to take: no running preemptible job and no project
    over its nominal quota end the round after one query.
    """
    asked: list[int] = []
    possible = row(conn, "preemption_possible")
    floor, borrowers = possible["floor"], {int(k): v for k, v in json.loads(possible["borrowers"]).items()}
    if floor is None and not borrowers:
        return asked
    round_ = _Round(conn)
    plans = 0
    for want in rows(conn, "preemption_candidates", limit=CANDIDATES):
        reclaim = want["nominal"] is not None and want["gpus_in_use"] + want["gpus"] <= want["nominal"]
        lenders = {k: v for k, v in borrowers.items() if k != want["project_id"]} if reclaim else {}
        if (floor is None or want["priority"] <= floor) and not lenders:
            continue  # nothing it may preempt
        if not round_.room(want["shape_id"]):
            continue  # no online worker it fits even idle: no victim would help
        plan = round_.plan(want, lenders, asked)
        if plan and not round_.placeable(want["shape_id"]):
            asked += _ask(conn, now, want, plan)
            round_.taken(want, plan)
        plans += 1
        if plans == PLANS:  # the budget: so a few waiting tasks that find no victims hold back no later one
            break
    return asked


class _Round:
    """What one preemption round reads once: victims per priority, the workers each shape fits."""

    def __init__(self, conn) -> None:
        self.conn = conn
        # (priority, lenders) -> preemption_victims by worker, workers with the cheapest victim first
        self.victims: dict[tuple, list[list[dict]]] = {}
        self.rooms: dict[int, dict[int, dict]] = {}  # shape -> {worker: its free room} (shape_rooms)
        self.fits_now: dict[int, bool] = {}          # shape -> could an online worker take one now

    def room(self, shape_id: int) -> dict[int, dict]:
        """The online workers a shape fits when idle, with their free room now (shape_rooms), by id."""
        if shape_id not in self.rooms:
            self.rooms[shape_id] = {r["worker_id"]: r for r in rows(self.conn, "shape_rooms", shape_id=shape_id)}
        return self.rooms[shape_id]

    def plan(self, want: dict, lenders: dict, asked: list[int]) -> list[dict]:
        """The victims that make room for `want` (none asked already this round), or [] (_plan)."""
        room = self.room(want["shape_id"])
        if not room:
            return []
        key = (want["priority"], tuple(sorted(lenders)))
        if key not in self.victims:
            found = rows(self.conn, "preemption_victims", priority=want["priority"],
                         borrowers=json.dumps(sorted(lenders)))
            per_worker = [list(victims) for _, victims in groupby(found, key=lambda v: v["worker_id"])]
            per_worker.sort(key=lambda vs: (vs[0]["priority"], -(vs[0]["started_at"] or 0)))
            self.victims[key] = per_worker
        mine = rows(self.conn, "preemption_exclusions", job_id=want["job_id"], task_id=want["task_id"])
        workers = {r["id"] for r in mine if r["kind"] == "worker"}
        spared = {r["id"] for r in mine if r["kind"] == "task"} | set(asked)
        tried = []
        for victims in self.victims[key]:
            worker_id = victims[0]["worker_id"]
            if worker_id in room and worker_id not in workers:
                tried.append(([v for v in victims if v["id"] not in spared and v["job_id"] != want["job_id"]],
                              room[worker_id]))
                if len(tried) == WORKERS_TRIED:
                    break
        return _plan(tried, want, lenders)

    def placeable(self, shape_id: int) -> bool:
        """Could an online worker take a task of this shape now (then it waits for acquire instead)?"""
        if shape_id not in self.fits_now:
            self.fits_now[shape_id] = row(self.conn, "shape_fits_now", shape_id=shape_id) is not None
        return self.fits_now[shape_id]

    def taken(self, want: dict, plan: list[dict]) -> None:
        """The room `plan` frees on its worker is `want`'s: later candidates this round count only the rest."""
        room = self.rooms[want["shape_id"]][plan[0]["worker_id"]]
        room["free_slots"] += len(plan) - 1
        for key in ("gpus", "cpus", "memory_mb"):
            room[f"free_{key}"] += sum(v[key] for v in plan) - want[key]


def _plan(tried: list[tuple[list[dict], dict]], want: dict, borrowers: dict) -> list[dict]:
    """The victims that make room for `want` on one worker, or []: the worker that needs the fewest,
    then whose victims have the lowest priority, then started the latest (the least work lost).

    `tried` is [(a worker's victims in order, its free room)], workers with the cheapest victim
    first, at most WORKERS_TRIED of them (a big fleet full of preemptible work would otherwise
    cost a plan per worker per waiting task).
    """
    plans = [chosen for victims, room in tried if victims and (chosen := _room_on_worker(victims, room, want, borrowers))]
    return min(plans, key=lambda c: (len(c), max(v["priority"] for v in c),
                                     -min(v["started_at"] or float("inf") for v in c)), default=[])


def _room_on_worker(victims: list[dict], room: dict, want: dict, borrowers: dict) -> list[dict]:
    """Victims on one worker, in order, until the freed room fits `want`; [] when even all would not."""
    free = {"slots": room["free_slots"], "gpus": room["free_gpus"], "cpus": room["free_cpus"],
            "memory_mb": room["free_memory_mb"]}
    # project -> GPUs it holds beyond its nominal quota, not yet reclaimed
    borrowed = {k: b["gpus_in_use"] - b["nominal"] for k, b in borrowers.items()}
    chosen: list[dict] = []
    for victim in victims:
        if _fits(free, want):
            break
        if not victim["by_priority"]:  # borrowed work: reclaim no more than the project borrowed
            if borrowed.get(victim["project_id"], 0) <= 0:
                continue
            borrowed[victim["project_id"]] -= victim["gpus"]
        chosen.append(victim)
        free["slots"] += 1
        for key in ("gpus", "cpus", "memory_mb"):
            free[key] += victim[key]
    return chosen if _fits(free, want) else []


def _fits(free: dict, want: dict) -> bool:
    return (free["slots"] >= 1 and free["gpus"] >= want["gpus"] and free["cpus"] >= want["cpus"]
            and free["memory_mb"] >= want["memory_mb"])


def _ask(conn, now: float, want: dict, plan: list[dict]) -> list[int]:
    """Mark the victims (a gang's every active rank with its victim) to be stopped; their task ids."""
    asked: list[int] = []
    for victim in plan:
        targets = [victim]
        if victim["gang"]:
            targets = [t for t in rows(conn, "attempt_tasks", job_id=victim["job_id"], attempt=victim["attempt"])
                       if t["state"] in ACTIVE]
        for target in targets:
            reason = "priority" if victim["by_priority"] else "borrowed"
            marked = row(conn, "request_preemption", task_id=target["id"], for_task_id=want["task_id"],
                         for_job_id=want["job_id"], reason=reason, now=now)
            if marked is None:
                continue
            conn.execute(QUERIES["mark_preempted"], {"task_id": target["id"]})
            events.record(conn, now, "task_preempt_requested", job_id=marked["job_id"], task_id=target["id"],
                          worker_id=marked["worker_id"], for_task_id=want["task_id"], for_job_id=want["job_id"],
                          reason=reason)
            asked.append(target["id"])
    return asked


def requeue_lost(conn, now: float, worker_id: int | None = None) -> int:
    """Victims whose worker is lost during their grace go back to the queue, same attempt; how many.

    Called before a lost worker's tasks are settled lost: those of `worker_id`
    (leaving), or with None those whose lease or worker's lease passed. Their runs
    are in the ledger as preempted; the job keeps its attempts.
    """
    found = rows(conn, "lost_preemption_victims", worker_id=worker_id, now=now)
    return sum(requeue(conn, task["worker_id"], task, now, worker_lost=True) for task in found)


def requeue(conn, worker_id: int, task: dict, now: float, *, worker_lost: bool = False) -> bool:
    """A task stopped for a preemption: back to the queue, same attempt; False when that does not apply.

    `task` is the task's row as its worker holds it (task_owned). Applies only
    while a preemption is pending for its current assignment and its job still
    runs this attempt (a job cancelled meanwhile ends as cancelled). `worker_lost`:
    its worker was lost before it reported the stop (requeue_lost; said in the event).
    """
    pending = row(conn, "pending_preemption", task_id=task["id"])
    if pending is None:
        return False
    job = row(conn, "job_for_update", job_id=task["job_id"])
    if job is None or job["state"] not in ("queued", "running") or job["attempt"] != task["attempt"]:
        return False
    ledger.record(conn, now, [task["id"]], outcome="preempted", preempted_by=pending["for_task_id"])
    if row(conn, "requeue_preempted", task_id=task["id"], worker_id=worker_id) is None:
        return False
    conn.execute(QUERIES["preemption_done"], {"id": pending["id"], "now": now})
    events.record(conn, now, "task_preempted", job_id=task["job_id"], task_id=task["id"], worker_id=worker_id,
                  attempt=task["attempt"], for_task_id=pending["for_task_id"], for_job_id=pending["for_job_id"],
                  reason=pending["reason"], **({"worker_lost": True} if worker_lost else {}))
    if row(conn, "requeue_job_if_idle", job_id=task["job_id"]) is not None and job["gang"]:
        conn.execute(QUERIES["clear_rendezvous"], {"job_id": task["job_id"], "attempt": task["attempt"]})
    return True


def heartbeat_fields(conn, worker_id: int) -> dict:
    """What a heartbeat answer adds for preemptions: the tasks to stop as preempted, and their grace."""
    found = rows(conn, "worker_preempting", worker_id=worker_id)
    if not found:
        return {}
    return {"preempted_task_ids": sorted(r["task_id"] for r in found), "preempt_grace_s": found[0]["preempt_grace_s"]}
