"""Rolling updates of a service (issue 39, items 3-5; docs/services.md, "Rolling updates", "Canary").

`start` (a `service update`) stores the new revision's spec (`service_updates`) and nothing else; upkeep's
`rollouts` job then calls `advance`, which compares the replicas of the service's current attempt with what
the rollout wants and makes one move of each kind a tick: surge a replica of the target revision (placed like
any task), drain an old one (service_drain.drain_replica: out of the ingress's set, its requests finish, then
stopped) once a new one at its index serves, and finish when every index serves the target revision. Every
decision is read again from the state file at each tick, so a control plane killed mid-rollout carries on
where the file says after its restart: nothing is half-done, each move is one transaction.

A replica of the new revision that is not ready within `ready_timeout_s` of its start (its health check's
failures x interval by default), restarts (a crash loop), or fails turns the rollout around (`rolling_back`):
the new revision's replicas that serve no request stop at once, the old revision is the target, and the same
moves bring every index back to it; the old replicas were never drained before a new one served in their
place, so they serve throughout. A canary (`canary`: a percentage) surges one new replica and waits with
every old one serving until `promote` (the rollout goes on) or `rollback`; the ingress sends that share of
its requests to the new revision's ready replicas meanwhile (scheduler/ingress.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import apsw

from gpulayer.protocol.fields import to_wire
from gpulayer.server.errors import Conflict, InvalidRequest, NotFound
from gpulayer.server.scheduler import events, service_drain
from gpulayer.server.scheduler.spec import validate_job
from gpulayer.server.store.queries import one, row, rows

ACTIVE = ("rolling", "rolling_back")
#: A new replica's time to become ready when its service has no health check (seconds).
DEFAULT_READY_TIMEOUT_S = 300.0
#: How long a replica that leaves in a rollout has to finish its requests (`drain_s`, seconds).
DEFAULT_DRAIN_S = 30.0
#: The fields of PATCH /v1/jobs/{id}/service: the spec's changes, and how it rolls out.
SPEC_CHANGES = ("image", "env", "command")
ROLL_FIELDS = ("max_surge", "max_unavailable", "canary", "ready_timeout_s", "drain_s")
#: A service's updates GET /v1/jobs/{id}/service lists, newest first (the state file keeps them all).
UPDATES_SHOWN = 20


@dataclass(frozen=True)
class Update:
    """A checked `service update`: the spec's changes (`env` values of None remove the name) and its rollout."""

    changes: dict
    max_surge: int = 1
    max_unavailable: int = 0
    canary: int | None = None
    ready_timeout_s: float | None = None
    drain_s: float = DEFAULT_DRAIN_S


# -- the API's calls -------------------------------------------------------------


def start(conn: apsw.Connection, now: float, job_id: int, update: Update, priority_classes=None) -> dict:
    """`service update`: store the new revision (the serving spec with `update.changes`), its rollout
    `rolling`; upkeep does the rest. Conflict for a batch job, an ended service, one not running yet, one
    rolling already (update_in_progress); InvalidRequest for a change the spec refuses or one that changes
    nothing."""
    job = _service(conn, job_id, "update")
    if job["state"] != "running":
        raise Conflict(f"job {job_id} is {job['state']}: a service is updated once it runs (cancel it and "
                       "submit the new one while it waits)", code="service_not_running")
    if update.max_surge + update.max_unavailable < 1:
        raise InvalidRequest("max_surge: max_surge and max_unavailable cannot both be 0 (nothing could move)")
    if update.max_unavailable >= job["width"] and job["width"] > 0:
        raise InvalidRequest(f"max_unavailable: must be below the service's {job['width']} replicas "
                             "(at least one keeps serving)")
    busy = row(conn, "active_update", job_id=job_id)
    if busy is not None:
        raise Conflict(f"job {job_id} is rolling out revision {busy['revision']} ({busy['state']}): promote, "
                       "roll back or wait for it first", code="update_in_progress", revision=busy["revision"])
    old = json.loads(job["spec"])
    if update.canary is not None and not (old.get("service") or {}).get("ingress"):
        raise InvalidRequest(f"canary: job {job_id} has no ingress, and a canary's share is of the ingress's "
                             "requests (clients of its endpoints pick replicas themselves)", code="canary_needs_ingress")
    new = new_spec(old, update.changes, priority_classes)
    if new == old:
        raise InvalidRequest("changes: the update changes nothing (give an image, env or command that differs)",
                             code="no_change")
    health = (new.get("service") or {}).get("health") or None
    timeout = update.ready_timeout_s or (health["interval_s"] * health["failures"] if health
                                         else DEFAULT_READY_TIMEOUT_S)
    revision = one(conn, "next_revision", job_id=job_id)["n"]
    made = one(conn, "insert_update", job_id=job_id, revision=revision, from_revision=job["revision"],
               spec=json.dumps(new), changes=json.dumps(update.changes), max_surge=update.max_surge,
               max_unavailable=update.max_unavailable, canary=update.canary, ready_timeout_s=timeout,
               drain_s=update.drain_s, now=now)
    events.record(conn, now, "service_update_started", job_id=job_id, revision=revision,
                  from_revision=job["revision"], changes=sorted(update.changes), canary=update.canary,
                  max_surge=update.max_surge, max_unavailable=update.max_unavailable)
    return made


