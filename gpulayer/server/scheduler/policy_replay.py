"""`gpulayer policy replay`: the recorded jobs of a window re-run through the placement rules, offline.

A what-if on history (docs/scheduling-time.md, "Replaying a policy change"). The state file is read
once (forecast.snapshot: SQLite's backup into memory, one read transaction; the file is opened read-only
and never written). On the copy the queue is emptied (every job, task, run, event and reservation goes;
users, projects, workers, their GPUs, secrets, artifacts and the settings stay), the workers of the window
are made online with leases that never expire, and the window's recorded batch jobs are submitted again
(jobs.submit, the real submit) at their recorded submit times, with their specs, users and projects, on a
virtual clock. At each step the tasks whose recorded run is over finish (lifecycle.finish), the
reservations of EASY backfill are planned (reservations.plan) and every worker claims what it may
(placement.acquire_many): the rules the control plane runs, not a model of them. Each task runs as long
as its job's longest recorded run (the usage ledger; a run still going: until the window's end).

It runs twice on copies of the same copy: with the settings as they are (the baseline), and with the
changed ones (`Change`); what actually happened is read from the ledger beside them. A job is re-submitted
without its dependencies, hold or begin time (its recorded submit time stands for them); a job that never
ran in the window has no run time to replay and is left out.
"""
from __future__ import annotations

import heapq
import json
import math
from collections import deque
from dataclasses import dataclass

import apsw

from gpulayer.protocol import PRIORITY_CLASSES
from gpulayer.server.errors import GpulayerError
from gpulayer.server.scheduler import forecast, jobs, reservations
from gpulayer.server.scheduler.spec import validate_job
from gpulayer.server.store.queries import QUERIES, one, rows

#: Tables emptied in the copy: the jobs and all that hangs on them, their runs, the queue, what notifies. Users,
#: projects, workers, their GPUs, secrets, artifacts, tokens and the settings stay.
CLEARED = ("tasks", "jobs", "job_dependencies", "task_queue", "queue_groups", "shapes", "events", "logs",
           "checkpoint_files", "checkpoints", "rendezvous", "sessions", "webhook_deliveries", "webhooks", "alerts",
           "provision_requests", "fairshare", "usage", "preemptions", "gang_reservations", "reservations",
           "estimates", "worker_cordons", "gpu_samples")
#: Spec fields a re-submitted job goes without: its recorded submit time stands for them.
DROPPED = ("after", "hold", "begin_at")
SETTINGS_HELP = ("quota.PROJECT=GPUS|none, weight.PROJECT=W, backfill=on|off, backfill_depth=N (1-100), "
                 "priority_class.NAME=N, fairshare_half_life=DURATION")
#: The query that writes each setting to the copy (priority_class: applied to the specs as jobs are submitted).
SETTERS = {"quota": "replay_set_quota", "weight": "replay_set_weight", "backfill": "replay_set_backfill",
           "backfill_depth": "replay_set_backfill_depth", "fairshare_half_life": "replay_set_fairshare_half_life"}
TOP_CHANGED = 10   # jobs listed whose wait changed most


class ReplayError(ValueError):
    """A replay refused before anything ran: a bad setting, or a window without recorded jobs."""


@dataclass(frozen=True)
class Change:
    """One changed setting: `key` (quota, weight, backfill, backfill_depth, priority_class,
    fairshare_half_life), `name` (the project or class it is of, else ''), `value`, and the text as given."""

    key: str
    name: str
    value: float | None
    text: str


@dataclass(frozen=True)
class Recorded:
    """One recorded batch job of the window: its id, spec, owner, submit time, run time and actual start."""

    id: int
    name: str | None
    spec: dict
    user_id: int
    project_id: int
    project: str
    gpus: int
    submitted_at: float
    run_s: float
    started_at: float | None


def _number(text: str, key: str, *, whole: bool = False, low: float = 0, high: float = math.inf) -> float:
    try:
        value = float(int(text)) if whole else float(text)
    except ValueError:
        raise ReplayError(f"{key}={text!r}: expected {'a whole number' if whole else 'a number'}") from None
    if not low <= value <= high or math.isnan(value):
        bound = f"at least {low:g}" if high == math.inf else f"from {low:g} to {high:g}"
        raise ReplayError(f"{key}={text!r}: must be {bound}")
    return value


