"""Autoscaling: a service's replicas follow the requests in flight through its ingress (issue 39, point 1).

Upkeep's `autoscale` step (services.Services.autoscale) reads the live services that autoscale
(`services`), samples each one's requests in flight through the ingress (the proxy's counts per replica, and
the requests it holds for a service at zero; runtime/autoscale.py keeps the samples) and `decide`s: replicas
are added when every sample of the last `up_after_s` was over `target_concurrency` per replica, to as many as
the window's mean load needs (one step: a load of four times one replica's target asks for four); removed
when every sample of the last `down_after_s` was under, to as few as the window's highest load needs (zero
for an idle service with `min` 0), and only while no replica is starting (placed, its port not answering yet:
it is never removed for a load measured without it; one still queued, which no worker takes, may be);
brought up to `min` at once. `apply` makes a decision in one transaction
against the replicas as they are then: added replicas are new queued tasks of the current attempt (placed as
any task is: quotas, priority, fair share, reservations), removed ones the newest, drained
(service_drain.py: their requests in flight finish first). Each decision is a `service_scaling` row and a
`service_scaled` event (from, to, why, the measured load). A restarted control plane waits a full window.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import apsw

from gpulayer.server.scheduler import events, service_drain
from gpulayer.server.store.queries import one, row, rows

#: The job read's `scaling`: this many latest decisions.
SHOWN = 20


@dataclass(frozen=True)
class Replica:
    task_id: int
    index: int
    state: str
    ready: bool
    draining: bool


@dataclass(frozen=True)
class Service:
    """A live service that autoscales, as one tick reads it."""

    job_id: int
    state: str
    scale: dict  # its `service.autoscale`, validated at submit
    replicas: tuple[Replica, ...]  # its current attempt's live tasks, draining ones included

    @property
    def live(self) -> list[Replica]:
        """The replicas that count: live and not draining."""
        return [r for r in self.replicas if not r.draining]

    @property
    def ready(self) -> int:
        return sum(r.ready for r in self.live)


@dataclass(frozen=True)
class Decision:
    to: int
    why: str   # up, down, zero, min (wake: scale from zero for a held request, services.Services.wake)
    load: float  # requests in flight per ready replica (the window's mean, or highest going down)
    in_flight: float


def services(conn: apsw.Connection) -> list[Service]:
    """The live services that autoscale, with their replicas."""
    found = []
    for r in rows(conn, "autoscaled_services"):
        replicas = tuple(Replica(t[0], t[1], t[2], bool(t[3]), bool(t[4])) for t in json.loads(r["replicas"] or "[]"))
        found.append(Service(r["id"], r["state"], json.loads(r["autoscale"]), replicas))
    return found


def decide(service: Service, up: list[int] | None, down: list[int] | None) -> Decision | None:
    """What to do with `service` given its samples of requests in flight over the last `up_after_s` (`up`) and
    `down_after_s` (`down`); None (a window not yet full) decides nothing that way. None: nothing to do."""
    scale, n = service.scale, len(service.live)
    lo, hi, target = scale["min"], scale["max"], float(scale["target_concurrency"])
    ready = max(service.ready, 1)
    if n < lo:
        return Decision(lo, "min", 0.0, 0.0)
    if n > hi:
        return Decision(hi, "down", 0.0, 0.0)
    if up and n < hi and min(up) > target * n:
        mean = sum(up) / len(up)
        return Decision(min(hi, max(n + 1, math.ceil(mean / target - 1e-9))), "up", mean / ready, mean)
    starting = sum(r.state in ("assigned", "running") and not r.ready for r in service.live)
    if down and n > lo and not starting:  # never while a replica is starting (it may be needed); a queued one may go
        peak = max(down)
        want = max(lo, math.ceil(peak / target - 1e-9))
        if want < n:
            return Decision(want, "zero" if want == 0 else "down", peak / ready, peak)
    return None


def apply(conn: apsw.Connection, now: float, job_id: int, expected: int, decision: Decision, ready: int) -> dict | None:
    """Scale service `job_id` from `expected` live replicas to `decision.to`: new queued tasks of its current
    attempt, or the newest drained; None when its replicas changed since the read (nothing done)."""
    live = rows(conn, "service_live_replicas", job_id=job_id)
    job = row(conn, "job_for_update", job_id=job_id)
    if job is None or job["state"] not in ("queued", "running") or job["kind"] != "service" or len(live) != expected:
        return None
    spec = json.loads(one(conn, "get_job", job_id=job_id)["spec"])
    scale = spec["service"].get("autoscale") or {}
    added, drained = [], []
    if decision.to > expected:
        used = {r["index"] for r in rows(conn, "service_used_indices", job_id=job_id)}
        free = (i for i in range(len(used) + decision.to + 1) if i not in used)
        for _ in range(decision.to - expected):
            made = one(conn, "insert_task", job_id=job_id, index=next(free), attempt=job["attempt"],
                       priority=job["priority"], now=now)
            added.append(made["id"])
    else:
        for replica in live[:expected - decision.to]:
            if service_drain.drain_replica(conn, now, replica["id"], scale.get("drain_timeout_s", 30.0),
                                           "scale_down") is not None:
                drained.append(replica["id"])
    one(conn, "insert_service_scaling", job_id=job_id, now=now, from_replicas=expected, to_replicas=decision.to,
        why=decision.why, load=round(decision.load, 3), in_flight=round(decision.in_flight), ready=ready)
    events.record(conn, now, "service_scaled", job_id=job_id, **{"from": expected}, to=decision.to, why=decision.why,
                  load=round(decision.load, 3), in_flight=round(decision.in_flight, 3), ready=ready,
                  target=scale.get("target_concurrency"), added=added, drained=drained)
    return {"job_id": job_id, "from": expected, "to": decision.to, "why": decision.why, "added": added,
            "drained": drained}


def wake(conn: apsw.Connection, now: float, job_id: int, held: int) -> dict | None:
    """A request through the ingress for service `job_id` at zero (`min` 0, no live replica): one replica now
    (`why` wake), for the `held` requests; None when it has a live replica already (one on its way) or is no
    running service that scales to zero."""
    job = row(conn, "get_job", job_id=job_id)
    if job is None or job["state"] not in ("queued", "running") or job["kind"] != "service":
        return None
    scale = json.loads(job["spec"])["service"].get("autoscale") or {}
    if scale.get("min") != 0 or rows(conn, "service_live_replicas", job_id=job_id):
        return None
    return apply(conn, now, job_id, 0, Decision(1, "wake", float(held), float(held)), 0)


def view(conn: apsw.Connection, job: dict) -> dict | None:
    """The job read's `scaling` for a service that autoscales (else None): its live replicas now (`replicas`,
    draining ones left out; `ready`: in the ingress's set) and its latest decisions, oldest first (`history`:
    replicas over time)."""
    if job["kind"] != "service" or json.loads(job["spec"]).get("service", {}).get("autoscale") is None:
        return None
    now = one(conn, "service_replicas_now", job_id=job["id"])
    return {"replicas": now["replicas"], "ready": now["ready"], "draining": now["draining"],
            "history": list(reversed(rows(conn, "service_scaling_of", job_id=job["id"], limit=SHOWN)))}


__all__ = ["Decision", "Replica", "Service", "apply", "decide", "services", "view", "wake"]
