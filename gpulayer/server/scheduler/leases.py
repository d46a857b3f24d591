"""Leases are timestamps: heartbeats move them on, upkeep expires them."""
from __future__ import annotations

import json

import apsw

from gpulayer.server.scheduler import events

from gpulayer.server.scheduler import chunks, gpu_health, jobcontrol, ledger, outcomes, preemption, reconcile, renewals
from gpulayer.server.store.queries import QUERIES, row, rows


def heartbeat(conn: apsw.Connection, worker_id: int, reported: list[dict], now: float, lease_ttl_s: float,
              gpus: list[dict] | None = None, restored: reconcile.Restored | None = None) -> dict:
    """Renew the worker's leases; answer which of its tasks to kill and whether it was revoked.

    `gpus`, the agent's per-GPU health (optional), goes to gpu_health.report first: the tasks
    of a GPU that just failed are lost there and so named in `cancel_task_ids`; GPUs an operator
    reset since are answered in `reset_gpus` (only when there are some). The reported tasks are
    reconciled with the state first (reconcile.reported; `restored` after a restore from a replica).
    """
    lease = now + lease_ttl_s
    before = row(conn, "worker_state", worker_id=worker_id)
    worker = row(conn, "renew_worker", worker_id=worker_id, now=now, lease_expires_at=lease)
    if worker is None or worker["state"] == "gone":
        return {"cancel_task_ids": sorted({t["task_id"] for t in reported}),
                "revoked": bool(worker and worker["gone_reason"] == "revoked"), "lease_expires_at": None}
    if before and before["state"] == "offline":
        events.record(conn, now, "worker_online", worker_id=worker_id)
    conn.execute(QUERIES["renew_task_leases"], {"worker_id": worker_id, "lease_expires_at": lease})
    resets = gpu_health.report(conn, worker_id, gpus, now)
    for task in reported:
        changed = row(conn, "report_task", task_id=task["task_id"], worker_id=worker_id,
                      endpoint=task.get("endpoint"), restarts=task.get("restarts") or 0)
        if changed is not None:
            events.record(conn, now, "task_reported", job_id=changed["job_id"], task_id=changed["id"],
                          worker_id=worker_id, endpoint=changed["endpoint"], restarts=changed["restarts"])
    reconcile.reported(conn, worker_id, reported, now, lease, restored)
    held = rows(conn, "worker_active_tasks", worker_id=worker_id)
    active = {t["id"]: t["cancel_requested"] for t in held}
    cancel = {t["task_id"] for t in reported if active.get(t["task_id"], 1)}
    cancel |= {task_id for task_id, wanted in active.items() if wanted}
    answer = {"cancel_task_ids": sorted(cancel), "revoked": False, "lease_expires_at": lease}
    limits = time_limits(reported, {t["id"]: t["timeout_seconds"] for t in held})
    if limits:
        answer["time_limits"] = limits
    if any(active.values()):  # some are to be stopped: say which for a preemption (and its grace), a requeue
        answer.update(preemption.heartbeat_fields(conn, worker_id))
        answer.update(jobcontrol.heartbeat_fields(conn, worker_id))
    if resets:
        answer["reset_gpus"] = resets
    return answer


def unchanged(conn: apsw.Connection, worker_id: int, reported: list[dict], now: float, lease_ttl_s: float,
              gpus: list[dict] | None = None) -> dict | None:
    """A heartbeat's answer from a read, when `heartbeat` would change nothing but the leases.

    None (take the write path) unless the worker is online, holds every task it
    reports with the same endpoint and restarts, and its GPU report changes no
    stored health (no new fault, no new UUID, no reset pending). The caller notes
    the renewal (renewals.Renewals.note). One statement reads it all (a snapshot of
    its own: Store.read_statement); when some task is to be cancelled, the caller
    reads again in a transaction, where the preemption fields are added from the
    same snapshot (as `heartbeat` answers them).
    """
    view = row(conn, "heartbeat_view", worker_id=worker_id)
    if view is None or view["state"] != "online" or not _same_gpus(json.loads(view["gpus"]), gpus):
        return None
    active = {t[0]: t for t in json.loads(view["tasks"])}   # id, state, cancel_requested, endpoint, restarts, limit
    for task in reported:
        held = active.get(task["task_id"])
        if held is None:
            return None  # a task this worker does not hold: the write path answers it (and reconciles it)
        if held[1] == "running" and (held[3] != task.get("endpoint") or held[4] != (task.get("restarts") or 0)):
            return None
    cancel = sorted(task_id for task_id, held in active.items() if held[2])
    answer = {"cancel_task_ids": cancel, "revoked": False, "lease_expires_at": now + lease_ttl_s}
    limits = time_limits(reported, {task_id: held[5] for task_id, held in active.items()})
    if limits:
        answer["time_limits"] = limits
    if cancel and not conn.getautocommit():
        answer.update(preemption.heartbeat_fields(conn, worker_id))
        answer.update(jobcontrol.heartbeat_fields(conn, worker_id))
    return answer


def time_limits(reported: list[dict], now_limits: dict[int, float | None]) -> list[dict]:
    """`time_limits` of a heartbeat's answer: [{task_id, timeout_seconds}] of each reported task whose
    echoed `timeout_seconds` (the limit its agent enforces) is not its job's time limit now (`job update
    --time` changed it while it ran). An agent that echoes none (an older one) is told none."""
    changed = []
    for task in reported:
        if "timeout_seconds" not in task or task["task_id"] not in now_limits:
            continue
        limit = now_limits[task["task_id"]]
        enforced = task["timeout_seconds"]
        if (limit is None) != (enforced is None) or (limit is not None and abs(float(limit) - enforced) > 1e-6):
            changed.append({"task_id": task["task_id"], "timeout_seconds": limit})
    return changed


