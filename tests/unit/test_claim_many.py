"""acquire_task claims up to max_tasks tasks in one statement (issue 23): exactly the tasks, in the order,
that as many one-task claims in a row took before, against a real state file: quotas and borrowing,
running-jobs limits, fair share, priorities, replicas, arrays and their %N caps, mixed sizes."""
from __future__ import annotations

import json
import random

import pytest

from gpulayer.server.scheduler import placement, teams
from gpulayer.server.security.auth import Principal
from gpulayer.server.store import db
from gpulayer.server.store.queries import QUERIES, row, rows
from helpers import add_worker, job

LEASE = 3.0
# The one-task claim as it stood before the claim views (issue 37): the reference the views' claims are held
# to, frozen here so that a change of claimable_tasks cannot move the reference with it.
ACQUIRE_ONE_BEFORE_VIEWS = """
UPDATE tasks
SET state = 'assigned', worker_id = :worker_id, assigned_at = :now, lease_expires_at = :lease_expires_at,
    address = :address
WHERE id = (
    WITH fit AS MATERIALIZED (  -- the groups of queued work the worker could take a task of now
        SELECT q.* FROM shapes s INDEXED BY shapes_queued
        JOIN shape_worker_fit f ON f.shape_id = s.id AND f.worker_id = CAST(:worker_id AS INTEGER)
        CROSS JOIN queue_group_quota q ON q.shape_id = s.id
        WHERE s.queued > 0 AND s.gang = 0 AND f.fits_now
          AND (NOT EXISTS (SELECT 1 FROM gang_reservations r
                           WHERE r.worker_id = CAST(:worker_id AS INTEGER) AND r.expires_at > :now)
               OR (SELECT l.free_slots - count(*) >= 1 AND l.free_gpus - total(r.gpus) >= s.gpus
                          AND l.free_cpus - total(r.cpus) >= s.cpus
                          AND l.free_memory_mb - total(r.memory_mb) >= s.memory_mb
                   FROM gang_reservations r, worker_load l
                   WHERE r.worker_id = CAST(:worker_id AS INTEGER) AND r.expires_at > :now
                     AND l.worker_id = CAST(:worker_id AS INTEGER)))
    )
    SELECT h.task_id FROM fit g
    JOIN task_queue h ON h.task_id = (
        SELECT b.task_id FROM task_queue b
        WHERE b.shape_id = g.shape_id AND b.project_id = g.project_id AND b.user_id = g.user_id
          AND (NOT EXISTS (SELECT 1 FROM tasks o  -- +o.job_id: by the worker's few tasks, not the job's (an array's many)
                           WHERE o.worker_id = CAST(:worker_id AS INTEGER) AND +o.job_id = b.job_id
                             AND o.state IN ('assigned', 'running'))
               OR (SELECT x.array_size FROM jobs x WHERE x.id = b.job_id) IS NOT NULL)
        ORDER BY b.priority + b.aged DESC, b.task_id
        LIMIT 1)
    WHERE (g.nominal_left IS NULL OR g.nominal_left >= 0
           OR (g.nominal_left + g.borrow >= 0
               AND NOT EXISTS (SELECT 1 FROM fit o WHERE o.project_id <> g.project_id AND o.nominal_left >= 0)))
      AND ((SELECT j.state = 'running' AND j.array_size IS NULL FROM jobs j WHERE j.id = h.job_id)
           OR NOT coalesce((SELECT u.at_limit FROM user_running_jobs u WHERE u.user_id = g.user_id), 0))
    ORDER BY h.priority + h.aged DESC,
             (SELECT u.usage FROM project_fair_share u WHERE u.project_id = g.project_id),
             (SELECT u.usage FROM user_fair_share u WHERE u.project_id = g.project_id AND u.user_id = g.user_id),
             h.task_id
    LIMIT 1
)
RETURNING id, job_id, "index", attempt, (SELECT gpus FROM jobs WHERE jobs.id = tasks.job_id) AS gpus,
          (SELECT array_size FROM jobs WHERE jobs.id = tasks.job_id) AS array_size
"""


def _project(sched, name, **settings):
    sched.change_teams(teams.add_project, {"name": name, "max_priority": 10, **settings})