def new_spec(old: dict, changes: dict, priority_classes=None) -> dict:
    """The stored spec `old` with `changes` (image, env merged: None removes a name, command), checked and
    normalised as a submit's (InvalidRequest naming the field)."""
    raw = {k: v for k, v in old.items() if v is not None}
    if "env" in changes:
        env = {**old.get("env", {}), **changes["env"]}
        raw["env"] = {k: v for k, v in env.items() if v is not None}
    for name in ("image", "command"):
        if name in changes:
            raw[name] = changes[name]
    return to_wire(validate_job(raw, priority_classes))


def promote(conn: apsw.Connection, now: float, job_id: int) -> dict:
    """`service promote`: a canary's rollout goes on to every replica. Conflict when nothing waits for it."""
    _service(conn, job_id, "promote")
    busy = row(conn, "active_update", job_id=job_id)
    if busy is None or busy["state"] != "rolling":
        raise Conflict(f"job {job_id} has no rollout to promote", code="no_update")
    if busy["canary"] is None or busy["promoted_at"] is not None:
        raise Conflict(f"job {job_id}'s revision {busy['revision']} is no canary waiting: it rolls out already",
                       code="not_canary")
    done = one(conn, "promote_update", job_id=job_id, revision=busy["revision"], now=now)
    events.record(conn, now, "service_update_promoted", job_id=job_id, revision=busy["revision"])
    return done


def rollback(conn: apsw.Connection, now: float, job_id: int, why: str = "requested") -> dict:
    """`service rollback`: the rollout under way turns around (its old revision the target again)."""
    _service(conn, job_id, "roll back")
    busy = row(conn, "active_update", job_id=job_id)
    if busy is None or busy["state"] != "rolling":
        raise Conflict(f"job {job_id} has no rollout to roll back", code="no_update")
    return _turn_around(conn, now, busy, why)


def history(conn: apsw.Connection, job_id: int, limit: int = UPDATES_SHOWN) -> dict:
    """GET /v1/jobs/{id}/service: the serving revision, the replicas of each revision, the updates."""
    job = row(conn, "rollout_job", job_id=job_id)
    if job is None:
        raise NotFound(f"no job {job_id}")
    updates = [{**u, "changes": json.loads(u["changes"])} for u in rows(conn, "update_history", job_id=job_id,
                                                                           limit=limit)]
    active = next((u for u in updates if u["state"] in ACTIVE), None)
    return {"job_id": job_id, "revision": job["revision"], "state": job["state"],
            "rollout": active, "replicas": rows(conn, "revision_counts", job_id=job_id), "updates": updates}


def _service(conn: apsw.Connection, job_id: int, what: str) -> dict:
    job = row(conn, "rollout_job", job_id=job_id)
    if job is None:
        raise NotFound(f"no job {job_id}")
    if job["kind"] != "service":
        raise Conflict(f"job {job_id} is a batch job: only a service can {what}", code="not_a_service")
    if job["state"] not in ("queued", "running") or job["reason"] is not None:
        raise Conflict(f"job {job_id} has ended ({job['state']}): there is nothing to {what}", code="job_ended")
    return job


# -- upkeep: the rollout's moves --------------------------------------------------


def under_way(conn: apsw.Connection) -> bool:
    """Whether any rollout is under way (what upkeep reads before it writes)."""
    return row(conn, "any_update_active") is not None


def next_deadline(conn: apsw.Connection) -> float | None:
    """The soonest time a new replica of a rolling rollout turns it around if it is not ready by then (its start
    plus `ready_timeout_s`; `failure`), or None: what upkeep's next tick waits for at most."""
    return one(conn, "next_ready_deadline")["due"]


