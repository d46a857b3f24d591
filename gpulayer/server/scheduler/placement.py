"""Placement: which queued task a polling worker gets, as SQL transactions.

Which worker a job fits is one view, `job_worker_fit` (schema.sql): labels,
accelerator, size, secrets, free room now, read through each job's shape
(`shape_worker_fit`). Single tasks are taken with one `UPDATE ... RETURNING`
over the claim views (`claimable_groups`, `claimable_tasks`: the ranking,
`claimable_batch`), which look at queued shapes, not queued tasks (`task_queue`,
kept by triggers), inside the write transaction, so nothing can change in
between, and what the worker cannot take costs nothing: acquire_one for one
task, acquire_task for several at once (the same tasks as one-task claims in a
row); GPU device indices are then reserved from those its other tasks do not hold. Waiting reasons read the same
view, so what a job says it waits for is what acquire does. A multi-node job is placed all at once: when N
distinct online workers have room, every rank is assigned in the same
transaction (the other workers receive theirs on their next acquire), or none
is, so a gang never holds part of the cluster while it waits.
"""
from __future__ import annotations

import json

import apsw

from gpulayer.protocol import DEFAULT_GRACE_S, MAX_GRACE_S
from gpulayer.protocol.assignment import Assignment, CheckpointRef
from gpulayer.protocol.fields import from_wire, to_wire, wire_fields
from gpulayer.protocol.jobspec import JOB_FIELDS
from gpulayer.server.scheduler import checkpoints, events, topology
from gpulayer.server.store.queries import one, row, rows

GANG_CANDIDATES = 8  # queued gangs looked at per acquire: one too wide for the fleet must not block the rest
MAX_TASKS_PER_ACQUIRE = 16  # assignments one acquire (or finish with `next`) may hand out


def acquire(conn: apsw.Connection, worker_id: int, now: float, lease_ttl_s: float) -> int | None:
    """The task id this worker should run next, or None. Idempotent until start."""
    taken = acquire_many(conn, worker_id, now, lease_ttl_s, 1)
    return taken[0] if taken else None


def nothing_for(conn: apsw.Connection, worker_id: int) -> bool:
    """Whether an acquire by this worker would find nothing now: no task queued at all, none assigned to it
    and not started (a read: an idle fleet's acquires skip the writer). A task queued after this read bumps
    the scheduler's generation after its commit, so a parked acquire that read nothing still wakes."""
    return bool(one(conn, "nothing_for_worker", worker_id=worker_id)["idle"])


def acquire_many(conn: apsw.Connection, worker_id: int, now: float, lease_ttl_s: float, max_tasks: int) -> list[int]:
    """Up to `max_tasks` task ids (at most MAX_TASKS_PER_ACQUIRE) for this worker, in one transaction.

    Idempotent until start: the tasks assigned to it and not started yet come
    first (oldest first), then new ones while its free room lasts. With
    `max_tasks` 1 this is the one-task acquire of protocol v1, unchanged: a
    held task is handed out again and nothing new is assigned beside it.
    """
    limit = max(1, min(max_tasks, MAX_TASKS_PER_ACQUIRE))
    taken = [r["id"] for r in rows(conn, "assigned_task_for_worker", worker_id=worker_id, limit=limit)]
    lease = now + lease_ttl_s
    while len(taken) < limit:
        claimed, more = _claim(conn, worker_id, now, lease, limit - len(taken))
        taken += claimed
        if not more:
            break
    return taken


def _claim(conn: apsw.Connection, worker_id: int, now: float, lease: float, most: int) -> tuple[list[int], bool]:
    """Assign up to `most` more queued tasks (a gang's ranks, or single tasks) to the worker, if it has room.

    Their ids, in claim order, and whether another claim may find more. acquire_task takes in one
    statement what as many one-task claims (acquire_one) would, or the first of them, stopping where a
    claim before could change what the next is judged by in a way its running sums do not foresee
    (schema.sql's claimable_batch says where); so fewer than `most` may mean more wait, and the caller
    claims again.
    While a gang waits, one task a claim: after any claim the gang may be the better choice.
    """
    free = row(conn, "worker_free", worker_id=worker_id)
    if free is None or free["free_slots"] <= 0:
        return [], False
    gang_waits = row(conn, "any_queued_gang") is not None
    # each task takes a slot: never more than the free ones (a worker with one free slot: the one-task claim)
    most = 1 if gang_waits else min(most, free["free_slots"])
    # the time the fair-share views decay usage to; the tasks of each group claimable_tasks reads; the worker
    row(conn, "set_claim_worker", now=now, depth=1 if most == 1 else most + 1, worker_id=worker_id)
    if gang_waits:
        gang_task = _place_gang(conn, worker_id, now, lease)
        if gang_task is not None:
            return [gang_task], True
    if most == 1:  # the one-task claim: the same choice, cheaper than ranking and summing (docs/benchmarks/issue-37.md)
        claimed = rows(conn, "acquire_one", worker_id=worker_id, now=now, lease_expires_at=lease,
                       address=free["advertise_address"])
    else:
        claimed = sorted(rows(conn, "acquire_task", worker_id=worker_id, now=now, lease_expires_at=lease,
                              address=free["advertise_address"], max=most), key=lambda t: t["k"])
    for task in claimed:
        _reserve_gpus(conn, task, worker_id, free["gpus"])
        # An array's element counts its own attempts: `element` (its index) tells readers of the log so.
        element = {"element": task["index"]} if task["array_size"] is not None else {}
        events.record(conn, now, "task_assigned", job_id=task["job_id"], task_id=task["id"], worker_id=worker_id,
                      attempt=task["attempt"], **element)
    if claimed:
        row(conn, "mark_jobs_running", job_ids=json.dumps(sorted({t["job_id"] for t in claimed})))
    # Fewer than asked: the claim may have stopped where a claim before could change the next one's judging.
    return [t["id"] for t in claimed], bool(claimed)


