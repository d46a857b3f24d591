"""schema.sql, migrations and the named queries, checked against real SQLite files."""
from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import apsw
import pytest

from gpulayer.server.store import db
from gpulayer.server.errors import ConfigError
from gpulayer.server.store.queries import OWNERS, QUERIES, NoRow, load_folder, one, row

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gpulayer"
STORE = PACKAGE / "server" / "store"
QUERY_FILES = sorted((STORE / "queries").glob("*.sql"))
MIGRATIONS = STORE / "migrations"
# The schema as it stood at version 1, frozen, once a migration exists: migrations replay from it.
BASELINE = MIGRATIONS / "baseline_0001.sql"
PARAM = re.compile(r"(?<!:):([A-Za-z_][A-Za-z0-9_]*)")


def build(path: Path) -> apsw.Connection:
    conn = db.connect(path)
    db.ensure_schema(conn)
    return conn


def schema_rows(conn) -> list[tuple]:
    """sqlite_schema, comparable: whitespace folded (and dropped around brackets and commas, since
    ALTER TABLE ADD COLUMN writes `...\n, col TYPE)` after a last column), internal objects left out, sorted."""
    found = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_schema WHERE name NOT LIKE 'sqlite_%'").fetchall()
    return sorted((r["type"], r["name"], r["tbl_name"], re.sub(r"\s*([(),])\s*", r"\1", " ".join((r["sql"] or "").split())))
                  for r in found)


@pytest.fixture
def built(tmp_path):
    conn = build(tmp_path / "state.db")
    yield conn, tmp_path / "state.db"
    conn.close()


def test_schema_applies_with_its_version(built):
    conn, _ = built
    version = conn.execute("PRAGMA user_version").fetchall()[0]["user_version"]
    assert version == db.schema_version() >= 1
    names = {r["name"] for r in conn.execute("SELECT name FROM sqlite_schema").fetchall()}
    for table in ("workers", "jobs", "tasks", "events", "logs", "artifacts", "tokens", "rendezvous"):
        assert table in names
    for view in ("endpoints", "job_summary", "worker_load"):
        assert view in names
    assert "tasks_queued" in names
    assert db.ensure_schema(conn) == version  # idempotent


def test_every_table_is_strict(built):
    conn, _ = built
    tables = conn.execute("SELECT name FROM pragma_table_list WHERE type = 'table' AND schema = 'main' "
                          "AND name NOT LIKE 'sqlite_%'").fetchall()
    strict = {r["name"]: r["strict"] for r in conn.execute("SELECT name, strict FROM pragma_table_list").fetchall()}
    assert tables and all(strict[t["name"]] == 1 for t in tables)


def test_stock_sqlite3_reads_the_file(built):
    """Python's stdlib sqlite3 (3.40 here, like the stock CLI) opens the file and every view."""
    conn, path = built
    conn.execute("INSERT INTO workers (name, registered_at, last_seen_at, lease_expires_at) VALUES ('w', 1, 1, 5)")
    conn.execute("INSERT INTO jobs (spec, kind, created_at) VALUES ('{}', 'service', 1)")
    conn.execute("INSERT INTO tasks (job_id, state, worker_id, lease_expires_at, created_at) "
                 "VALUES (1, 'running', 1, 5, 1)")
    stock = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        assert stock.execute("PRAGMA user_version").fetchone()[0] == db.schema_version()
        assert stock.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        objects = stock.execute("SELECT type, name FROM sqlite_schema WHERE type IN ('table', 'view') "
                                "AND name NOT LIKE 'sqlite_%'").fetchall()
        for kind, name in objects:
            stock.execute(f'SELECT * FROM "{name}"').fetchall()
        views = {name for kind, name in objects if kind == "view"}
        assert {"endpoints", "job_summary", "worker_load"} <= views
        assert stock.execute("SELECT free_slots, active_tasks FROM worker_load").fetchall() == [(0, 1)]
        assert len(stock.execute("SELECT * FROM endpoints").fetchall()) == 1
    finally:
        stock.close()