def parse_change(text: str, projects: set[str], duration=float) -> Change:
    """One `--set KEY=VALUE` as a Change; ReplayError naming what is wrong (`duration` parses a duration)."""
    key, sep, value = text.partition("=")
    if not sep or not key or not value:
        raise ReplayError(f"--set {text!r}: expected KEY=VALUE ({SETTINGS_HELP})")
    head, dot, name = key.partition(".")
    if head in ("quota", "weight") and dot:
        if name not in projects:
            raise ReplayError(f"{key}: no project named {name!r} (known: {', '.join(sorted(projects))})")
        if head == "quota":
            amount = None if value == "none" else _number(value, key, whole=True)
        else:
            amount = _number(value, key)
            if amount <= 0:
                raise ReplayError(f"{key}={value!r}: must be more than 0")
        return Change(head, name, amount, text)
    if head == "priority_class" and dot:
        if name not in PRIORITY_CLASSES:
            raise ReplayError(f"{key}: no priority class named {name!r} (known: {', '.join(PRIORITY_CLASSES)})")
        return Change(head, name, _number(value, key, whole=True, low=-1_000_000, high=1_000_000), text)
    if key == "backfill":
        if value not in ("on", "off"):
            raise ReplayError(f"backfill={value!r}: expected on or off")
        return Change(key, "", float(value == "on"), text)
    if key == "backfill_depth":
        return Change(key, "", _number(value, key, whole=True, low=1, high=100), text)
    if key == "fairshare_half_life":
        try:
            seconds = float(duration(value))
        except ValueError as exc:
            raise ReplayError(f"{key}={value!r}: {exc}") from None
        if seconds <= 0:
            raise ReplayError(f"{key}={value!r}: must be more than 0 seconds")
        return Change(key, "", seconds, text)
    raise ReplayError(f"unknown setting {key!r} (known: {SETTINGS_HELP})")


def project_names(conn: apsw.Connection) -> set[str]:
    return {r["name"] for r in rows(conn, "replay_projects")}


def recorded_jobs(conn: apsw.Connection, since: float, until: float) -> list[Recorded]:
    """The batch jobs submitted in [since, until] that ran, oldest first, each with its longest recorded run
    (the usage ledger; a task still running: until `until`) and its first task's actual start."""
    found = rows(conn, "replay_recorded", since=since, until=until)
    out = []
    for r in found:
        run_s = max((x for x in (r["ran_s"], r["running_s"]) if x is not None), default=None)
        if run_s is not None:
            out.append(Recorded(r["id"], r["name"], json.loads(r["spec"]), r["user_id"], r["project_id"],
                                r["project"], r["gpus"], r["created_at"], max(run_s, 0.0), r["started_at"]))
    return out


def _emptied(source: apsw.Connection, since: float, until: float) -> apsw.Connection:
    """A copy of `source` with no job in it and the workers of [since, until] online (the latest row of
    each name that was seen in the window), leases that never expire (an in-memory copy: `source` is only read)."""
    copy = forecast.snapshot(source)
    copy.execute("PRAGMA foreign_keys=OFF")
    copy.execute("BEGIN")
    tables = {r["name"] for r in rows(copy, "replay_tables")}
    for _ in range(3):  # a delete's trigger may write another table: until all are empty
        for table in (t for t in CLEARED if t in tables):
            copy.execute(f'DELETE FROM "{table}"')
    copy.execute(QUERIES["replay_workers"], {"since": since, "until": until, "forever": forecast.REPLAY_LEASE_S})
    copy.execute("COMMIT")
    copy.execute("PRAGMA foreign_keys=ON")
    return copy


def apply(copy: apsw.Connection, changes: list[Change]) -> None:
    """Write the changed settings to the copy (a priority class is applied as jobs are submitted)."""
    for c in changes:
        if c.key != "priority_class":
            value = c.value if c.key in ("weight", "fairshare_half_life") or c.value is None else int(c.value)
            copy.execute(QUERIES[SETTERS[c.key]], {"value": value, "name": c.name})


def _spec(job: Recorded, changes: list[Change]) -> dict:
    spec = {k: v for k, v in job.spec.items() if k not in DROPPED}
    for c in changes:
        if c.key == "priority_class" and spec.get("priority", 0) == PRIORITY_CLASSES[c.name]:
            spec["priority"] = int(c.value or 0)
    return spec


def run(base: apsw.Connection, recorded: list[Recorded], changes: list[Change], since: float,
        until: float) -> tuple[dict[int, float | None], dict[str, float]]:
    """Replay `recorded` on a copy of `base` (the emptied copy, left as it is) with `changes`: each job's
    start in the replay (None: it never started), and the GPU-seconds per project it used in the window."""
    copy = forecast.snapshot(base)
    copy.execute("BEGIN")
    try:
        apply(copy, changes)
        return _clock(copy, recorded, changes), gpu_seconds(copy, since, until)
    finally:
        copy.execute("ROLLBACK")
        copy.close()


