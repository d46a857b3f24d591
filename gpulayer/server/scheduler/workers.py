"""Workers joining, leaving and being cut off, as transactions."""
from __future__ import annotations

import json

import apsw

from gpulayer.server.scheduler import events

from gpulayer.server.scheduler import gpu_health, leases, topology
from gpulayer.server.config import PROTOCOL
from gpulayer.server.errors import Forbidden
from gpulayer.server.security.auth import SERVER_JOIN_JTI
from gpulayer.server.store.queries import one, row, rows


def register(conn: apsw.Connection, *, body: dict, token, session_hash: str, peer_address: str | None, now: float,
             lease_ttl_s: float) -> dict:
    """Insert a worker row for a valid join token; returns {worker_id, advertise_address}.

    A minted token binds the worker's name and labels: asking for a label the token
    does not carry raises Forbidden.
    """
    labels = body["labels"]
    from_server = token.jti == SERVER_JOIN_JTI  # the server's own join token binds no name or labels
    token_labels = {} if from_server else token.labels
    name = body["name"]
    if not from_server:
        foreign = {k: v for k, v in labels.items() if token_labels.get(k) != v}
        if foreign:
            key = sorted(foreign)[0]
            raise Forbidden(f"this join token does not carry the label {key}={foreign[key]}; "
                            f"it carries {json.dumps(token_labels, sort_keys=True)}", code="label_not_allowed")
        labels, name = dict(token_labels), token.name
    res = body["resources"]
    advertise = body.get("advertise_address") or peer_address
    namesake = row(conn, "online_worker_named", name=name)
    wiring = topology.reported(body.get("gpu_topology"), res["gpus"])
    worker_id = one(conn, "register_worker", name=name, labels=json.dumps(labels),
                    token_labels=json.dumps(token_labels), cpus=res["cpus"], gpus=res["gpus"],
                    memory_mb=res["memory_mb"], gpu_models=json.dumps(res["gpu_models"]), slots=body["slots"],
                    advertise_address=advertise, version=body["version"], protocol=PROTOCOL,
                    session_hash=session_hash, token_jti=token.jti, now=now, lease_expires_at=now + lease_ttl_s,
                    isolation=json.dumps(body.get("isolation") or {}),
                    relay=json.dumps(body.get("relay") or {}), gpu_sharing=res.get("gpu_sharing", "off"),
                    gpu_memory_mb=res.get("gpu_memory_mb", 0),
                    gpu_topology=json.dumps(wiring),
                    gpu_nvlink=json.dumps(topology.nvlink_domains(wiring, res["gpus"])))["id"]
    row(conn, "clear_needs_upgrade", name=name, reason="upgraded")
    gpu_health.report(conn, worker_id, body.get("gpus"), now)  # before its first acquire can reserve a broken one
    events.record(conn, now, "worker_registered", worker_id=worker_id, name=name, labels=labels,
                  resources=res, slots=body["slots"], advertise_address=advertise, version=body["version"])
    carried = row(conn, "carry_cordon", worker_id=worker_id, name=name, now=now)
    if carried is not None:  # a drain outlives the agent's restart, as Slurm's outlives slurmd's
        events.record(conn, now, "worker_cordoned", worker_id=worker_id, name=name, reason=carried["reason"],
                      state=carried["state"], carried_from=carried["from_worker"])
    answer = {"worker_id": worker_id, "name": name, "labels": labels, "advertise_address": advertise}
    if namesake is not None:
        # Allowed (a machine that rejoins before its old lease ran out), but two online workers
        # with one name are hard to tell apart in every listing: the joining side is told.
        events.record(conn, now, "worker_name_in_use", worker_id=worker_id, name=name,
                      online_worker_id=namesake["id"])
        answer["warnings"] = [f"a worker named {name!r} is online already (worker {namesake['id']}): unless it is "
                              "this machine's previous run, give this one another --name"]
    return answer