def test_migrations_replay_to_exactly_schema_sql(tmp_path):
    found = db.migrations()
    target = db.schema_version()
    fresh = build(tmp_path / "fresh.db")
    try:
        if not found:
            # Nothing to replay yet: schema.sql is version 1 itself, and the baseline.
            assert target == 1, "schema.sql moved past version 1: add gpulayer/server/store/migrations/NNNN_*.sql for it"
            return
        assert sorted(found) == list(range(2, target + 1)), "one migration file per version after 1"
        assert BASELINE.exists(), f"freeze schema.sql as it was at version 1 in {BASELINE} to replay migrations"
        old = db.connect(tmp_path / "old.db")
        old.execute(BASELINE.read_text())
        assert old.execute("PRAGMA user_version").fetchall()[0]["user_version"] == 1
        assert db.ensure_schema(old) == target
        assert old.execute("PRAGMA user_version").fetchall()[0]["user_version"] == target
        assert schema_rows(old) == schema_rows(fresh)
        old.close()
    finally:
        fresh.close()


def test_upgraded_file_acquires_its_queued_tasks(tmp_path):
    """Migration 0003 groups the queued tasks of an older file by shape, so acquire finds them."""
    from gpulayer.server.scheduler import placement

    old = db.connect(tmp_path / "old.db")
    old.execute(BASELINE.read_text())
    old.execute("INSERT INTO workers (name, cpus, memory_mb, registered_at, last_seen_at, lease_expires_at) "
                "VALUES ('w', 8, 16000, 1, 1, 100)")
    for job_id, gpus, priority, state in [(1, 8, 5, "queued"), (2, 0, 0, "queued"), (3, 0, 1, "queued"),
                                          (4, 0, 1, "succeeded")]:
        old.execute("INSERT INTO jobs (id, spec, gpus, priority, created_at, state, finished_at) "
                    "VALUES (?, '{}', ?, ?, 1, ?, ?)", (job_id, gpus, priority, state,
                                                       None if state == "queued" else 2))
        old.execute("INSERT INTO tasks (job_id, priority, state, created_at, finished_at) VALUES (?, ?, ?, 1, ?)",
                    (job_id, priority, state, None if state == "queued" else 2))
    db.ensure_schema(old)
    assert [r["queued"] for r in old.execute("SELECT queued FROM shapes ORDER BY id").fetchall()] == [1, 2]
    assert old.execute("SELECT count(*) AS n FROM task_queue").fetchall()[0]["n"] == 3
    with old:
        assert placement.acquire(old, 1, 10.0, 20.0) == 3  # priority 1 before 0; the 8-GPU task fits nobody
    assert old.execute("SELECT count(*) AS n FROM task_queue").fetchall()[0]["n"] == 2
    old.close()


def test_newer_file_refused(tmp_path):
    conn = build(tmp_path / "state.db")
    conn.execute(f"PRAGMA user_version = {db.schema_version() + 1}")
    with pytest.raises(ConfigError, match="newer"):
        db.ensure_schema(conn)
    conn.close()
    with pytest.raises(ConfigError, match="newer"):
        db.Store(tmp_path / "state.db")


def test_foreign_file_refused(tmp_path):
    path = tmp_path / "other.db"
    other = sqlite3.connect(path)
    other.execute("CREATE TABLE stuff (x)")
    other.commit()
    other.close()
    conn = db.connect(path)
    with pytest.raises(ConfigError, match="right file"):
        db.ensure_schema(conn)
    assert conn.execute("SELECT count(*) AS n FROM sqlite_schema").fetchall()[0]["n"] == 1
    conn.close()


def _explain(conn, name: str, sql: str):
    params = {p: None for p in PARAM.findall(sql)}
    return conn.execute("EXPLAIN " + sql, params).fetchall()


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_named_query_prepares_against_schema(built, name):
    conn, _ = built
    _explain(conn, name, QUERIES[name])


def test_one_returns_the_row_and_names_the_query_that_returned_none(built):
    """one() is row() for a query that always answers; no row back is a bug, raised naming the query."""
    conn, _ = built
    assert one(conn, "metrics_gpus_unhealthy") == {"n": 0}
    assert row(conn, "get_job", job_id=1) is None
    with pytest.raises(NoRow, match="'get_job' returned no row"):
        one(conn, "get_job", job_id=1)