def advance(conn: apsw.Connection, now: float) -> int:
    """Upkeep: one round of moves for every rollout under way; returns how many moves were made."""
    return sum(step(conn, now, u) for u in rows(conn, "active_updates"))


def step(conn: apsw.Connection, now: float, u: dict) -> int:
    """One round of rollout `u`'s moves (a rollout ends, turns around, drains, surges); the number made."""
    job = row(conn, "rollout_job", job_id=u["job_id"])
    if job is None or job["state"] not in ("queued", "running") or job["reason"] is not None:
        row(conn, "set_update_state", job_id=u["job_id"], revision=u["revision"], state="ended",
            reason="job_ended", now=now)
        return 1
    tasks = rows(conn, "rollout_tasks", job_id=u["job_id"])
    if u["state"] == "rolling":
        why = failure(conn, now, u, tasks)
        if why is not None:
            _turn_around(conn, now, u, why)
            return 1
    target = u["revision"] if u["state"] == "rolling" else u["from_revision"]
    autoscaled = (json.loads(job["spec"]).get("service") or {}).get("autoscale") is not None
    plan = moves(tasks, target, u["max_surge"], u["max_unavailable"], width=None if autoscaled else job["width"],
                 held=canary_waits(u))
    if plan.done:
        _finish(conn, now, u, job)
        return 1
    for task_id in plan.drain:
        service_drain.drain_replica(conn, now, task_id, u["drain_s"], "update")
    for index in plan.add:
        new = one(conn, "insert_revision_task", job_id=job["id"], index=index, attempt=job["attempt"],
                  priority=job["priority"], now=now, revision=target)
        events.record(conn, now, "replica_surged", job_id=job["id"], task_id=new["id"], index=index,
                      revision=target)
    return len(plan.drain) + len(plan.add)


def canary_waits(u: dict) -> bool:
    """Whether rollout `u` is a canary waiting for promote (no old replica leaves meanwhile)."""
    return u["state"] == "rolling" and u["canary"] is not None and u["promoted_at"] is None


@dataclass(frozen=True)
class Plan:
    """One round's moves: `drain` (task ids), `add` (indices to surge a target replica at), `done`."""

    drain: tuple[int, ...] = ()
    add: tuple[int, ...] = ()
    done: bool = False


def moves(tasks: list[dict], target: int, max_surge: int, max_unavailable: int, *, width: int | None = None,
          held: bool = False) -> Plan:
    """What to do now with a service's live replicas `tasks` (rollout_tasks' rows) to bring its indices to
    revision `target`: 0 to `width` - 1 and any other its replicas not draining hold (`width` None: those alone,
    for a service that autoscales, whose count follows its load), with at most their count + `max_surge`
    replicas not draining and at least their count - `max_unavailable` ready at any time; `held` (a canary
    waiting): one new replica at most, none drained."""
    serving = [t for t in tasks if t["drain_deadline"] is None and not t["cancel_requested"]]
    slots = {t["index"] for t in serving} | set(range(width or 0))
    width = len(slots)
    new = [t for t in serving if t["revision"] == target]
    old = [t for t in serving if t["revision"] != target]
    ready = {t["index"] for t in new if _ready(t)}
    if not old and ready >= slots:
        return Plan(done=True)
    served = {t["index"] for t in old if _ready(t)} | ready
    # An old replica whose index a new one serves; one not ready whose index another serves or a new one covers
    # (a replica replaced after its worker was lost, say).
    drain = [t for t in old if t["index"] in ready or not _ready(t) and (
        t["index"] in {n["index"] for n in new} or t["index"] in served)]
    if held:
        drain = [t for t in drain if not _ready(t)]
    left = [t for t in old if t not in drain]
    up = sum(_ready(t) for t in left) + len(ready)
    if not held:  # max_unavailable: an old replica may leave before its new one is ready
        for t in sorted((t for t in left if _ready(t)), key=lambda t: -t["index"]):
            if up - 1 < width - max_unavailable:
                break
            if t["index"] in {n["index"] for n in new}:
                continue
            drain.append(t)
            up -= 1
    live = len(new) + len([t for t in old if t not in drain])
    covered = {t["index"] for t in new}
    gone = {t["index"] for t in drain}
    pending = sorted(slots - covered, key=lambda i: (i not in gone, i))
    add: list[int] = []
    for index in pending:
        if live >= width + max_surge or (held and len(new) + len(add) >= 1):
            break
        add.append(index)
        live += 1
    return Plan(drain=tuple(t["id"] for t in drain), add=tuple(add))


def _ready(task: dict) -> bool:
    return task["state"] == "running" and task["endpoint"] is not None


