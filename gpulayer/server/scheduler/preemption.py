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
GPULAYER_PREEMPTED=1. A task never preempts one it was preempted for (nor,
when that was a gang's rank, the gang), so preemption cannot loop.

A waiting gang (multi-node job) of width W preempts too, all or nothing: it
needs W distinct workers that fit a rank, each with room now or with victims
that make it (`_gang_plan`); if fewer can be found, no victim is asked. The W
workers' room is then held for it (gang_reservations, until the grace and two
lease TTLs have passed): acquire and other gangs take only room beyond it, so
the room a first victim frees is still there when the last one stops and the
gang is placed whole (the hold ends then).
"""
from __future__ import annotations

import json
from itertools import groupby

import apsw

from gpulayer.protocol import LEASE_TTL_S
from gpulayer.server.scheduler import events, ledger
from gpulayer.server.store.queries import QUERIES, one, row, rows

PLANS = 16  # waiting tasks whose victims are searched for per upkeep round
CANDIDATES = 256  # waiting tasks read per round: those with nothing to take, or no worker they fit, cost no plan
WORKERS_TRIED = 64  # workers a waiting task's plan is tried on, those with the cheapest victims first
ACTIVE = ("assigned", "running")


def preempt(conn: apsw.Connection, now: float, lease_ttl_s: float = LEASE_TTL_S) -> list[int]:
    """Upkeep's preemption round: ask workers to stop victims for waiting tasks; the victims' task ids.

    Cheap when there is nothing to take: no running preemptible job and no project
    over its nominal quota end the round after one query (and the deletion of room
    held for gangs that has expired). `lease_ttl_s` sizes how long a gang's room is held.
    """
    asked: list[int] = []
    conn.execute(QUERIES["expire_gang_reservations"], {"now": now})
    possible = one(conn, "preemption_possible")
    floor, borrowers = possible["floor"], {int(k): v for k, v in json.loads(possible["borrowers"]).items()}
    if floor is None and not borrowers:
        return asked
    round_ = _Round(conn, now)
    plans = 0
    for want in rows(conn, "preemption_candidates", limit=CANDIDATES, now=now):
        reclaim = want["nominal"] is not None and want["gpus_in_use"] + want["gpus"] * want["width"] <= want["nominal"]
        lenders = {k: v for k, v in borrowers.items() if k != want["project_id"]} if reclaim else {}
        if (floor is None or want["priority"] <= floor) and not lenders:
            continue  # nothing it may preempt
        if len(round_.room(want["shape_id"])) < want["width"]:
            continue  # too few online workers it fits even idle: no victim would help
        if want["gang"]:
            per_worker = round_.gang_plan(want, lenders, asked)
            if per_worker and not round_.gang_placeable(want):
                asked += _ask(conn, now, want, [v for victims in per_worker.values() for v in victims])
                for worker_id in per_worker:
                    conn.execute(QUERIES["reserve_for_gang"], {"worker_id": worker_id, "job_id": want["job_id"],
                                                               "now": now, "lease_ttl_s": lease_ttl_s})
                round_.taken(want, per_worker)
        else:
            plan = round_.plan(want, lenders, asked)
            if plan and not round_.placeable(want["shape_id"]):
                asked += _ask(conn, now, want, plan)
                round_.taken(want, {plan[0]["worker_id"]: plan})
        plans += 1
        if plans == PLANS:  # the budget: so a few waiting tasks that find no victims hold back no later one
            break
    return asked


class _Round:
    """What one preemption round reads once: victims per priority, the workers each shape fits."""

    def __init__(self, conn: apsw.Connection, now: float) -> None:
        self.conn = conn
        self.now = now
        # worker -> room held there for waiting gangs (gang_reservations): no other task's
        self.held: dict[int, list[dict]] = {}
        for r in rows(conn, "live_gang_reservations", now=now):
            self.held.setdefault(r["worker_id"], []).append(r)
        # (priority, lenders) -> preemption_victims by worker, workers with the cheapest victim first
        self.victims: dict[tuple, list[list[dict]]] = {}
        self.rooms: dict[int, dict[int, dict]] = {}  # shape -> {worker: its free room} (shape_rooms)
        self.fits_now: dict[int, bool] = {}          # shape -> could an online worker take one now

    def room(self, shape_id: int) -> dict[int, dict]:
        """The online workers a shape fits when idle, with their free room now (shape_rooms), by id."""
        if shape_id not in self.rooms:
            rooms = {r["worker_id"]: dict(r) for r in rows(self.conn, "shape_rooms", shape_id=shape_id)}
            for worker_id, held in self.held.items():  # room held for a gang is not free to others
                if worker_id in rooms:
                    rooms[worker_id]["free_slots"] -= len(held)
                    for key in ("gpus", "cpus", "memory_mb"):
                        rooms[worker_id][f"free_{key}"] -= sum(h[key] for h in held)
            self.rooms[shape_id] = rooms
        return self.rooms[shape_id]

    def plan(self, want: dict, lenders: dict, asked: list[int]) -> list[dict]:
        """The victims that make room for `want` (none asked already this round), or [] (_plan)."""
        return _plan(self._tried(want, lenders, asked, WORKERS_TRIED), want, lenders)

    def gang_plan(self, want: dict, lenders: dict, asked: list[int]) -> dict[int, list[dict]]:
        """For a waiting gang, the victims to stop on each of `width` distinct workers that fit a rank
        ([] on one with room now, at least one with victims), or {} when so many cannot be found."""
        room = self.room(want["shape_id"])
        free = [w for w, r in room.items() if w not in self.held and _fits(_free(r), want)]
        if len(free) >= want["width"]:
            return {}  # room for it now: it waits for acquire
        # a worker holding room for another gang is no other gang's (gang_workers skips it whole)
        tried = [(victims, r) for victims, r in self._tried(want, lenders, asked, WORKERS_TRIED + want["width"])
                 if r["worker_id"] not in self.held]
        return _gang_plan(tried, free, want, lenders)

    def _tried(self, want: dict, lenders: dict, asked: list[int], most: int) -> list[tuple[list[dict], dict]]:
        """[(a worker's victims `want` may take, in order; its free room)] for up to `most` workers it
        fits, those with the cheapest victim first (the victims read once a round per priority)."""
        room = self.room(want["shape_id"])
        key = (want["priority"], tuple(sorted(lenders)))
        if key not in self.victims:
            found = rows(self.conn, "preemption_victims", priority=want["priority"],
                         borrowers=json.dumps(sorted(lenders)))
            per_worker = [list(victims) for _, victims in groupby(found, key=lambda v: v["worker_id"])]
            per_worker.sort(key=lambda vs: (vs[0]["priority"], -(vs[0]["started_at"] or 0)))
            self.victims[key] = per_worker
        mine = rows(self.conn, "preemption_exclusions", job_id=want["job_id"], task_id=want["task_id"],
                    gang=want["gang"])
        workers = {r["id"] for r in mine if r["kind"] == "worker"}
        spared = {r["id"] for r in mine if r["kind"] == "task"} | set(asked)
        spared_jobs = {r["id"] for r in mine if r["kind"] == "job"} | {want["job_id"]}
        tried = []
        for victims in self.victims[key]:
            worker_id = victims[0]["worker_id"]
            if worker_id in room and worker_id not in workers:
                tried.append(([v for v in victims if v["id"] not in spared and v["job_id"] not in spared_jobs],
                              room[worker_id]))
                if len(tried) == most:
                    break
        return tried

    def gang_placeable(self, want: dict) -> bool:
        """Could acquire place the whole gang now (width workers fit a rank, beyond room held for others)?"""
        found = rows(self.conn, "gang_workers", job_id=want["job_id"], worker_id=None, width=want["width"],
                     now=self.now)
        return len(found) == want["width"]

    def placeable(self, shape_id: int) -> bool:
        """Could an online worker take a task of this shape now (then it waits for acquire instead)?"""
        if shape_id not in self.fits_now:
            self.fits_now[shape_id] = row(self.conn, "shape_fits_now", shape_id=shape_id) is not None
        return self.fits_now[shape_id]

    def taken(self, want: dict, per_worker: dict[int, list[dict]]) -> None:
        """The room the victims free on each worker is `want`'s (a rank's on each of a gang's workers):
        later candidates this round count only the rest, on every shape's copy of the worker's room."""
        for worker_id, plan in per_worker.items():
            if want["gang"]:  # held for it: the rooms of shapes read later this round leave it out
                self.held.setdefault(worker_id, []).append({k: want[k] for k in ("gpus", "cpus", "memory_mb")})
            for rooms in self.rooms.values():
                if worker_id in rooms:
                    room = rooms[worker_id]
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
    plans = [chosen for victims, room in tried
             if victims and (chosen := _room_on_worker(victims, room, want, _borrowed(borrowers)))]
    return min(plans, key=_cost, default=[])


def _gang_plan(tried: list[tuple[list[dict], dict]], free: list[int], want: dict,
               borrowers: dict) -> dict[int, list[dict]]:
    """A gang's victims by worker: the `free` workers (room now, no victim), then the workers whose
    victims cost the least (as _plan ranks them), until `width` distinct workers; {} when fewer
    can be found. GPUs reclaimed from a borrowing project, over all the workers, stay within
    what it borrowed."""
    borrowed = _borrowed(borrowers)
    costed = sorted(((chosen, victims, room) for victims, room in tried
                     if room["worker_id"] not in free and victims
                     and (chosen := _room_on_worker(victims, room, want, dict(borrowed)))),
                    key=lambda c: _cost(c[0]))
    per_worker: dict[int, list[dict]] = {w: [] for w in free}
    for _, victims, room in costed:
        if len(per_worker) >= want["width"]:
            break
        left = dict(borrowed)  # again, after what the workers chosen before reclaim
        if chosen := _room_on_worker(victims, room, want, left):
            per_worker[room["worker_id"]] = chosen
            borrowed = left
    return per_worker if len(per_worker) == want["width"] else {}


def _borrowed(borrowers: dict) -> dict[int, int]:
    """project -> GPUs it holds beyond its nominal quota, not yet reclaimed."""
    return {k: b["gpus_in_use"] - b["nominal"] for k, b in borrowers.items()}


def _cost(chosen: list[dict]) -> tuple:
    """How much a plan's victims lose: the fewest, then the lowest priority, then started the latest."""
    return (len(chosen), max(v["priority"] for v in chosen), -min(v["started_at"] or float("inf") for v in chosen))


def _free(room: dict) -> dict:
    return {"slots": room["free_slots"], "gpus": room["free_gpus"], "cpus": room["free_cpus"],
            "memory_mb": room["free_memory_mb"]}


def _room_on_worker(victims: list[dict], room: dict, want: dict, borrowed: dict[int, int]) -> list[dict]:
    """Victims on one worker, in order, until the freed room fits `want`; [] when even all would not.

    `borrowed` (project -> GPUs it borrowed, not yet reclaimed: _borrowed) is drawn from as
    borrowed work is chosen.
    """
    free = _free(room)
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


def _ask(conn: apsw.Connection, now: float, want: dict, plan: list[dict]) -> list[int]:
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


def requeue_lost(conn: apsw.Connection, now: float, worker_id: int | None = None) -> int:
    """Victims whose worker is lost during their grace go back to the queue, same attempt; how many.

    Called before a lost worker's tasks are settled lost: those of `worker_id`
    (leaving), or with None those whose lease or worker's lease passed. Their runs
    are in the ledger as preempted; the job keeps its attempts.
    """
    found = rows(conn, "lost_preemption_victims", worker_id=worker_id, now=now)
    return sum(requeue(conn, task["worker_id"], task, now, worker_lost=True) for task in found)


def requeue(conn: apsw.Connection, worker_id: int, task: dict, now: float, *, worker_lost: bool = False) -> bool:
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


def heartbeat_fields(conn: apsw.Connection, worker_id: int) -> dict:
    """What a heartbeat answer adds for preemptions: the tasks to stop as preempted, and their grace."""
    found = rows(conn, "worker_preempting", worker_id=worker_id)
    if not found:
        return {}
    return {"preempted_task_ids": sorted(r["task_id"] for r in found), "preempt_grace_s": found[0]["preempt_grace_s"]}