def test_every_named_query_is_used():
    source = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py"))
    unused = [n for n in QUERIES if not re.search(rf"""["']{n}["']""", source)]
    assert unused == [], f"named queries no code calls (delete them from store/queries/*.sql): {unused}"


def test_every_query_lives_with_a_module_that_calls_it():
    """store/queries/<owner>.sql: the module <owner>.py (or the package <owner>/) calls each of its blocks."""
    modules: dict[str, list[Path]] = {}
    for path in PACKAGE.rglob("*.py"):
        modules.setdefault(path.stem, []).append(path)
        modules.setdefault(path.parent.name, []).append(path)
    misplaced = {}
    for name, owner in OWNERS.items():
        callers = [p for p in modules.get(owner, []) if re.search(rf"""["']{name}["']""", p.read_text())]
        if not callers:
            misplaced[name] = f"{owner}.sql"
    assert misplaced == {}, f"blocks in the file of a module that does not call them: {misplaced}"


def test_query_files_stay_readable():
    """No query file grows past ~600 lines (the one file of 1,700 lines was where parallel changes undid each other)."""
    long = {p.name: n for p in QUERY_FILES if (n := len(p.read_text().splitlines())) > 600}
    assert QUERY_FILES and long == {}


def test_a_name_in_two_files_fails_the_load(tmp_path):
    (tmp_path / "jobs.sql").write_text("-- name: get_job --\nSELECT 1;\n")
    (tmp_path / "workers.sql").write_text("-- name: get_worker --\nSELECT 2;\n\n-- name: get_job --\nSELECT 3;\n")
    with pytest.raises(ValueError, match="'get_job' in jobs.sql and workers.sql"):
        load_folder(tmp_path)
    (tmp_path / "workers.sql").write_text("-- name: get_worker --\nSELECT 2;\n\n-- name: get_worker --\nSELECT 3;\n")
    with pytest.raises(ValueError, match="workers.sql: duplicate query name 'get_worker'"):
        load_folder(tmp_path)
    (tmp_path / "workers.sql").write_text("-- name: get_worker --\nSELECT 2;\n")
    assert load_folder(tmp_path) == ({"get_job": "SELECT 1;", "get_worker": "SELECT 2;"},
                                     {"get_job": "jobs", "get_worker": "workers"})


def test_query_files_hold_only_named_blocks():
    for path in QUERY_FILES:
        text = path.read_text()
        first = text.index("-- name:")
        assert all(line.startswith("--") or not line.strip() for line in text[:first].splitlines()), path.name
    for name, sql in QUERIES.items():
        assert _one_statement(sql), f"{name}: one statement per block"


def _one_statement(sql: str) -> bool:
    """Whether `sql` is one complete statement and comments, as SQLite's tokenizer reads it (a ';' in a string
    literal or a comment ends nothing): apsw would run every statement of a block, EXPLAIN only its first."""
    for i, char in enumerate(sql):
        if char == ";" and sqlite3.complete_statement(sql[:i + 1]):
            return all(not line.strip() or line.strip().startswith("--") for line in sql[i + 1:].splitlines())
    return False


def test_one_statement_is_judged_by_sqlite_not_by_semicolons():
    assert _one_statement("-- says\nSELECT 'a; b' AS x, 1 -- c; d\nFROM t;\n-- trailing\n")
    assert not _one_statement("SELECT 1; DELETE FROM jobs;")
    assert not _one_statement("SELECT 'no end'")


@pytest.mark.parametrize("claim", ["acquire_one", "acquire_task"])
def test_acquisition_reads_shapes_not_tasks(built, claim):
    """The claims (one task, several) walk the queued shapes (partial index) and each one's queue, never all
    queued tasks."""
    conn, _ = built
    sql = QUERIES[claim]
    params = {p: None for p in PARAM.findall(sql)}
    details = [r["detail"] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params).fetchall()]
    plan = " | ".join(details)
    assert "shapes_queued" in plan and "task_queue_shape" in plan and "tasks_queued" not in plan, plan
    # the claim's worker_id reaches every level of the claim views (claimable_groups, claimable_tasks,
    # claimable_batch), down to worker_load: the claim reads one worker's load, never every worker's
    assert not [d for d in details if re.match(r"SCAN (w|workers)\b", d)], plan
    # the same in the stock SQLite the CLI ships (3.40): the indexes are usable there too
    stock = sqlite3.connect(":memory:")
    stock.executescript(db.schema_path().read_text())
    stock_plan = " | ".join(r[3] for r in stock.execute("EXPLAIN QUERY PLAN " + sql, params).fetchall())
    assert "shapes_queued" in stock_plan and "task_queue_shape" in stock_plan, stock_plan