def _user(sched, name, *projects, max_running_jobs=None) -> Principal:
    user_id = sched.change_teams(teams.add_user, name, False, [(p, "member") for p in projects], max_running_jobs)
    return Principal(kind="client", jti=f"jti-{name}", name=name, user_id=user_id, user=name, admin=False)


def _reference(conn, worker_id: int, now: float, most: int) -> list[int]:
    """The claims as they were: one task a statement (acquire_one before the claim views, the gang-free path
    of the old acquire_many)."""
    taken: list[int] = []
    row(conn, "set_claim_clock", now=now, depth=1)
    while len(taken) < most:
        free = row(conn, "worker_free", worker_id=worker_id)
        if free is None or free["free_slots"] <= 0:
            break
        got = [dict(r) for r in conn.execute(ACQUIRE_ONE_BEFORE_VIEWS, {"worker_id": worker_id, "now": now,
                                                                          "lease_expires_at": now + LEASE, "address": None})]
        if not got:
            break
        placement._reserve_gpus(conn, got[0], worker_id, free["gpus"])
        row(conn, "mark_job_running", job_id=got[0]["job_id"])
        taken.append(got[0]["id"])
    return taken


def _both(sched, worker_id: int, most: int) -> tuple[list[int], list[int], int, dict]:
    """(the reference's claims, rolled back; acquire_many's, kept; claim statements run; GPU indices)."""
    claims = {QUERIES["acquire_task"].strip(), QUERIES["acquire_one"].strip()}

    def run(conn):
        conn.execute("SAVEPOINT reference")
        old = _reference(conn, worker_id, sched.clock(), most)
        conn.execute("ROLLBACK TO reference")
        conn.execute("RELEASE reference")
        statements = []
        conn.exec_trace = lambda cursor, sql, bindings: statements.append(sql) or True
        try:
            new = placement.acquire_many(conn, worker_id, sched.clock(), LEASE, most)
        finally:
            conn.exec_trace = None
        gpus = {r["id"]: json.loads(r["gpu_indices"]) for r in conn.execute(
            "SELECT id, gpu_indices FROM tasks WHERE worker_id = ? AND state = 'assigned'", (worker_id,)).fetchall()}
        return old, new, sum(1 for s in statements if s.strip() in claims), gpus
    return sched.store.write(run)


def _scenario(sched, rng: random.Random) -> list[int]:
    """Projects with quotas and borrowing, users with limits, fair-share usage, queued work of mixed sizes,
    priorities, replicas and arrays, some of it running already; the workers, the first one polling."""
    _project(sched, "ml", gpus=rng.choice([None, 2, 4]), borrow=rng.choice([0, 2]))
    _project(sched, "cv", gpus=rng.choice([None, 1, 3]), borrow=rng.choice([0, 1]), weight=rng.choice([None, 2.0]))
    people = [_user(sched, "bob", "ml", max_running_jobs=rng.choice([None, 2, 4])),
              _user(sched, "ann", "cv", max_running_jobs=rng.choice([None, 3])),
              _user(sched, "cat", "ml", "cv")]
    workers = [add_worker(sched, f"w{i}", gpus=rng.choice([0, 2, 4, 8]), cpus=rng.choice([4, 16]),
                          memory_mb=rng.choice([8000, 64000]), slots=rng.choice([2, 4, 8, 16])) for i in range(3)]
    for _ in range(rng.randint(4, 14)):
        who = rng.choice(people)
        proj = rng.choice(["ml", "cv"]) if who.name == "cat" else ("ml" if who.name == "bob" else "cv")
        spec = {"gpus": rng.choice([0, 0, 1, 1, 2, 4]), "cpus": rng.choice([1, 2, 4]),
                "memory_mb": rng.choice([500, 4000, 20000]), "priority": rng.choice([0, 0, 5])}
        shape = rng.random()
        if shape < 0.3:
            size = rng.randint(2, 6)
            spec["array"] = f"0-{size - 1}" + (f"%{rng.randint(1, 3)}" if rng.random() < 0.5 else "")
        elif shape < 0.5:
            spec["service"] = {"replicas": rng.randint(2, 3)}
        sched.submit(job(**spec), who, proj)
    for w in workers[1:]:  # others' running work: quotas, limits and fair share in use
        for a in sched.acquire_many(w, 0, rng.randint(0, 3)):
            sched.start(w, a["task_id"], 100)
    sched.store.write(lambda c: c.executemany(
        "INSERT OR REPLACE INTO fairshare (project_id, user_id, usage, updated_at, running) "
        "SELECT p.id, u.id, ?, ?, ? FROM projects p, users u WHERE p.name = ? AND u.name = ?",
        [(rng.choice([0.0, 100.0, 5000.0]), sched.clock() - 60, rng.choice([0.0, 10.0]), p, u)
         for p in ("ml", "cv") for u in ("bob", "ann", "cat")]))
    return workers