def _same_gpus(stored: list[list], gpus: list[dict] | None) -> bool:
    """True when gpu_health.report would store nothing and tell no reset (`stored`: index, uuid, healthy,
    reset_pending of each GPU the worker has stored)."""
    known = {g[0]: g for g in stored}
    if any(g[3] for g in known.values()):
        return False
    for gpu in gpus or []:
        before = known.get(gpu["index"])
        if before is None or (before[2] and not gpu["healthy"]) or (gpu["uuid"] and before[1] != gpu["uuid"]):
            return False
    return True


def expire(conn: apsw.Connection, now: float, start_timeout_s: float, renewed: dict[int, float] | None = None,
           lease_ttl_s: float = 0.0) -> dict:
    """Upkeep's one transaction: expired leases, silent workers, stale gangs; how many of each.

    The renewals noted in memory (`renewed`: renewals.Renewals.pending) are written first, in the
    same transaction, so no lease is judged on a value one flush behind its worker's last request.

    Elements leased ahead whose lease passed go back to the queue, same attempt (chunks.requeue_expired);
    tasks whose lease passed are lost (and retried or ended), their workers go
    offline, and gangs with a rank not started within `start_timeout_s` go back
    to the queue whole. A preemption's victim among them goes back to the queue
    as preempted, same attempt (preemption.requeue_lost): it was being stopped anyway.
    """
    renewals.flush(conn, renewed or {}, lease_ttl_s, now)
    chunks.requeue_expired(conn, now)  # never started there: back to the queue, same attempt
    preemption.requeue_lost(conn, now)
    lost = rows(conn, "expire_task_leases", now=now)
    for task in lost:
        events.record(conn, now, "task_lost", job_id=task["job_id"], task_id=task["id"], worker_id=task["worker_id"],
                      reason="worker_lost", lease_expired=True)
    for task in lost:
        outcomes.settle(conn, now, task["job_id"], task["attempt"],
                        {"id": task["id"], "state": "lost", "reason": "worker_lost", "exit_code": None})
    offline = rows(conn, "expire_workers", now=now)
    for worker in offline:
        events.record(conn, now, "worker_offline", worker_id=worker["id"], name=worker["name"])
    return {"tasks_lost": len(lost), "workers_offline": len(offline),
            "gangs_released": release_stale_gangs(conn, now, start_timeout_s)}


def release_stale_gangs(conn: apsw.Connection, now: float, start_timeout_s: float) -> int:
    """Gangs with a rank not started in time go back to the queue whole; returns how many."""
    stale = rows(conn, "stale_gang_tasks", deadline=now - start_timeout_s)
    for gang in stale:
        release_gang(conn, now, gang["job_id"], gang["attempt"], "start_timeout")
    return len(stale)


def release_gang(conn: apsw.Connection, now: float, job_id: int, attempt: int, reason: str,
                 ranks: list[dict] | None = None) -> None:
    """A gang's attempt goes back to the queue whole, same attempt (`ranks`: its attempt_tasks, when read
    already): runs that started are written to the ledger as requeued, workers told to stop theirs."""
    ranks = ranks if ranks is not None else rows(conn, "attempt_tasks", job_id=job_id, attempt=attempt)
    ledger.record(conn, now, [r["id"] for r in ranks if r["state"] == "running"], outcome="requeued")
    released = rows(conn, "release_attempt", job_id=job_id, attempt=attempt)
    conn.execute(QUERIES["clear_rendezvous"], {"job_id": job_id, "attempt": attempt})
    row(conn, "requeue_job", job_id=job_id)
    events.record(conn, now, "gang_released", job_id=job_id, attempt=attempt, reason=reason,
                  workers=[r["worker_id"] for r in released])


def finish_leftovers(conn: apsw.Connection, worker_id: int, reason: str, now: float) -> int:
    """A worker leaves (deregister, revoke): what it held is lost, for the retry policy to judge
    (a preemption's victim goes back to the queue, same attempt: preemption.requeue_lost; an element
    leased ahead, never started there, too: chunks.requeue)."""
    chunks.requeue(conn, worker_id, now, reason)
    preemption.requeue_lost(conn, now, worker_id)
    held = rows(conn, "worker_tasks_lost", worker_id=worker_id, reason=reason, now=now)
    for task in held:
        events.record(conn, now, "task_lost", job_id=task["job_id"], task_id=task["id"], worker_id=worker_id,
                      reason=reason)
        outcomes.settle(conn, now, task["job_id"], task["attempt"],
                        {"id": task["id"], "state": "lost", "reason": reason, "exit_code": None})
    return len(held)


def grace_after_restart(conn: apsw.Connection, now: float, lease_ttl_s: float) -> dict:
    """At start-up: no lease expires within one TTL of now, because the server, not the workers, was away.

    Without this, a control plane down for longer than the TTL (an upgrade, a
    crash) would lose, and retry, every task on workers that never stopped.
    """
    until = now + lease_ttl_s
    tasks = rows(conn, "grace_task_leases", until=until)
    workers = rows(conn, "grace_worker_leases", until=until)
    if tasks or workers:
        events.record(conn, now, "leases_extended", reason="server_started", tasks=len(tasks),
                      workers=len(workers), until=until)
    return {"tasks": len(tasks), "workers": len(workers)}
