"""The read-only locks, the limits and the hidden columns, against a real state file."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import apsw
import pytest
from explorer_state import SECRET_MARKERS, file_digest

from gpulayer.server.store.readonly_sql import QueryError, QueryTimeout, ReadOnlyDatabase
from gpulayer.server.store.db import schema_version

RUNAWAY = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"

REFUSED = [
    ("INSERT INTO jobs (spec, created_at) VALUES ('{}', 1)", "INSERT into jobs is not allowed"),
    ("UPDATE jobs SET name = 'x'", "UPDATE of jobs is not allowed"),
    ("DELETE FROM jobs", "DELETE from jobs is not allowed"),
    ("DROP TABLE jobs", "changing the schema"),
    ("DROP VIEW worker_load", "changing the schema"),
    ("CREATE TABLE x (a)", "changing the schema"),
    ("CREATE TEMP TABLE x (a)", "changing the schema"),
    ("ALTER TABLE jobs ADD COLUMN x", "ALTER TABLE jobs is not allowed"),
    ("SELECT 1; DELETE FROM jobs", "only one statement per query"),
    ("SELECT 1; SELECT 2", "only one statement per query"),
    ("ATTACH 'other.db' AS other", "ATTACH, DETACH and VACUUM INTO are not allowed"),
    ("VACUUM INTO 'copy.db'", "this statement would write"),
    ("SELECT load_extension('/tmp/evil.so')", "load_extension() is not allowed"),
    ("PRAGMA journal_mode = delete", "PRAGMA journal_mode is not allowed"),
    ("PRAGMA user_version = 7", "PRAGMA user_version may be read but not set"),
    ("PRAGMA writable_schema = 1", "PRAGMA writable_schema is not allowed"),
    ("PRAGMA wal_checkpoint(TRUNCATE)", "PRAGMA wal_checkpoint is not allowed"),
    ("BEGIN IMMEDIATE", "BEGIN, COMMIT, ROLLBACK and SAVEPOINT are not allowed"),
    ("REINDEX", "REINDEX"),
    ("ANALYZE", "changing the schema"),
    ("SELECT token_hash FROM tokens", "column tokens.token_hash is hidden"),
    ("SELECT * FROM workers", "column workers.session_hash is hidden"),
    ("SELECT name FROM secrets WHERE ciphertext IS NOT NULL", "column secrets.ciphertext is hidden"),
]


@pytest.fixture
def db(state: Path) -> ReadOnlyDatabase:
    return ReadOnlyDatabase(str(state), time_limit_s=0.3, max_rows=5)


@pytest.mark.parametrize(("sql", "message"), REFUSED)
def test_refused_with_a_clear_error_and_the_file_unchanged(db: ReadOnlyDatabase, state: Path, sql: str,
                                                           message: str) -> None:
    before = file_digest(state)
    with db.session() as session, pytest.raises(QueryError) as refused:
        session.query(sql)
    assert message in str(refused.value)
    assert file_digest(state) == before
    assert not (state.parent / "copy.db").exists()
    assert not (state.parent / "other.db").exists()


def test_runaway_recursive_cte_is_stopped_by_the_time_limit(db: ReadOnlyDatabase, state: Path) -> None:
    before = file_digest(state)
    started = time.monotonic()
    with db.session() as session, pytest.raises(QueryTimeout) as stopped:
        session.query(RUNAWAY)
    assert str(stopped.value) == "query took longer than 0.3 s and was stopped"
    assert time.monotonic() - started < 2
    assert file_digest(state) == before


def test_the_connection_is_read_only_even_without_the_authorizer(db: ReadOnlyDatabase) -> None:
    conn, _guard = db.connect()
    conn.authorizer = None
    assert conn.execute("PRAGMA query_only").fetchall() == [(1,)]
    with pytest.raises(apsw.ReadOnlyError):
        conn.execute("DELETE FROM jobs")
    conn.close()


def test_row_limit_reports_truncated(db: ReadOnlyDatabase) -> None:
    with db.session() as session:
        result = session.query("SELECT seq FROM events ORDER BY seq")
        assert result.truncated and [r[0] for r in result.rows] == [1, 2, 3, 4, 5]
        exact = session.query("SELECT seq FROM events ORDER BY seq LIMIT 5")
        assert not exact.truncated and len(exact.rows) == 5


def test_reads_views_pragmas_and_named_parameters(db: ReadOnlyDatabase) -> None:
    with db.session() as session:
        assert session.query("PRAGMA user_version").rows == [(schema_version(),)]
        assert ("name",) in [(r[1],) for r in session.query("PRAGMA table_info(jobs)").rows]
        assert session.query("SELECT count(*) FROM tokens").rows == [(2,)]
        assert session.query("SELECT jti, kind FROM tokens ORDER BY jti").rows[0] == ("jti-ci", "client")
        result = session.query("SELECT name FROM jobs WHERE id = :id AND :other IS NULL", {"id": 7})
        assert result.columns == ["name"] and result.rows == [("fits",)]
        assert session.parameters("SELECT :since, :until, :since") == ["since", "until"]
        assert session.query("  -- leading comment\n SELECT 1; -- trailing\n").rows == [(1,)]


@pytest.mark.parametrize(("sql", "message", "near"), [
    ("SELECT bogus FROM jobs", "no such column: bogus", "bogus"),
    ("SELECT id FROM jobz", "no such table: jobz", "jobz"),
    ("SELECT id FORM jobs", 'near "jobs": syntax error', "jobs"),
    ("SELECT id,\n  nope(id) FROM jobs", "no such function: nope", "nope"),
])
def test_sql_errors_point_at_the_problem(db: ReadOnlyDatabase, sql: str, message: str, near: str) -> None:
    with db.session() as session, pytest.raises(QueryError) as failed:
        session.query(sql)
    assert failed.value.message == message
    assert sql[failed.value.offset:].startswith(near)
    assert "line" in str(failed.value) and near in str(failed.value)


def test_hidden_values_cannot_be_read_through_any_route(db: ReadOnlyDatabase) -> None:
    tries = ["SELECT * FROM tokens", "SELECT hex(token_hash) FROM tokens", "SELECT jti FROM tokens ORDER BY token_hash",
             "SELECT (SELECT session_hash FROM workers LIMIT 1)", "SELECT * FROM secrets",
             "SELECT group_concat(ciphertext) FROM secrets", "WITH t AS (SELECT * FROM tokens) SELECT 1 FROM t"]
    with db.session() as session:
        for sql in tries:
            with pytest.raises(QueryError, match="is hidden"):
                session.query(sql)
        dump = session.query("SELECT sql FROM sqlite_master").rows
    assert not any(marker in str(dump) for marker in SECRET_MARKERS)


def test_readers_never_block_the_writer(db: ReadOnlyDatabase, state: Path) -> None:
    """A long read (the runaway CTE over a table) runs while the server's writer commits."""
    slow = ReadOnlyDatabase(str(state), time_limit_s=1.5)
    started = threading.Event()

    def read() -> None:
        with slow.session() as session:
            started.set()
            with pytest.raises(QueryTimeout):
                session.query("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c)"
                              " SELECT count(*) FROM c, jobs")

    reader = threading.Thread(target=read)
    reader.start()
    started.wait(5)
    writer = apsw.Connection(str(state))
    # A writer blocked by the read would fail after 200 ms; a reader still opening the
    # file may hold the WAL index for a moment, which 0 ms turned into a flaky failure.
    writer.set_busy_timeout(200)
    t0 = time.monotonic()
    with writer:
        writer.execute("INSERT INTO events (at, kind, data) VALUES (1, 'probe', '{}')")
    assert time.monotonic() - t0 < 0.5
    writer.close()
    reader.join(5)
    with db.session() as session:
        assert session.query("SELECT count(*) FROM events WHERE kind = 'probe'").rows == [(1,)]