def _clock(copy: apsw.Connection, recorded: list[Recorded], changes: list[Change]) -> dict[int, float | None]:
    pending = deque(recorded)
    replay = forecast._Replay(copy, pending[0].submitted_at)
    ids: dict[int, int] = {}   # the copy's job id -> the recorded one
    t: float | None = replay.now
    while t is not None:
        replay.advance(t)
        while pending and pending[0].submitted_at <= t:
            job = pending.popleft()
            try:
                new = jobs.submit(copy, validate_job(_spec(job, changes)), t, job.user_id, job.project_id)
            except GpulayerError:   # a secret or artifact gone since: it could not be submitted again
                continue
            ids[new], replay.durations[new] = job.id, job.run_s
        reservations.plan(copy, t)
        replay.place(t, record=True)
        upcoming = [x for x in (pending[0].submitted_at if pending else None, replay.next_time()) if x is not None]
        t = min(upcoming) if upcoming else None
    starts: dict[int, float | None] = {job.id: None for job in recorded}
    starts.update({ids[new]: at for new, (at, _) in replay.started.items() if new in ids})
    return starts


def gpu_seconds(copy: apsw.Connection, since: float, until: float, job_ids: set[int] | None = None) -> dict[str, float]:
    """GPU-seconds per project of the ledger's runs (of `job_ids` only, when given), clipped to [since, until]
    (a run still going: to until)."""
    used: dict[str, float] = {}
    for r in rows(copy, "replay_gpu_use", until=until):
        if job_ids is not None and r["job_id"] not in job_ids:
            continue
        seconds = r["gpus"] * max(0.0, min(r["ended_at"], until) - max(r["started_at"], since))
        used[r["project"]] = used.get(r["project"], 0.0) + seconds
    return used


def _summary(recorded: list[Recorded], starts: dict[int, float | None], used: dict[str, float],
             capacity_gpu_s: float) -> dict:
    waits = [starts[j.id] - j.submitted_at for j in recorded if starts.get(j.id) is not None]  # type: ignore[operator]
    return {"mean_wait_s": sum(waits) / len(waits) if waits else None, "worst_wait_s": max(waits, default=None),
            "not_started": len(recorded) - len(waits),
            "gpu_utilisation": sum(used.values()) / capacity_gpu_s if capacity_gpu_s else None,
            "gpu_hours": {name: round(s / 3600, 4) for name, s in sorted(used.items()) if s > 0}}


def policy_replay(source: apsw.Connection, since: float, until: float, changes: list[Change]) -> dict:
    """Baseline and changed replays of the jobs of [since, until] on copies of `source`, beside what happened:
    the report `gpulayer policy replay` prints (docs/scheduling-time.md). ReplayError without recorded jobs."""
    recorded = recorded_jobs(source, since, until)
    if not recorded:
        raise ReplayError("no recorded jobs in the window: no batch job submitted then ran "
                          "(widen --since)")
    base = _emptied(source, since, until)
    try:
        gpus = one(base, "replay_capacity")
        last_end = max(j.submitted_at + j.run_s for j in recorded)
        capacity = gpus["g"] * (until - since)
        actual = {j.id: j.started_at for j in recorded}
        runs = {"actual": _summary(recorded, actual, gpu_seconds(source, since, until, set(actual)), capacity)}
        starts = {}
        for label, applied in (("baseline", []), ("changed", changes)):
            starts[label], used = run(base, recorded, applied, since, until)
            runs[label] = _summary(recorded, starts[label], used, capacity)
    finally:
        base.close()
    return {"window": {"since": since, "until": until, "jobs": len(recorded), "workers": gpus["n"],
                       "gpus": int(gpus["g"]), "last_recorded_end": last_end},
            "settings": [c.text for c in changes], "runs": runs,
            "changed_most": _changed_most(recorded, starts["baseline"], starts["changed"])}


def _changed_most(recorded: list[Recorded], baseline: dict[int, float | None],
                  changed: dict[int, float | None]) -> list[dict]:
    """The jobs whose wait moved most between the baseline and the changed replay (never started: last)."""
    rows = []
    for job in recorded:
        before, after = baseline.get(job.id), changed.get(job.id)
        wait_b = None if before is None else before - job.submitted_at
        wait_c = None if after is None else after - job.submitted_at
        delta = None if wait_b is None or wait_c is None else wait_c - wait_b
        if delta != 0:
            actual = None if job.started_at is None else job.started_at - job.submitted_at
            rows.append({"job": job.id, "name": job.name, "project": job.project, "gpus": job.gpus,
                         "actual_wait_s": actual, "baseline_wait_s": wait_b, "changed_wait_s": wait_c,
                         "delta_s": delta})
    return heapq.nlargest(TOP_CHANGED, rows, key=lambda r: math.inf if r["delta_s"] is None else abs(r["delta_s"]))
