"""Reservations for EASY backfill: where and when the highest-ranked waiting jobs can start, planned each tick.

A plan (`plan`, one write transaction, upkeep's `reservations` job) looks at the highest-ranked waiting jobs
(`plan_candidates`: the claim's ranking, at most `backfill_max_jobs`) in order, against a timeline of each
worker's room: its free room now, what each active task frees at its expected end (task_expected_end: its
start plus the job's time limit, else its learned run time, else the default; an overrunning task any time
now), and what the reservations made before hold from their start for the job's expected run. A job that
fits some worker's room now, for its whole expected run, is taken as starting now (the claim will give it);
one that does not gets a reservation, if the group of workers it could ever run on (shape_worker_fit.fits)
holds fewer than `backfill_depth`: the earliest time at which enough of them (a gang: `width` at once)
have its room for its whole expected run, on the tightest such workers, none of them one that a job ranked
higher is to start on now (the next tick plans from that job's start). The rows replace the last plan's
whole. The claim honours them (schema.sql, claimable_tasks): another task takes room a reservation needs
only if it is expected to end by the reservation's start.
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field

import apsw

from gpulayer.server.store.queries import one, row, rows

ROOM = ("slots", "gpus", "cpus", "memory_mb")
# A task past its expected end may end any time: its room is counted free this long from now, so that what
# waits for it keeps its reservation (moved each tick) and nothing new starts in that room meanwhile.
OVERRUN_S = 1.0
# Expected ends closer than this are one end to a plan (a gang's ranks, started milliseconds apart): _earliest.
SAME_END_S = 1.0
# A reservation's `reason`: which of its group's reservations it is, and the group's size.
REASON = "reservation {n} of the workers it fits ({workers}): the earliest its room is free there"


@dataclass
class Worker:
    """One worker's room over time: `free` now, and `changes` [(at, delta)] after now, each delta a tuple of ROOM."""

    id: int
    name: str
    free: tuple[float, ...]
    changes: list[tuple[float, tuple[float, ...]]] = field(default_factory=list)

    def holds(self, need: tuple[float, ...], start: float, until: float) -> bool:
        """Whether its room covers `need` from `start` until `until` (every change before `until` counted)."""
        changes = sorted(self.changes)
        room = list(self.free)
        for at, delta in changes:
            if at > start:
                break
            room = [r + d for r, d in zip(room, delta)]
        if any(r < n for r, n in zip(room, need)):
            return False
        for at, delta in changes:
            if start < at < until:
                room = [r + d for r, d in zip(room, delta)]
                if any(d < 0 for d in delta) and any(r < n for r, n in zip(room, need)):
                    return False
        return True

    def spare_gpus(self, at: float) -> float:
        return self.free[1] + sum(d[1] for t, d in self.changes if t <= at)

    def take(self, need: tuple[float, ...], start: float, until: float) -> None:
        if until <= start:  # an expected run of 0 s (a `true` learned from its history) holds nothing at any time
            return
        self.changes.append((start, tuple(-n for n in need)))
        self.changes.append((until, need))


