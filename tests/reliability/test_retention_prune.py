"""Retention: old log lines, ended jobs, loose events and departed workers go, in small batches; nothing live does.

In-process with a pinned clock (the unit tier), and `gpulayer server prune` as the CLI.
"""
from __future__ import annotations

import json

from gpulayer.server.scheduler import retention, sessions

from gpulayer.server.http import wire
from gpulayer.server.security.auth import Principal
from gpulayer.testing import run_cli

DAY = 86400.0
LINES = 1_200  # more than one batch


def _worker(sched, name: str) -> int:
    body = wire.register({"name": name, "labels": {}, "resources": {"cpus": 8}, "slots": 4})
    return sched.register(body=body, token=Principal(kind="join", jti="server-join"), session_hash=name,
                          peer_address="127.0.0.1")["worker_id"]


def _run(sched, worker: int, *, finish: bool) -> int:
    job = sched.submit({"command": ["run"]})
    task = sched.acquire(worker)
    assert task["job_id"] == job
    sched.start(worker, task["task_id"], 1)
    lines = [{"n": i, "stream": "stdout", "at": 0.0, "text": f"line {i}"} for i in range(LINES)]
    sched.logs(worker, task["task_id"], lines)
    if finish:
        assert sched.finish(worker, task["task_id"], exit_code=0, outcome="succeeded", outputs={}, reason=None)
    return job


def _session(store, job_id: int, at: float) -> None:
    """A closed relay session (an exec stream) into job `job_id`'s task, as the relay's hub records one."""
    task = store.read(lambda conn: conn.execute("SELECT id, worker_id FROM tasks WHERE job_id = ?", (job_id,)).fetchall())[0]
    to = sessions.Target(job_id, task["id"], 0, task["worker_id"], "w", ("exec",), False, "test")
    session_id = store.write(sessions.opened, to, "user:alice", "exec", {"argv": ["true"]}, at)
    store.write(sessions.closed, session_id, 1, 2, 0, "exited", at + 1)


def _count(store, table: str, where: str = "1") -> int:
    return store.read(lambda conn: conn.execute(f"SELECT count(*) AS n FROM {table} WHERE {where}").fetchall())[0]["n"]


def test_prune_removes_what_is_past_retention_in_small_writes(store, sched, clock, monkeypatch):
    departed = _worker(sched, "departed")
    sched.deregister(departed)
    worker = _worker(sched, "w")
    old = _run(sched, worker, finish=True)
    clock.advance(20 * DAY)
    recent = _run(sched, worker, finish=True)
    running = _run(sched, worker, finish=False)
    keep = dict(log_retention_s=7 * DAY, job_retention_s=30 * DAY)
    _session(store, old, clock.now - 20 * DAY)  # relay sessions into the old job and the recent one
    _session(store, recent, clock.now)

    writes = []
    real_write = store.write

    def counting_write(fn, *args, **kwargs):
        result = real_write(fn, *args, **kwargs)
        writes.append(result)
        return result

    monkeypatch.setattr(store, "write", counting_write)
    # Day 20: the old job's lines are past log retention; the job itself is kept.
    dry = retention.prune(store, now=clock.now, dry_run=True, **keep)
    assert dry["log_lines"] == LINES and dry["jobs"] == 0
    done = retention.prune(store, now=clock.now, **keep)
    assert done["log_lines"] == LINES and done["jobs"] == 0 and done["done"]
    assert all(len(w) <= retention.PRUNE_BATCH for w in writes if isinstance(w, list))
    assert _count(store, "logs", f"job_id = {old}") == 0 and _count(store, "jobs", f"id = {old}") == 1
    assert _count(store, "logs", f"job_id = {recent}") == LINES

    # Day 40: the old job (tasks, events) and the departed worker are past job retention.
    clock.advance(20 * DAY)
    dry = retention.prune(store, now=clock.now, dry_run=True, **keep)
    done = retention.prune(store, now=clock.now, **keep)
    assert (dry["jobs"], dry["workers"], dry["sessions"]) == (done["jobs"], done["workers"], done["sessions"]) == (1, 1, 1)
    assert dry["log_lines"] == done["log_lines"] == LINES  # the recent job's lines, ended 20 days ago
    assert _count(store, "jobs", f"id = {old}") == 0
    assert _count(store, "tasks", f"job_id = {old}") == 0 and _count(store, "events", f"job_id = {old}") == 0
    assert _count(store, "workers", f"id = {departed}") == 0
    # What is live or within retention stays: the running job and its lines, the recent job, the worker.
    assert _count(store, "logs", f"job_id = {running}") == LINES
    assert _count(store, "jobs", f"id IN ({recent}, {running})") == 2
    assert _count(store, "workers", f"id = {worker}") == 1
    assert _count(store, "events", "kind = 'state_pruned'") == 2
    assert _count(store, "sessions", f"job_id = {old}") == 0 and _count(store, "sessions", f"job_id = {recent}") == 1
    assert store.read(lambda conn: conn.execute("PRAGMA foreign_key_check").fetchall()) == []
    assert retention.prune(store, now=clock.now, **keep)["jobs"] == 0


