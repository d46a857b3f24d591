"""Per-GPU health as the agents report it (NVML), and the operator's gpu-reset, as transactions.

The agent sends `gpus: [{index, uuid, healthy, reason}]` at register and in
every heartbeat. A GPU reported unhealthy is stored so (`worker_gpus`) and
stays so, whatever later reports say, until its agent registers again (a new
worker row) or an operator resets it: placement reserves no unhealthy index
(`worker_load.free_gpus`, `gpus_in_use`). The active tasks holding it are asked
to stop in the same transaction (their worker hears `cancel_task_ids` in the
answer of that heartbeat); they hold their GPUs until the worker reports them
ended, and then end lost with reason `gpu_unhealthy`, retried as `worker_lost`.
"""
from __future__ import annotations

import json

import apsw

from gpulayer.server.errors import Conflict, NotFound
from gpulayer.server.scheduler import events
from gpulayer.server.store.queries import row, rows


def report(conn: apsw.Connection, worker_id: int, gpus: list[dict] | None, now: float) -> list[int]:
    """Store what the agent reports; returns the indices whose reset it has yet to hear (to tell it).

    A report of an index the worker did not register is ignored. A reset stays
    pending, and is told in every heartbeat answer, until the agent shows it
    heard: it echoes the reset (`reset_applied` in that GPU's report) or reports
    the GPU healthy. So a lost answer loses no reset. While a reset is pending,
    an unhealthy report of that GPU is ignored: it was made before the agent
    applied the reset. The echo is read first, so a fault reported with it (a
    new one, after the reset) counts. An agent that reports no `gpus` cannot
    mark a GPU again: its resets are told once.
    """
    known = {g["index"]: g for g in rows(conn, "worker_gpus_of", worker_id=worker_id)}
    # A stored row's index was checked when stored: the worker's GPU count is read only for a new index.
    new = gpus and any(g["index"] not in known for g in gpus)
    count = (row(conn, "worker_gpu_count", worker_id=worker_id) or {"gpus": 0})["gpus"] if new else len(known)
    failed = []
    for gpu in gpus or []:
        index = gpu["index"]
        before = known.get(index)
        if before is None and index >= count:
            continue
        if before is not None and before["reset_pending"] and (gpu["healthy"] or gpu.get("reset_applied")):
            row(conn, "reset_heard", worker_id=worker_id, index=index)
            before = known[index] = {**before, "reset_pending": 0}
        if before is None or (before["healthy"] and not gpu["healthy"] and not before["reset_pending"]):
            healthy, reason = gpu["healthy"], None if gpu["healthy"] else gpu["reason"] or "reported unhealthy"
        elif before["uuid"] != gpu["uuid"] and gpu["uuid"]:
            healthy, reason = bool(before["healthy"]), before["reason"]  # the same health, the UUID learnt
        else:
            continue
        row(conn, "put_worker_gpu", worker_id=worker_id, index=index, uuid=gpu["uuid"], healthy=int(healthy),
            reason=reason, now=now)
        if not healthy and (before is None or before["healthy"]):
            failed.append((index, gpu["uuid"], reason))
    resets = sorted(i for i, g in known.items() if g["reset_pending"])
    if resets and gpus is None:
        row(conn, "reset_told", worker_id=worker_id)
    if failed:
        _lose_tasks(conn, worker_id, failed, now)
    return resets


def _lose_tasks(conn: apsw.Connection, worker_id: int, failed: list[tuple], now: float) -> None:
    """The tasks on GPUs that just failed: their worker is asked to stop them (gpu_tasks_stop).

    They keep every GPU index they hold, the healthy ones too, until the worker
    reports them ended (lifecycle.finish settles them lost, `gpu_unhealthy`), so
    no new task is given a GPU that the old process may still be using.
    """
    stopping = rows(conn, "gpu_tasks_stop", worker_id=worker_id, indices=json.dumps([i for i, _, _ in failed]))
    for index, uuid, reason in failed:
        events.record(conn, now, "gpu_unhealthy", worker_id=worker_id, index=index, uuid=uuid, reason=reason,
                      tasks=[t["id"] for t in stopping])
    for task in stopping:
        events.record(conn, now, "task_stop_requested", job_id=task["job_id"], task_id=task["id"],
                      worker_id=worker_id, reason="gpu_unhealthy")


def reset(conn: apsw.Connection, worker: dict, index: int, now: float) -> dict:
    """`gpulayer worker gpu-reset`: mark GPU `index` of `worker` (cordons.resolve) healthy again.

    Returns the worker's GPUs. Raises NotFound for no such GPU, Conflict for a worker that is gone.
    """
    if worker["state"] == "gone":
        raise Conflict(f"worker {worker['name']} (id {worker['id']}) is gone: start its agent again instead",
                       code="worker_gone")
    found = row(conn, "reset_worker_gpu", worker_id=worker["id"], index=index, now=now)
    if found is None:
        raise NotFound(f"worker {worker['name']} (id {worker['id']}) reported no GPU {index}")
    events.record(conn, now, "gpu_reset", worker_id=worker["id"], index=index, uuid=found["uuid"])
    return {"worker_id": worker["id"], "name": worker["name"], "gpus": listing(conn, worker["id"])}


def listing(conn: apsw.Connection, worker_id: int) -> list[dict]:
    """The worker's GPUs: `[{index, uuid, healthy, reason, changed_at}]`."""
    return [{"index": g["index"], "uuid": g["uuid"], "healthy": bool(g["healthy"]), "reason": g["reason"],
             "changed_at": g["changed_at"]} for g in rows(conn, "worker_gpus_of", worker_id=worker_id)]