def plan(conn: apsw.Connection, now: float) -> list[dict]:
    """Replace the reservations with this tick's plan; returns the rows written ([] with backfill off)."""
    settings = one(conn, "backfill_settings")
    row(conn, "clear_reservations")
    if not settings["backfill"]:
        return []
    row(conn, "set_claim_clock", now=now, depth=1)  # the fair-share views rank at this time
    candidates = rows(conn, "plan_candidates", now=now, max_jobs=settings["backfill_max_jobs"])
    if not candidates:
        return []
    workers = _timeline(conn, now)
    fits: dict[int, set[int]] = defaultdict(set)
    for f in rows(conn, "plan_fits", shape_ids=json.dumps(sorted({c["shape_id"] for c in candidates}))):
        if f["worker_id"] in workers:
            fits[f["shape_id"]].add(f["worker_id"])
    held: dict[frozenset[int], int] = defaultdict(int)
    starting: set[int] = set()  # workers a job ranked higher is to start on now
    written: list[dict] = []
    for job in candidates:
        group = frozenset(fits[job["shape_id"]])
        if not job["admitted"] or not group:  # may not run now, or could never run on what is online
            continue
        need = (1, job["gpus"], job["cpus"], job["memory_mb"])
        count = job["width"] if job["gang"] else 1
        if held[group] >= settings["backfill_depth"]:
            # No more reservations in this group: all that counts is whether it starts now (what _earliest finds
            # first, at `now`), not when it could; the walk over every later end was most of a claim's CPU with
            # a deep queue of small jobs (docs/benchmarks/issue-41.md, "Short tasks").
            chosen = _tightest(workers, group, need, count, now, job["expected_s"])
            start = now if chosen else float("inf")
        else:
            start, chosen = _earliest(workers, group, need, count, now, job["expected_s"])
        if not chosen:  # more ranks than the group has workers, or (at the depth) it does not start now
            continue
        if start <= now:  # it starts now, as the claim will find: its room is taken from here on
            for w in chosen:
                workers[w].take(need, now, now + job["expected_s"])
            starting.update(chosen)
            continue
        held[group] += 1
        # Not on a worker a job ranked higher is to start on: its claim comes after this plan, so it would end
        # after a reservation made from its expected end here, and the reservation would keep it out; the next
        # tick plans from its start.
        start, chosen = _earliest(workers, group - starting, need, count, now, job["expected_s"])
        if not chosen:
            continue
        reason = REASON.format(n=held[group], workers=len(group))
        for w in chosen:
            workers[w].take(need, start, start + job["expected_s"])
            written.append({"job_id": job["id"], "worker_id": w, "gpus": job["gpus"], "cpus": job["cpus"],
                            "memory_mb": job["memory_mb"], "start_at": start, "now": now, "reason": reason})
            row(conn, "insert_reservation", **written[-1])
    return written


def _timeline(conn: apsw.Connection, now: float) -> dict[int, Worker]:
    """{worker id: its room now and as the active tasks free it} for the workers a plan may reserve room on."""
    workers = {w["id"]: Worker(w["id"], w["name"], (w["free_slots"], w["free_gpus"], w["free_cpus"], w["free_memory_mb"]))
               for w in rows(conn, "plan_workers")}
    for r in rows(conn, "plan_running", now=now, soon=now + OVERRUN_S):
        if r["worker_id"] in workers:
            workers[r["worker_id"]].changes.append((r["end_at"], (1, r["gpus"], r["cpus"], r["memory_mb"])))
    return workers


def _earliest(workers: dict[int, Worker], group: frozenset[int], need: tuple[float, ...], count: int, now: float,
              run_s: float) -> tuple[float, list[int]]:
    """The earliest time, now or a change of room, at which `count` workers of `group` have `need` for `run_s`
    seconds, and those workers: the tightest then, and of those as tight, the busiest now, so that the workers
    idle now stay open to backfill (as the offline EASY of scripts/tracesim.py reserves); (inf, []) when never.

    Ends less than SAME_END_S apart are one end: a gang's ranks started a few milliseconds apart end so, and
    taking the strict earliest would reserve the idle workers able at the first rank's end over the busy ones
    able a moment later. Of the picks at the times within SAME_END_S after the earliest (when that is not now),
    the busiest now wins (the earliest of those as busy)."""
    fits_now = _tightest(workers, group, need, count, now, run_s)
    if fits_now:  # the first time looked at (times[0] below), without the walk that lists the others
        return now, fits_now
    times = sorted({now} | {at for w in group for at, _ in workers[w].changes if at > now})
    for i, start in enumerate(times):
        pick = _tightest(workers, group, need, count, start, run_s)
        if pick and start <= now:  # it fits now: the claim will start it
            return start, pick
        if pick:
            best = (sum(workers[w].free[1] for w in pick), start, pick)
            for later in times[i + 1:]:
                if later >= start + SAME_END_S:
                    break
                other = _tightest(workers, group, need, count, later, run_s)
                if other and sum(workers[w].free[1] for w in other) < best[0]:
                    best = (sum(workers[w].free[1] for w in other), later, other)
            return best[1], best[2]
    return float("inf"), []


def _tightest(workers: dict[int, Worker], group: frozenset[int], need: tuple[float, ...], count: int, start: float,
              run_s: float) -> list[int]:
    """`count` workers of `group` that have `need` from `start` for `run_s` seconds, the tightest then and the
    busiest now first; [] when fewer have."""
    able = [w for w in group if workers[w].holds(need, start, start + run_s)]
    if len(able) < count:
        return []
    return sorted(able, key=lambda w: (workers[w].spare_gpus(start), workers[w].free[1], w))[:count]