def failure(conn: apsw.Connection, now: float, u: dict, tasks: list[dict]) -> str | None:
    """Why rollout `u`'s new revision failed, or None: a replica of it that failed, restarted (a crash loop),
    or was not ready `ready_timeout_s` after it started."""
    ended = row(conn, "revision_ended_task", job_id=u["job_id"], revision=u["revision"], since=u["created_at"])
    if ended is not None:
        return f"replica_failed: task {ended['id']} ({ended['reason'] or 'exit ' + str(ended['exit_code'])})"
    for t in tasks:
        if t["revision"] != u["revision"] or t["drain_deadline"] is not None:
            continue
        if t["restarts"]:
            return f"crash_loop: task {t['id']} restarted {t['restarts']} time(s)"
        if t["state"] == "running" and t["endpoint"] is None and now - t["started_at"] >= u["ready_timeout_s"]:
            return f"not_ready: task {t['id']} not ready {u['ready_timeout_s']:g} s after it started"
    return None


def _turn_around(conn: apsw.Connection, now: float, u: dict, why: str) -> dict:
    """Rollout `u` rolls back: its old revision is the target; the new revision's replicas that serve no
    request leave now (the ready ones drain once an old one serves at their index again)."""
    done = one(conn, "set_update_state", job_id=u["job_id"], revision=u["revision"], state="rolling_back",
               reason=why, now=now)
    for t in rows(conn, "rollout_tasks", job_id=u["job_id"]):
        if t["revision"] == u["revision"] and not _ready(t) and t["drain_deadline"] is None:
            service_drain.drain_replica(conn, now, t["id"], 0.0, "rollback")
    events.record(conn, now, "service_update_rolling_back", job_id=u["job_id"], revision=u["revision"],
                  from_revision=u["from_revision"], why=why)
    return done


def _finish(conn: apsw.Connection, now: float, u: dict, job: dict) -> None:
    if u["state"] == "rolling":
        row(conn, "serve_revision", job_id=job["id"], revision=u["revision"], spec=u["spec"])
        row(conn, "set_update_state", job_id=job["id"], revision=u["revision"], state="finished", reason=None,
            now=now)
        events.record(conn, now, "service_update_finished", job_id=job["id"], revision=u["revision"],
                      from_revision=u["from_revision"], seconds=round(now - u["created_at"], 3))
    else:
        row(conn, "set_update_state", job_id=job["id"], revision=u["revision"], state="rolled_back", reason=None,
            now=now)
        events.record(conn, now, "service_update_rolled_back", job_id=job["id"], revision=u["revision"],
                      serving=u["from_revision"], why=u["reason"], seconds=round(now - u["created_at"], 3))


def absorbs(conn: apsw.Connection, now: float, job_id: int, task: dict) -> bool:
    """outcomes.settle: whether the end of `task` (failed or lost) is the rollout's to handle (True), not the
    job's policy (False: an old revision's replica, or no rollout). A replica of the new revision that failed
    turns the rollout around, and the service goes on with its old replicas; one lost with its worker is
    surged again by the rollout's next step (never a retry of the whole attempt, which would stop the old
    replicas that serve); the new revision's replicas ending while it rolls back are what rolling back does."""
    if task["state"] not in ("failed", "lost"):
        return False
    u = row(conn, "active_update", job_id=job_id)
    if u is None or revision_of(conn, task["id"]) != u["revision"]:
        return False
    if task["state"] == "failed" and u["state"] == "rolling":
        _turn_around(conn, now, u, f"replica_failed: task {task['id']} ({task.get('reason') or 'failed'})")
    return True


def revision_of(conn: apsw.Connection, task_id: int) -> int:
    """The revision replica `task_id` runs."""
    return one(conn, "task_revision", task_id=task_id)["revision"]


def canary(conn: apsw.Connection, job_id: int) -> tuple[int, int] | None:
    """(the canary's revision, its percentage) while a canary of job `job_id` waits for promote, else None."""
    u = row(conn, "active_update", job_id=job_id)
    return (u["revision"], u["canary"]) if u is not None and canary_waits(u) else None


__all__ = ["DEFAULT_DRAIN_S", "DEFAULT_READY_TIMEOUT_S", "Plan", "ROLL_FIELDS", "SPEC_CHANGES", "UPDATES_SHOWN", "Update",
           "absorbs", "advance", "canary", "canary_waits", "failure", "history", "moves", "new_spec", "next_deadline",
           "promote",
           "revision_of", "rollback", "start", "step", "under_way"]