def _reserve_gpus(conn: apsw.Connection, task: dict, worker_id: int, worker_gpus: int) -> None:
    """Give an assigned task device indices no other active task on its worker holds: of one NVLink set, PCIe
    switch or NUMA node where the worker has such a free set (scheduler/topology.py; only of one NVLink set
    for a job with `gpu_link` nvlink, as shape_worker_fit counted), else the lowest ones
    (for more than one GPU, whole GPUs only: shape_worker_fit counted no MIG instance for it; for
    a `gpu_model` the worker meets by its GPUs, those of that model only, as shape_worker_fit counted)."""
    # (a job asking no share of a GPU skips shape_worker_fit's read: 0.3 ms a claim, docs/benchmarks/issue-41.md)
    share = row(conn, "task_gpu_share", task_id=task["id"], worker_id=worker_id) if one(
        conn, "job_asks_share", job_id=task["job_id"])["asks"] else None
    if share is not None:
        _reserve_share(conn, task, worker_id, worker_gpus, share["gpu_share"])
        return
    if not task["gpus"]:
        return
    used = {r["i"] for r in rows(conn, "gpus_in_use", worker_id=worker_id)}
    if task["gpus"] > 1:
        used |= {r["i"] for r in rows(conn, "worker_mig_indices", worker_id=worker_id)}
    model = {r["i"] for r in rows(conn, "task_model_indices", task_id=task["id"], worker_id=worker_id)}
    free = [i for i in range(worker_gpus) if i not in used and (not model or i in model)]
    linked = row(conn, "task_nvlink_sets", task_id=task["id"], worker_id=worker_id)
    if len(free) > task["gpus"] or linked is not None:  # a choice to make: by the wiring (scheduler/topology.py)
        wiring = {r["index"]: r for r in json.loads(one(conn, "worker_gpu_topology", worker_id=worker_id)["gpu_topology"])}
        free = (topology.pick(free, task["gpus"], wiring)[0] if linked is None  # `gpu_link` nvlink: one NVLink set
                else topology.pick_linked(free, task["gpus"], wiring, json.loads(linked["gpu_nvlink"])))
    free = free[:task["gpus"]]
    if len(free) < task["gpus"]:  # placement checked the count; a mismatch means corrupt state
        raise RuntimeError(f"worker {worker_id} has {len(free)} free GPU indices, task {task['id']} needs {task['gpus']}")
    row(conn, "set_gpu_indices", task_id=task["id"], gpu_indices=json.dumps(free), gpu_share=0)


def _reserve_share(conn: apsw.Connection, task: dict, worker_id: int, worker_gpus: int, share: float) -> None:
    """Give a fractional task one GPU by best fit: the shared GPU with the least room that still holds its
    share (so that shares fill the fewest GPUs and whole GPUs stay free), else the lowest free GPU; never
    one a whole-GPU task holds (issue 40; shape_worker_fit judged that one of them has room)."""
    held = {r["i"]: r["used"] for r in rows(conn, "gpu_shares_in_use", worker_id=worker_id)}
    used = {r["i"] for r in rows(conn, "gpus_in_use", worker_id=worker_id)}
    model = {r["i"] for r in rows(conn, "task_model_indices", task_id=task["id"], worker_id=worker_id)}
    index = best_fit(held, [i for i in range(worker_gpus) if i not in used], share, model)
    if index is None:  # placement checked the room; a mismatch means corrupt state
        raise RuntimeError(f"worker {worker_id} has no GPU with room for a share of {share:g} (task {task['id']})")
    row(conn, "set_gpu_indices", task_id=task["id"], gpu_indices=json.dumps([index]), gpu_share=min(share, 1.0))


SHARE_EPSILON = 1e-9  # shares that sum to 1 up to rounding fill a GPU (as shape_worker_fit judges)


def best_fit(held: dict[int, float], free: list[int], share: float, model: set[int] | None = None) -> int | None:
    """The GPU a share goes to: of the shared GPUs (`held`: index -> shares held) with room for it, the
    fullest (then the lowest index); else the lowest `free` whole GPU; None when neither (`model`: only
    those indices, when given)."""
    fits = [(-used, i) for i, used in held.items()
            if used + share <= 1 + SHARE_EPSILON and (not model or i in model)]
    if fits:
        return min(fits)[1]
    whole = [i for i in free if not model or i in model]
    return whole[0] if whole else None


