"""Reservations with backfill (issue 38 point 1), against real state files: the runtime model (job_runtime_model,
task_expected_end), the reservations table and the triggers that release a reservation in the transaction that
makes its job or worker unable to use it."""
from __future__ import annotations

from helpers import add_worker, job


def _model(sched, job_id):
    return sched.store.read(lambda c: c.execute("SELECT * FROM job_runtime_model WHERE job_id = ?", (job_id,)).fetchone())


def _ran(sched, user_id, name, seconds, *, job_id=999, outcome="succeeded", command=None):
    """Earlier ended runs in the usage ledger (and, for `command`, an ended job that had it)."""
    def write(conn):
        nonlocal job_id
        if command is not None:
            job_id = conn.execute(
                "INSERT INTO jobs (name, state, spec, created_at, finished_at, user_id) "
                "VALUES (?, 'succeeded', json_object('command', json(?)), 0, 1, ?) RETURNING id",
                (name, command, user_id)).fetchone()["id"]
        for i, s in enumerate(seconds):
            conn.execute("INSERT INTO usage (task_id, job_id, attempt, job_name, user_id, project_id, gpus, cpus, "
                         "started_at, ended_at, gpu_seconds, cpu_seconds, outcome) "
                         "VALUES (?, ?, 1, ?, ?, 1, 1, 1, ?, ?, 0, 0, ?)", (i, job_id, name, user_id, 100.0 * i, 100.0 * i + s,
                                                                        outcome))
    sched.store.write(write)


def test_a_limit_is_what_backfill_judges_by(sched):
    j = sched.submit(job(timeout_seconds=600))
    m = _model(sched, j)
    assert (m["limit_s"], m["expected_s"], m["typical_s"], m["source"]) == (600, 600, 600, "limit")
    assert m["learned_s"] is None and m["default_s"] == 3600


def test_no_limit_no_history_takes_the_default(sched):
    m = _model(sched, sched.submit(job(name="train")))
    assert (m["expected_s"], m["typical_s"], m["source"], m["runs"]) == (3600, 3600, "default", 0)


def test_history_of_the_same_name_teaches_a_high_percentile(sched):
    _ran(sched, 1, "train", [10, 20, 30, 40, 50, 60, 70, 80, 90, 100])
    _ran(sched, 1, "train", [5000], outcome="cancelled")   # cancelled runs teach nothing
    _ran(sched, 1, "other", [7000])
    m = _model(sched, sched.submit(job(name="train")))
    assert (m["runs"], m["learned_s"], m["median_s"], m["source"]) == (10, 90, 50, "history")
    assert m["expected_s"] == 90 and m["typical_s"] == 50
    limited = _model(sched, sched.submit(job(name="train", timeout_seconds=40)))
    assert (limited["expected_s"], limited["typical_s"], limited["source"]) == (40, 40, "limit")


def test_fewer_than_three_runs_teach_nothing(sched):
    _ran(sched, 1, "train", [10, 20])
    assert _model(sched, sched.submit(job(name="train")))["source"] == "default"


def test_an_unnamed_job_learns_from_the_same_command(sched):
    _ran(sched, 1, None, [30, 30, 30], command='["python3", "x.py"]')
    _ran(sched, 1, None, [900, 900, 900], command='["python3", "y.py"]')
    m = _model(sched, sched.submit(job(command=("python3", "x.py"))))
    assert (m["expected_s"], m["source"]) == (30, "history")


def test_limits_users_overestimate_are_scaled_for_the_typical_run(sched):
    """typical_s of a job with a limit and no history of its own: the limit times the cluster's median run/limit."""
    for limit, ran in ((100, 50), (200, 100), (300, 150)):
        j = sched.submit(job(timeout_seconds=limit))
        _ran(sched, 2, "x", [ran], job_id=j)
    m = _model(sched, sched.submit(job(timeout_seconds=1000)))
    assert (m["limit_ratio"], m["expected_s"], m["typical_s"]) == (0.5, 1000, 500)


def test_a_running_task_is_expected_to_end_from_its_start(sched, clock):
    w = add_worker(sched, "w", gpus=1)
    j = sched.submit(job(gpus=1, timeout_seconds=300))
    task = sched.acquire_many(w, 0, 1)[0]["task_id"]
    sched.start(w, task, 100)
    end = sched.store.read(lambda c: c.execute("SELECT * FROM task_expected_end WHERE task_id = ?", (task,)).fetchone())
    started = sched.store.read(lambda c: c.execute("SELECT started_at FROM tasks WHERE id = ?", (task,)).fetchone())
    assert end["job_id"] == j and end["expected_end_at"] == started["started_at"] + 300


def _reserve(sched, job_id, worker_id, start_at=1e12):
    sched.store.write(lambda c: c.execute(
        "INSERT INTO reservations (job_id, worker_id, tasks, gpus, cpus, memory_mb, start_at, planned_at, reason) "
        "VALUES (?, ?, 1, 8, 1, 100, ?, 0, 'test')", (job_id, worker_id, start_at)))


def _reserved(sched):
    return sched.store.read(lambda c: [(r["job_id"], r["worker_id"]) for r in
                                       c.execute("SELECT job_id, worker_id FROM reservations ORDER BY 1, 2")])


def test_cancel_or_hold_releases_the_reservation_in_the_same_transaction(sched):
    w = add_worker(sched, "w", gpus=8)
    a, b, c = (sched.submit(job(gpus=8)) for _ in range(3))
    for j in (a, b, c):
        _reserve(sched, j, w)
    sched.cancel(a)
    sched.hold(b)
    assert _reserved(sched) == [(c, w)]


def test_a_cordoned_or_offline_worker_loses_its_reservations(sched):
    w1, w2 = add_worker(sched, "w1", gpus=8), add_worker(sched, "w2", gpus=8)
    j = sched.submit(job(gpus=8, nodes=2))
    _reserve(sched, j, w1)
    _reserve(sched, j, w2)
    sched.cordon("w1", "maintenance")
    assert _reserved(sched) == [(j, w2)]
    sched.store.write(lambda c: c.execute("UPDATE workers SET state = 'offline' WHERE id = ?", (w2,)))
    assert _reserved(sched) == []
