"""Lease renewals kept in memory and written to SQL in one statement per flush (heartbeats off the write path).

A heartbeat that changes nothing, and any other request of a worker (acquire,
start, logs, finish, rendezvous), notes "worker W seen at T" in memory
(runtime/renewals.py's Renewals) instead of writing. Upkeep's transaction
(`flush` here, in leases.expire, each upkeep tick: at most one second)
writes every note first, in one statement for the workers and one for
their tasks, and only then judges leases: nothing is judged lost on a stale
SQL value. So a lease in SQL is at most one flush interval (plus the writer's
queue) behind the newest request of its worker. A parked acquire (long poll)
counts as seen when it arrives and when it answers, never while it waits: the
server cannot tell a parked worker from one killed while parked, so renewing
during the wait kept a dead worker online until its acquire's deadline (20 s
past its TTL). An agent that skips its heartbeats while idle asks to park for
at most one heartbeat interval instead (agent/session.py), so an idle worker
makes one request per interval and is lost one TTL after its last one.

A note is forgotten only once the transaction that wrote it has committed
(`flushed`): a failed flush is written again at the next one. A control plane
killed with notes unwritten loses them; its restart gives every lease one TTL
from the start (leases.grace_after_restart), which covers them.
"""
from __future__ import annotations

import json

import apsw

from gpulayer.server.scheduler import events
from gpulayer.server.store.queries import QUERIES, rows



def flush(conn: apsw.Connection, renewals: dict[int, float], lease_ttl_s: float, now: float) -> int:
    """Write the renewals (`pending`) in the writer's transaction at `now`; how many workers they name.

    A worker that went offline and made a request since comes back online
    (`worker_online` at `now`, as a heartbeat would bring it back).
    """
    if not renewals:
        return 0
    params = {"renewals": json.dumps({str(w): at for w, at in renewals.items()}), "lease_ttl_s": lease_ttl_s}
    for back in rows(conn, "flush_offline_renewals", **params):
        events.record(conn, max(now, renewals[back["id"]]), "worker_online", worker_id=back["id"])
    conn.execute(QUERIES["flush_worker_renewals"], params)
    conn.execute(QUERIES["flush_task_renewals"], params)
    return len(renewals)