def _place_gang(conn: apsw.Connection, worker_id: int, now: float, lease: float) -> int | None:
    for gang in rows(conn, "next_gang_job", worker_id=worker_id, limit=GANG_CANDIDATES):
        workers = [r["worker_id"] for r in rows(conn, "gang_workers", job_id=gang["id"], worker_id=worker_id,
                                                   width=gang["width"], now=now)]
        queued = rows(conn, "queued_tasks_of_attempt", job_id=gang["id"], attempt=gang["attempt"])
        if len(workers) == gang["width"] and workers[0] == worker_id and len(queued) == gang["width"]:
            return _assign_gang(conn, gang, workers, queued, now, lease)
    return None


def _assign_gang(conn: apsw.Connection, gang: dict, workers: list[int], queued: list[dict], now: float, lease: float) -> int:
    for task, target in zip(queued, workers):
        taken = one(conn, "assign_task", task_id=task["id"], worker_id=target, now=now, lease_expires_at=lease)
        _reserve_gpus(conn, taken, target, one(conn, "worker_free", worker_id=target)["gpus"])
        events.record(conn, now, "task_assigned", job_id=gang["id"], task_id=task["id"], worker_id=target,
                      attempt=gang["attempt"], rank=task["index"])
    row(conn, "mark_job_running", job_id=gang["id"])
    events.record(conn, now, "gang_placed", job_id=gang["id"], attempt=gang["attempt"], workers=workers)
    return queued[0]["id"]


def assignment(conn: apsw.Connection, task_id: int, secret_env=None,
               max_grace_s: float = MAX_GRACE_S) -> dict:
    """The Assignment a worker receives for `task_id` (docs/protocol.md), as its JSON object.

    `secret_env(names) -> {name: value}` resolves the job's secrets into its environment; the job's
    grace is at most `max_grace_s` (the server's `--max-grace`, lowered since its submit maybe).
    """
    found = one(conn, "assignment", task_id=task_id)
    spec = json.loads(found["spec"])
    gang = bool(found["gang"])
    return to_wire(Assignment(
        **_job_fields(spec), grace_seconds=stop_grace(spec, max_grace_s),
        task_id=found["task_id"], job_id=found["job_id"], attempt=found["attempt"],
        index=found["index"],
        env={**spec["env"], **(secret_env(spec["secrets"]) if secret_env and spec["secrets"] else {}),
             **({"GPULAYER_PREEMPTED": "1"} if row(conn, "task_was_preempted", task_id=task_id) else {})},
        gpus=json.loads(found["gpu_indices"]), gpu_share=found["gpu_share"],
        rank=found["index"] if gang else 0, world_size=found["width"] if gang else 1,
        # An array's element: its index (also `index`) and the array's element count; null otherwise.
        array_index=found["index"] if found["array_size"] is not None else None,
        array_size=found["array_size"],
        # The number of the task's next log line: a task run again (after a preemption, a gang sent back
        # to the queue) numbers its lines after those stored, which (task_id, n) would otherwise drop.
        log_base=one(conn, "task_log_base", task_id=task_id)["n"],
        checkpoint=_checkpoint(conn, found["job_id"], found["index"]),
    ))


def _checkpoint(conn: apsw.Connection, job_id: int, index: int) -> CheckpointRef | None:
    """The newest complete checkpoint of the element or rank, for the agent to restore (checkpoints.latest)."""
    found = checkpoints.latest(conn, job_id, index)
    return None if found is None else CheckpointRef(**found)
def stop_grace(spec: dict, max_grace_s: float) -> float | None:
    """A job's grace between a planned stop's signal and SIGKILL: its `grace_seconds`, else DEFAULT_GRACE_S
    for a job with a `signal`, within `max_grace_s`; None (the agent's own rule) for a job with neither."""
    grace = spec.get("grace_seconds")
    if grace is None and spec.get("signal"):
        grace = DEFAULT_GRACE_S
    return None if grace is None else min(float(grace), max_grace_s)


#: The Assignment's fields that are the job's own, under the JobSpec's name (command, source, cpus, service,
#: network, ...): copied from the stored spec. `env` (with the job's secrets) and `gpus` (the devices
#: reserved, not the job's count) are made by `assignment()`. docs/architecture.md, "Adding a field".
JOB_OWN_FIELDS = tuple(f for f in wire_fields(Assignment)
                       if f.name in JOB_FIELDS and f.name not in ("env", "gpus", "grace_seconds"))


def _job_fields(spec: dict) -> dict:
    """The JOB_OWN_FIELDS of a stored spec: a declared object (`service`) as one; a field the spec lacks
    (stored before the field was declared) as the Assignment's default."""
    out = {}
    for f in JOB_OWN_FIELDS:
        value = spec.get(f.name, f.default)
        out[f.name] = from_wire(f.inner, value) if f.inner is not None and value is not None else value
    return out