def needs_upgrade(conn: apsw.Connection, *, name: str, version: str | None, protocol: str, token_jti: str | None, now: float) -> None:
    """List a worker refused for another protocol until it registers again (or the server restarts)."""
    row(conn, "clear_needs_upgrade", name=name, reason="superseded")
    row(conn, "mark_needs_upgrade", name=name, version=version, protocol=_int_or_none(protocol),
        token_jti=token_jti, now=now)
    events.record(conn, now, "worker_needs_upgrade", name=name, version=version, protocol=protocol)


def forget_needs_upgrade(conn: apsw.Connection, reason: str) -> None:
    """Clear the whole needs_upgrade list (the server restarted: refused workers will say so again)."""
    row(conn, "clear_needs_upgrade", name=None, reason=reason)


def _int_or_none(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def depart(conn: apsw.Connection, worker_id: int, reason: str, now: float) -> int:
    """The worker is gone for good (deregistered or revoked); returns how many tasks it left."""
    if row(conn, "worker_gone", worker_id=worker_id, reason=reason) is None:
        return 0
    if reason == "deregistered":
        for task in rows(conn, "requeue_never_started", worker_id=worker_id):
            row(conn, "requeue_job_if_idle", job_id=task["job_id"])
            events.record(conn, now, "task_requeued", job_id=task["job_id"], task_id=task["id"],
                          worker_id=worker_id, reason="never_started")
    task_reason = "worker_revoked" if reason == "revoked" else "worker_lost"
    left = leases.finish_leftovers(conn, worker_id, task_reason, now)
    events.record(conn, now, "worker_gone", worker_id=worker_id, reason=reason, tasks_left=left)
    return left


def revoke_token(conn: apsw.Connection, jti: str, now: float) -> dict | None:
    """Revoke a minted token and cut off every worker that joined with it."""
    revoked = row(conn, "revoke_token", jti=jti, now=now)
    if revoked is None:
        return None
    workers = [w["id"] for w in rows(conn, "workers_of_token", jti=jti)]
    for worker_id in workers:
        depart(conn, worker_id, "revoked", now)
    events.record(conn, now, "token_revoked", jti=jti, workers=workers)
    return {"jti": jti, "workers": workers}


def listing(conn: apsw.Connection, include_gone: bool = False, after: int = 0, limit: int = -1) -> list[dict]:
    """Workers with their resources and what is free on them, by id: after `after`, at most `limit` (-1: all)."""
    out = []
    for w in rows(conn, "list_workers", include_gone=int(include_gone), after=after, limit=limit):
        out.append({
            "id": w["worker_id"], "name": w["name"], "state": w["state"], "labels": json.loads(w["labels"]),
            "resources": {"cpus": w["cpus"], "gpus": w["gpus"], "memory_mb": w["memory_mb"],
                          "gpu_models": json.loads(w["gpu_models"]), "gpu_sharing": w["gpu_sharing"],
                          "gpu_memory_mb": w["gpu_memory_mb"]},
            "free": {"slots": w["free_slots"], "gpus": w["free_gpus"], "cpus": w["free_cpus"],
                     "memory_mb": w["free_memory_mb"], "gpu_share_room": w["share_room"]},
            # fractions of a GPU: the GPUs shares hold, and the shares held on them (in GPUs)
            "gpu_shares": {"gpus": w["shared_gpus"], "used": round(w["gpu_share_used"], 6)},
            "slots": w["slots"], "active_tasks": w["active_tasks"], "advertise_address": w["advertise_address"],
            "last_seen_at": w["last_seen_at"], "version": w["version"], "gone_reason": w["gone_reason"],
            "cordon": w["cordon"], "cordon_reason": w["cordon_reason"], "cordoned_at": w["cordoned_at"],
            "drain_deadline": w["drain_deadline"], "gpus": json.loads(w["gpu_health"]),
            "isolation": json.loads(w["isolation"])})
    return out