@pytest.mark.parametrize("claim", ["acquire_one", "acquire_task"])
def test_the_claim_reads_reserved_room_once_not_per_task(built, claim):
    """Beside a reservation (EASY backfill), the claims read each reservation's gain (every active task's expected
    end on the worker, from job_runtime_model) once a claim, materialized, not once for each queued task they
    judge: job_runtime_model's learned runtime (the usage_user_name search) is planned in `ends` and in the
    task's own expected_s only (it was 10 times, each per task; docs/benchmarks/issue-38.md, "The claim beside
    a reservation"); the same in the stock SQLite the CLI ships (3.40)."""
    conn, _ = built
    sql = QUERIES[claim]
    params = {p: None for p in PARAM.findall(sql)}
    stock = sqlite3.connect(":memory:")
    stock.executescript(db.schema_path().read_text())
    for details in ([r["detail"] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params).fetchall()],
                    [r[3] for r in stock.execute("EXPLAIN QUERY PLAN " + sql, params).fetchall()]):
        plan = " | ".join(details)
        assert "MATERIALIZE rooms" in details and "MATERIALIZE ends" in details, plan
        assert sum("usage_user_name" in d for d in details) <= 4, plan


def _version_3(path: Path) -> apsw.Connection:
    """A state file as the release before teams left it: the baseline and migrations 2 and 3."""
    conn = db.connect(path)
    conn.execute(BASELINE.read_text())
    for version in (2, 3):
        conn.execute(db.migrations()[version].read_text())
        conn.execute(f"PRAGMA user_version = {version}")
    return conn