def test_a_round_stops_at_its_budget_and_the_next_goes_on(store, sched, clock):
    worker = _worker(sched, "w")
    job = _run(sched, worker, finish=True)
    clock.advance(40 * DAY)
    first = retention.prune(store, now=clock.now, log_retention_s=DAY, job_retention_s=30 * DAY, budget=1)
    assert not first["done"] and first["log_lines"] == retention.PRUNE_BATCH
    rest = retention.prune(store, now=clock.now, log_retention_s=DAY, job_retention_s=30 * DAY)
    assert rest["done"] and rest["jobs"] == 1 and first["log_lines"] + rest["log_lines"] == LINES
    assert _count(store, "jobs", f"id = {job}") == 0


def test_server_prune_cli(home, store, sched, clock):
    worker = _worker(sched, "w")
    _run(sched, worker, finish=True)  # ended at the pinned clock, long before the real now
    dry = run_cli("server", "prune", "--home", str(home), "--dry-run", "--json", timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["jobs"] == 1 and _count(store, "jobs") == 1
    done = run_cli("server", "prune", "--home", str(home), "--job-retention", "90d", timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("removed 1 job, 1200 log lines"), done.stdout
    assert _count(store, "jobs") == 0
    bad = run_cli("server", "prune", "--home", str(home), "--log-retention", "soon", timeout=60)
    assert bad.returncode == 2 and "not a duration" in bad.stderr and "Traceback" not in bad.stderr


def test_an_idle_file_pruned_to_its_last_event_gives_no_seq_again_and_drops_its_job_webhooks(store, sched, clock):
    """Every event past retention goes, the newest included, yet the next event's seq is past all of them (a
    seq given again would repeat `webhook-id`s and fall behind webhooks' cursors). A job's webhooks go with
    the job; others stay."""
    worker = _worker(sched, "w")
    job = _run(sched, worker, finish=True)
    newest = store.read(lambda conn: conn.execute("SELECT max(seq) AS n FROM events").fetchall())[0]["n"]

    def hook(scope: str, job_id=None) -> int:
        return store.write(lambda conn: conn.execute(
            "INSERT INTO webhooks (url, events, scope, job_id, user_id, cursor, created_at) "
            "VALUES ('https://r.example/h', '[\"job.failed\"]', ?, ?, 1, ?, 0) RETURNING id", (scope, job_id, newest)).fetchall()[0]["id"])

    for_job, for_all = hook("job", job), hook("all")
    store.write(lambda conn: conn.execute(
        "INSERT INTO webhook_deliveries (webhook_id, event_seq, event, status, attempts, first_try_at, last_try_at) "
        "VALUES (?, ?, 'job.succeeded', 'delivered', 1, 0, 0)", (for_job, newest)))
    clock.advance(40 * DAY)
    done = retention.prune(store, now=clock.now, log_retention_s=DAY, job_retention_s=30 * DAY)
    assert done["jobs"] == 1 and done["events"] >= newest - 1
    pruned = store.read(lambda conn: conn.execute("SELECT seq, kind FROM events").fetchall())
    assert [e["kind"] for e in pruned] == ["state_pruned"] and pruned[0]["seq"] > newest
    assert [r["id"] for r in store.read(lambda conn: conn.execute("SELECT id FROM webhooks").fetchall())] == [for_all]
    assert _count(store, "webhook_deliveries") == 0