@pytest.mark.parametrize("seed", range(40))
def test_several_claimed_at_once_are_what_one_at_a_time_took(sched, seed):
    rng = random.Random(seed)
    workers = _scenario(sched, rng)
    most = rng.choice([1, 2, 4, 8, 16])
    old, new, statements, _ = _both(sched, workers[0], most)
    assert new == old, f"seed {seed}: one at a time took {old}, one statement {new}"
    assert statements <= max(1, len(new) + 1)
    free = sched.store.read(lambda c: c.execute(
        "SELECT free_slots, free_gpus, free_cpus, free_memory_mb FROM worker_load WHERE worker_id = ?",
        (workers[0],)).fetchone())
    assert min(free.values()) >= 0, free  # never over-committed


def test_one_statement_claims_several(sched):
    """Eight 1-GPU tasks on an 8-GPU worker: one acquire_task statement claims them all, each its own GPU."""
    w = add_worker(sched, "big", gpus=8, cpus=64, memory_mb=256000, slots=16)
    ids = [sched.submit(job(gpus=1, cpus=1)) for _ in range(10)]
    old, new, statements, gpus = _both(sched, w, 8)
    assert new == old and len(new) == 8 and statements == 1
    assert sorted(i for t in new for i in gpus[t]) == list(range(8))
    states = sched.store.read(lambda c: [r["state"] for r in c.execute("SELECT state FROM jobs ORDER BY id")])
    assert states == ["running"] * 8 + ["queued"] * 2 and len(ids) == 10


def test_mixed_sizes_never_over_commit(sched):
    """4 GPUs free: a 1-GPU, a 2-GPU, a 4-GPU (no longer fits once those two are claimed) and 1-GPU tasks, in that
    order. The running sums stop at the 4-GPU task; the next claim takes the 1-GPU task behind it."""
    w = add_worker(sched, "w", gpus=4, cpus=64, memory_mb=256000, slots=16)
    for gpus in (1, 2, 4, 1, 1):
        sched.submit(job(gpus=gpus))
    old, new, statements, gpus = _both(sched, w, 8)
    assert new == old and len(new) == 3 and statements == 3  # [1, 2], then [1], then none
    assert sorted(i for t in new for i in gpus[t]) == [0, 1, 2, 3]


def test_quota_across_several_in_one_claim(sched):
    """Project ml may hold 3 GPUs (no borrowing): one claim of eight takes three of its 1-GPU tasks, and cv's
    (no quota) beside them, never a fourth of ml's."""
    _project(sched, "ml", gpus=3)
    _project(sched, "cv")
    bob, ann = _user(sched, "bob", "ml"), _user(sched, "ann", "cv")
    w = add_worker(sched, "w", gpus=8, cpus=64, memory_mb=256000, slots=16)
    for _ in range(5):
        sched.submit(job(gpus=1), bob, "ml")
        sched.submit(job(gpus=1), ann, "cv")
    old, new, _, _ = _both(sched, w, 8)
    assert new == old and len(new) == 8
    projects = sched.store.read(lambda c: [r["project_id"] for r in c.execute(
        "SELECT j.project_id FROM tasks t JOIN jobs j ON j.id = t.job_id WHERE t.id IN (SELECT value FROM json_each(?))",
        (json.dumps(new),))])
    ml = sched.store.read(lambda c: c.execute("SELECT id FROM projects WHERE name = 'ml'").fetchone()["id"])
    assert projects.count(ml) == 3