def test_version_3_file_with_data_upgrades_in_place(tmp_path):
    """Teams (0004): an older file with jobs in every state, workers, tokens, logs, artifacts and secrets
    upgrades at start, equals a fresh schema.sql, and everything old belongs to admin in project default."""
    from gpulayer.server.scheduler import placement

    old = _version_3(tmp_path / "old.db")
    q = old.execute
    q("INSERT INTO tokens (jti, kind, name, token_hash, created_at) VALUES "
      "('j1', 'join', 'gpu-nodes', 'h1', 1), ('c1', 'client', 'ci', 'h2', 1), ('m1', 'metrics', 'prom', 'h3', 1)")
    q("INSERT INTO workers (id, name, state, gpus, cpus, memory_mb, slots, token_labels, registered_at, last_seen_at, "
      "lease_expires_at, token_jti) VALUES (1, 'w1', 'online', 0, 8, 16000, 2, '{\"pool\": \"a\"}', 1, 1, 1e12, 'j1')")
    q("INSERT INTO workers (id, name, state, gone_reason, registered_at, last_seen_at) "
      "VALUES (2, 'w2', 'gone', 'deregistered', 1, 1)")
    q("INSERT INTO secrets (name, labels, ciphertext, created_at, updated_at) VALUES ('HF', '{\"pool\": \"a\"}', x'00', 1, 1)")
    states = ["queued", "running", "succeeded", "failed", "cancelled", "lost"]
    for job_id, state in enumerate(states, start=1):
        ended = None if state in ("queued", "running") else 2.0
        secrets = '["HF"]' if state == "queued" else "[]"
        q("INSERT INTO jobs (id, spec, state, secrets, created_at, finished_at) VALUES (?, '{}', ?, ?, 1, ?)",
          (job_id, state, secrets, ended))
        task_state = "running" if state == "running" else state
        q("INSERT INTO tasks (job_id, state, worker_id, lease_expires_at, created_at, finished_at, outputs) "
          "VALUES (?, ?, ?, ?, 1, ?, ?)", (job_id, task_state, 1 if state == "running" else None,
                                           1e12 if state == "running" else None, ended,
                                           '{"out": "sha256:' + "0" * 64 + '"}' if state == "succeeded" else "{}"))
        q("INSERT INTO events (at, kind, job_id, data) VALUES (1, 'job_submitted', ?, '{}')", (job_id,))
        q("INSERT INTO logs (job_id, task_id, n, stream, at, text) VALUES (?, ?, 0, 'stdout', 1, 'hello')",
          (job_id, job_id))
    q("INSERT INTO artifacts (digest, size, created_at, last_used_at) VALUES (?, 3, 1, 1)", ("sha256:" + "0" * 64,))
    counts = {t: q(f"SELECT count(*) AS n FROM {t}").fetchall()[0]["n"]
              for t in ("jobs", "tasks", "workers", "tokens", "logs", "events", "artifacts", "secrets", "task_queue")}

    assert db.ensure_schema(old) == db.schema_version()
    fresh = build(tmp_path / "fresh.db")
    assert schema_rows(old) == schema_rows(fresh)
    fresh.close()
    assert {t: q(f"SELECT count(*) AS n FROM {t}").fetchall()[0]["n"] for t in counts} == counts
    assert q("SELECT id, name, admin FROM users").fetchall() == [{"id": 1, "name": "admin", "admin": 1}]
    assert q("SELECT id, name FROM projects").fetchall() == [{"id": 1, "name": "default"}]
    assert q("SELECT DISTINCT user_id, project_id FROM jobs").fetchall() == [{"user_id": 1, "project_id": 1}]
    assert {r["jti"]: r["user_id"] for r in q("SELECT jti, user_id FROM tokens").fetchall()} == \
        {"j1": None, "c1": 1, "m1": None}
    assert q("SELECT project_id, name FROM secrets").fetchall() == [{"project_id": 1, "name": "HF"}]
    assert q("SELECT count(*) AS n FROM events WHERE actor IS NOT NULL").fetchall()[0]["n"] == 0
    assert q("PRAGMA foreign_key_check").fetchall() == [] and q("PRAGMA integrity_check").fetchall()[0] == \
        {"integrity_check": "ok"}
    # the queued job's secret is still found (in default, where it went), so the worker may take it
    fit = q("SELECT missing_secret, fits FROM job_worker_fit WHERE job_id = 1 AND worker_id = 1").fetchall()
    assert fit == [{"missing_secret": None, "fits": 1}]
    with old:
        assert placement.acquire(old, 1, 10.0, 20.0) is not None
    old.close()


def test_secret_of_another_project_does_not_fit(built):
    """A shape names its secrets' project: the same name set in another project is not the job's."""
    conn, _ = built
    conn.execute("INSERT INTO projects (id, name, created_at) VALUES (2, 'ml', 1)")
    conn.execute("INSERT INTO secrets (project_id, name, ciphertext, created_at, updated_at) VALUES (2, 'HF', x'00', 1, 1)")
    conn.execute("INSERT INTO workers (name, cpus, memory_mb, registered_at, last_seen_at, lease_expires_at) "
                 "VALUES ('w', 8, 16000, 1, 1, 1e12)")
    for job_id, project_id in ((1, 1), (2, 2)):
        conn.execute("INSERT INTO jobs (id, spec, secrets, project_id, created_at) VALUES (?, '{}', '[\"HF\"]', ?, 1)",
                     (job_id, project_id))
    found = {r["job_id"]: r["missing_secret"] for r in conn.execute("SELECT job_id, missing_secret FROM job_worker_fit")}
    assert found == {1: "HF", 2: None}
    assert conn.execute("SELECT count(*) AS n FROM shapes").fetchall()[0]["n"] == 2


