"""A service's ingress as the scheduler knows it: its access setting, the replicas that serve now, and who
may go through it (docs/access.md, "Ingress").

The proxy itself (server/relay/ingress.py) runs on the front end's asyncio loop and calls these reads off it,
on the relay's pool, cached a second there; nothing here writes: an HTTP request through the ingress costs
no SQL write, and its bytes are counted in memory (`Counters`, read by GET /metrics).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import apsw

from gpulayer.server.errors import Forbidden, NotFound
from gpulayer.server.scheduler import rollout, sessions, teams
from gpulayer.server.store.queries import row, rows

ACCESS = ("token", "key", "public")


@dataclass(frozen=True)
class Ingress:
    """A service job's ingress: `access` (token, key or public), the key's SHA-256 (hex) for `key`, and the
    replicas that serve now (running, with an endpoint, on an online worker whose agent serves `tcp`)."""

    job_id: int
    state: str
    access: str
    key_sha256: str | None
    replicas: tuple[sessions.Target, ...]
    ports: tuple[int, ...]  # each replica's port, in the task's network view
    # a service that scales to zero (`service.autoscale.min` 0): (cold_start_timeout_s, max_held), else None
    cold_start: tuple[float, int] | None = None
    revisions: tuple[int, ...] = ()  # each replica's revision (a rolling update runs two side by side)
    canary: tuple[int, int] | None = None  # (revision, percent): that share of requests to its replicas


def lookup(conn: apsw.Connection, job_id: int) -> Ingress | None:
    """Job `job_id`'s ingress, or None when there is no such job or it has no ingress."""
    found = row(conn, "ingress_job", job_id=job_id)
    if found is None or found["ingress"] is None:
        return None
    setting = json.loads(found["ingress"])
    replicas, ports, revisions = [], [], []
    if found["state"] == "running":
        for r in rows(conn, "ingress_replicas", job_id=job_id):
            port = _port(r["endpoint"])
            relay = json.loads(r["relay"] or "{}")
            kinds = tuple(k for k in relay.get("kinds") or () if isinstance(k, str))
            if port is None or "tcp" not in kinds:
                continue
            replicas.append(
                sessions.Target(
                    job_id, r["task_id"], r["index"], r["worker_id"], r["worker_name"], kinds, bool(relay.get("no_exec")), r["version"] or "unknown"
                )
            )
            ports.append(port)
            revisions.append(r["revision"])
    scale = json.loads(found["autoscale"]) if found["autoscale"] else None
    cold = (float(scale.get("cold_start_timeout_s", 120)), int(scale.get("max_held", 100))) if scale and scale.get("min") == 0 else None
    canary = rollout.canary(conn, job_id) if len(set(revisions)) > 1 else None
    return Ingress(job_id, found["state"], setting.get("access") or "token", setting.get("key_sha256"), tuple(replicas),
                   tuple(ports), cold, tuple(revisions), canary)


def canary_share(found: Ingress, left: list[int], draw: float) -> list[int]:
    """Of the replicas `left` (indices into found.replicas), those a request goes to: while a canary waits
    (found.canary: its revision and percent), its replicas for a `draw` (uniform in [0, 1)) under the percent
    and the others' above it; any of `left` when that side has none ready (docs/services.md, "Canary")."""
    if found.canary is None:
        return left
    revision, percent = found.canary
    side = [i for i in left if (found.revisions[i] == revision) == (draw * 100 < percent)]
    return side or left


def may_read(conn: apsw.Connection, principal, job_id: int) -> bool:
    """Whether `principal` (a client token's) may read job `job_id`: its owner, its project's managers (and
    members when the project's visibility says so), admins (docs/teams.md)."""
    if principal.kind != "client":
        return False
    try:
        teams.check_job(conn, principal, job_id, "read")
    except (NotFound, Forbidden):
        return False
    return True


def _port(endpoint: str | None) -> int | None:
    """The port of an endpoint `host:port` (`[v6]:port`), None when it has none."""
    _, sep, port = (endpoint or "").rpartition(":")
    return int(port) if sep and port.isdigit() and 0 < int(port) < 65536 else None



__all__ = ["ACCESS", "Ingress", "canary_share", "lookup", "may_read"]