def test_array_cap_holds_in_one_claim(sched):
    """An array capped at %3 gives at most three elements to one claim of eight."""
    w = add_worker(sched, "w", cpus=64, memory_mb=256000, slots=16)
    sched.submit(job(array="0-9%3"))
    old, new, statements, _ = _both(sched, w, 8)
    assert new == old and len(new) == 3 and statements <= 2


def test_depth_reads_what_the_most_tasks_need():
    """claim_clock.depth, how many tasks of each group claimable_tasks reads, goes up to one more than one claim
    may take (MAX_TASKS_PER_ACQUIRE), as acquire_task needs: its CHECK says so."""
    assert f"depth BETWEEN 1 AND {placement.MAX_TASKS_PER_ACQUIRE + 1}" in db.schema_path().read_text()


def _one_at_a_time(conn, worker_id: int, now: float, most: int) -> list[int]:
    """The claims the views make one task a statement (acquire_one), as many as `most` in a row."""
    taken: list[int] = []
    while len(taken) < most:
        got = placement._claim(conn, worker_id, now, now + LEASE, 1)[0]
        if not got:
            break
        taken += got
    return taken


@pytest.mark.parametrize("seed", range(40))
def test_several_claimed_at_once_honour_reservations_as_one_at_a_time(sched, seed):
    """EASY backfill (issue 38): with reservations on the polling worker (room held from a time to come for a
    queued job) and jobs of mixed time limits, one claim of several takes what one-task claims in a row take,
    and none of it holds room a reservation needs at its start unless it is expected to end by then."""
    rng = random.Random(1000 + seed)
    workers = _scenario(sched, rng)
    now = sched.clock()

    def reserve(conn):
        conn.execute("UPDATE jobs SET spec = json_set(spec, '$.timeout_seconds', ?) WHERE id % 3 = ?",
                     (rng.choice([30, 300, 3000]), rng.randint(0, 2)))
        conn.execute("UPDATE jobs SET spec = json_set(spec, '$.backfill', json('false')) WHERE id % 5 = ?",
                     (rng.randint(0, 4),))
        queued = [r["id"] for r in conn.execute("SELECT id FROM jobs WHERE state = 'queued' ORDER BY id")]
        for job_id in rng.sample(queued, min(len(queued), rng.randint(1, 2))):
            conn.execute("INSERT INTO reservations (job_id, worker_id, tasks, gpus, cpus, memory_mb, start_at, "
                         "planned_at, reason) VALUES (?, ?, 1, ?, ?, ?, ?, ?, 'test')",
                         (job_id, workers[0], rng.choice([0, 1, 2, 4]), rng.choice([1, 4]), rng.choice([500, 8000]),
                          now + rng.choice([0, 60, 600]), now))
    sched.store.write(reserve)
    most = rng.choice([2, 4, 8, 16])

    def run(conn):
        conn.execute("SAVEPOINT reference")
        old = _one_at_a_time(conn, workers[0], now, most)
        conn.execute("ROLLBACK TO reference")
        conn.execute("RELEASE reference")
        new = placement.acquire_many(conn, workers[0], now, LEASE, most)
        held = [dict(r) for r in conn.execute(
            "SELECT r.job_id, r.start_at, r.gain_gpus FROM reservation_room r WHERE r.worker_id = ?", (workers[0],))]
        late = [dict(r) for r in conn.execute(
            "SELECT t.id, t.job_id, j.gpus, ? + m.expected_s AS end_at, coalesce(json_extract(j.spec, '$.backfill'), 1) AS bf "
            "FROM tasks t JOIN jobs j ON j.id = t.job_id JOIN job_runtime_model m ON m.job_id = j.id "
            "WHERE t.id IN (SELECT value FROM json_each(?))", (now, json.dumps(new)))]
        free = conn.execute("SELECT free_gpus FROM worker_load WHERE worker_id = ?", (workers[0],)).fetchone()
        return old, new, held, late, free["free_gpus"]
    old, new, held, late, free_gpus = sched.store.write(run)
    assert new == old, f"seed {seed}: one at a time took {old}, one statement {new}"
    for r in held:  # after the claims: a reservation that a claimed task still runs at has its GPUs then
        if any(t["job_id"] != r["job_id"] and (not t["bf"] or t["end_at"] > r["start_at"]) for t in late):
            assert free_gpus + r["gain_gpus"] >= 0, (seed, r, late)