def test_admission_views(built):
    """queue_group_quota and user_running_jobs, the admission acquire_task reads: GPUs left of the nominal quota
    after one more task, and running jobs counted as the limit counts them (a running array: its active elements)."""
    conn, _ = built
    q = conn.execute
    q("UPDATE projects SET gpu_quota = 4, gpu_borrow = 2 WHERE id = 1")
    q("INSERT INTO projects (id, name, created_at) VALUES (2, 'free', 1)")
    q("UPDATE users SET max_running_jobs = 3 WHERE id = 1")
    q("INSERT INTO users (id, name, created_at) VALUES (2, 'bob', 1)")
    q("INSERT INTO workers (id, name, gpus, cpus, memory_mb, slots, registered_at, last_seen_at, lease_expires_at) "
      "VALUES (1, 'w', 8, 8, 16000, 8, 1, 1, 1e12)")
    # running: a 2-GPU job, and an array of three elements two of which are active
    q("INSERT INTO jobs (id, spec, gpus, state, created_at) VALUES (1, '{}', 2, 'running', 1)")
    q("INSERT INTO tasks (job_id, state, worker_id, lease_expires_at, created_at) VALUES (1, 'running', 1, 1e12, 1)")
    q("INSERT INTO jobs (id, spec, state, array_size, created_at) VALUES (2, '{}', 'running', 3, 1)")
    for index, state in enumerate(("running", "assigned", "succeeded")):
        q("INSERT INTO tasks (job_id, \"index\", state, worker_id, lease_expires_at, created_at, finished_at) "
          "VALUES (2, ?, ?, 1, 1e12, 1, ?)", (index, state, 2 if state == "succeeded" else None))
    # queued: a 1-GPU and a 3-GPU job in project 1, a CPU job in project 1, a 1-GPU job in project 2 (no quota)
    for job_id, gpus, project_id, user_id in ((3, 1, 1, 1), (4, 3, 1, 1), (5, 0, 1, 2), (6, 1, 2, 2)):
        q("INSERT INTO jobs (id, spec, gpus, project_id, user_id, created_at) VALUES (?, '{}', ?, ?, ?, 1)",
          (job_id, gpus, project_id, user_id))
        q("INSERT INTO tasks (job_id, state, created_at) VALUES (?, 'queued', 1)", (job_id,))
    groups = {(r["gpus"], r["project_id"], r["user_id"]): (r["nominal_left"], r["borrow"], r["share"])
              for r in q("SELECT * FROM queue_group_quota").fetchall()}
    assert groups == {(1, 1, 1): (1, 2, 4), (3, 1, 1): (-1, 2, 4), (0, 1, 2): (None, 2, 4), (1, 2, 2): (None, 0, 1)}
    users = {r["name"]: (r["max_running_jobs"], r["running_jobs"], r["at_limit"])
             for r in q("SELECT * FROM user_running_jobs").fetchall()}
    assert users == {"admin": (3, 3.0, 1), "bob": (None, 0.0, 0)}


def _at_version(path: Path, target: int) -> apsw.Connection:
    """A state file as the release at schema version `target` left it: the baseline and its migrations."""
    conn = db.connect(path)
    conn.execute(BASELINE.read_text())
    for version in range(2, target + 1):
        conn.execute(db.migrations()[version].read_text())
        conn.execute(f"PRAGMA user_version = {version}")
    return conn


def _next_ids(conn) -> tuple[int, int]:
    """The ids the next webhook and the next alert get."""
    q = conn.execute
    hook = q("INSERT INTO webhooks (url, events, scope, user_id, created_at) VALUES ('https://x.example/h', '[]', 'all', 1, 9) "
             "RETURNING id").fetchall()[0]["id"]
    alert = q("INSERT INTO alerts (name, sql, every_s, webhook_id, user_id, next_run_at, created_at) "
              "VALUES ('next', 'SELECT 1', 60, ?, 1, 9, 9) RETURNING id", (hook,)).fetchall()[0]["id"]
    return hook, alert


def _next_seq(conn) -> int:
    return conn.execute("INSERT INTO events (at, kind) VALUES (9, 'probe') RETURNING seq").fetchall()[0]["seq"]


def test_version_18_notifications_keep_their_ids_and_none_is_given_again(tmp_path):
    """Migration 0019: events, webhooks and alerts keep their rows and ids, and the next ids start past every
    id the file still names (a removed newest webhook's or alert's by its events, a pruned newest event's by
    webhooks' cursors), so none comes back."""
    old = _at_version(tmp_path / "old.db", 18)
    q = old.execute
    for hook_id, scope, job in ((1, "all", None), (2, "job", 7), (3, "alert", None), (5, "all", None)):
        q("INSERT INTO webhooks (id, url, email, events, format, scope, job_id, alert_id, user_id, secret, cursor, "
          "created_at) VALUES (?, ?, ?, '[\"job.failed\"]', ?, ?, ?, ?, 1, ?, 40, 2)",
          (hook_id, None if scope == "alert" else f"https://r.example/{hook_id}",
           "ops@example.org" if scope == "alert" else None, "email" if scope == "alert" else "standard", scope, job,
           2 if scope == "alert" else None, None if scope == "alert" else b"sealed"))
        q("INSERT INTO events (at, kind, job_id, data) VALUES (1, 'webhook_added', ?, json_object('webhook_id', ?))",
          (job, hook_id))
    q("INSERT INTO alerts (id, name, sql, every_s, webhook_id, user_id, seen, next_run_at, fired, created_at) "
      "VALUES (2, 'xid', 'SELECT 1', 60, 3, 1, '[\"ab\"]', 5, 1, 2)")
    q("INSERT INTO webhook_deliveries (webhook_id, event_seq, event, status, attempts, first_try_at, last_try_at) "
      "VALUES (5, 3, 'job.failed', 'delivered', 1, 3, 3)")
    # the newest webhook (8) and alert (4) were removed: only their events name them now
    q("INSERT INTO events (at, kind, data) VALUES (1, 'webhook_added', '{\"webhook_id\": 8}'), "
      "(1, 'webhook_removed', '{\"webhook_id\": 8}'), (1, 'alert_added', '{\"alert_id\": 4, \"webhook_id\": 1}'), "
      "(1, 'alert_removed', '{\"alert_id\": 4, \"name\": \"gone\"}')")
    before = {t: q(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall() for t in ("webhooks", "alerts", "webhook_deliveries",
                                                                           "events")}
    assert q("SELECT max(seq) AS n FROM events").fetchall()[0]["n"] == 8   # seqs up to 40 were pruned: the cursors say

    assert db.ensure_schema(old) == db.schema_version()
    fresh = build(tmp_path / "fresh.db")
    assert schema_rows(old) == schema_rows(fresh)
    assert _next_ids(fresh) == (1, 1) and _next_seq(fresh) == 1   # a new file starts at 1
    fresh.close()
    after = {t: q(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall() for t in before}
    assert all(r.pop("disabled") is None for r in after["webhooks"])   # version 21's column, on every row
    assert after == before
    assert _next_ids(old) == (9, 5) and _next_seq(old) == 41
    q("DELETE FROM alerts WHERE id = 5")
    q("DELETE FROM webhooks WHERE id = 9")
    q("DELETE FROM events WHERE seq = 41")
    assert _next_ids(old) == (10, 6) and _next_seq(old) == 42   # the newest removed: its id is not given again
    assert q("PRAGMA integrity_check").fetchall() == [{"integrity_check": "ok"}]
    old.close()
    stock = sqlite3.connect(f"file:{tmp_path / 'old.db'}?mode=ro", uri=True)   # Python's sqlite3, as the 3.40 CLI
    try:
        assert stock.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert [r[0] for r in stock.execute("SELECT id FROM webhooks ORDER BY id")] == [1, 2, 3, 5, 10]
        assert dict(stock.execute("SELECT name, seq FROM sqlite_sequence")) == {"events": 42, "webhooks": 10, "alerts": 6}
    finally:
        stock.close()


def test_version_18_file_without_notifications_starts_its_ids_at_one(tmp_path):
    old = _at_version(tmp_path / "old.db", 18)
    assert db.ensure_schema(old) == db.schema_version()
    assert _next_ids(old) == (1, 1) and _next_seq(old) == 1
    old.close()


def test_the_outbox_reads_only_the_deliveries_being_retried(built):
    """due_webhooks (every tick of the outbox) finds a webhook's retrying delivery through the partial index,
    not by walking every delivery kept for the webhook (they are kept for --job-retention)."""
    conn, _ = built
    sql = QUERIES["due_webhooks"]
    params = {p: None for p in PARAM.findall(sql)}
    plan = " | ".join(r["detail"] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params).fetchall())
    assert "webhook_deliveries_retrying" in plan, plan
