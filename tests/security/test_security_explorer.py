"""The explorer refuses every write path, through its HTTP routes, and the state file stays byte for byte the same.

explorer.create_app over a copy of a state file that a real scheduler wrote
(jobs, workers, tokens, events). The library-level locks are tested in
tests/explorer/test_readonly.py; this is the route a person or script would use.
"""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import falcon.testing
import pytest
import requests

import explorer
from gpulayer.server.http.app import new_deps
from gpulayer.server.config import ControlPlaneConfig
from gpulayer.testing import ControlPlaneProcess

WRITES = [
    "INSERT INTO jobs (spec, created_at) VALUES ('{}', 0)",
    "UPDATE jobs SET state = 'succeeded'",
    "DELETE FROM events",
    "DROP TABLE tasks",
    "DROP VIEW worker_load",
    "CREATE TABLE pwned (x)",
    "CREATE TEMP TABLE pwned (x)",
    "ALTER TABLE jobs ADD COLUMN pwned",
    "CREATE INDEX pwned ON jobs (name)",
    "CREATE TRIGGER pwned AFTER INSERT ON jobs BEGIN DELETE FROM jobs; END",
    "REPLACE INTO tokens (jti, kind, name, token_hash, created_at) VALUES ('x', 'client', 'x', 'x', 0)",
    "INSERT INTO workers SELECT * FROM workers",
    "WITH x AS (SELECT 1) UPDATE jobs SET name = 'x'",
    "ATTACH DATABASE '/tmp/pwned.db' AS pwned",
    "ATTACH 'file:/tmp/pwned2.db?mode=rwc' AS p",
    "DETACH DATABASE main",
    "PRAGMA user_version = 99",
    "PRAGMA journal_mode = DELETE",
    "PRAGMA query_only = 0",
    "PRAGMA writable_schema = 1",
    "PRAGMA wal_checkpoint(TRUNCATE)",
    "PRAGMA incremental_vacuum",
    "PRAGMA optimize",
    "VACUUM",
    "VACUUM INTO '/tmp/pwned-copy.db'",
    "REINDEX",
    "ANALYZE",
    "BEGIN IMMEDIATE",
    "SAVEPOINT s",
    "SELECT load_extension('/tmp/pwned.so')",
    "SELECT writefile('/tmp/pwned.txt', 'x')",
    "SELECT 1; DELETE FROM jobs",
    "SELECT * FROM jobs; DROP TABLE jobs",
    "/* comment */ DELETE FROM jobs",
    "-- comment\nDELETE FROM jobs",
    "SELECT token_hash FROM tokens",
    "SELECT session_hash FROM workers",
]


@pytest.fixture(scope="module")
def state_copy(tmp_path_factory):
    """A state file with real rows in it, copied (with no -wal left) as an operator would."""
    from gpulayer.server.security.auth import init_home
    root = tmp_path_factory.mktemp("explorer")
    init_home(root / "home")
    deps = new_deps(ControlPlaneConfig(home=root / "home"))
    for i in range(3):
        deps.scheduler.submit({"command": ["echo", str(i)], "name": f"job{i}"})
    deps.scheduler.mint_token(name="t", labels={}, expires_in_s=None)
    deps.store.close()
    copy = root / "copy.db"
    shutil.copy(root / "home" / "state.db", copy)
    return copy


def _digest(path):
    """The main file's hash and the WAL's size: a WAL reader may create an empty -wal and a -shm, never a frame."""
    wal = path.with_name(path.name + "-wal")
    return hashlib.sha256(path.read_bytes()).hexdigest(), wal.stat().st_size if wal.exists() else 0


@pytest.fixture(params=["open", "token"])
def browse(request, state_copy):
    auth = None if request.param == "open" else (lambda token: token == "glc_good")
    app = explorer.create_app(str(state_copy), auth=auth)
    headers = {} if auth is None else {"Authorization": "Bearer glc_good"}
    return falcon.testing.TestClient(app, headers=headers)


@pytest.mark.parametrize("sql", WRITES)
def test_every_write_is_refused_and_the_file_is_unchanged(browse, state_copy, sql):
    before = _digest(state_copy)
    jobs_before = browse.simulate_get("/-/query.json", params={"sql": "SELECT count(*) AS n FROM jobs"}).json
    for suffix in ("", ".json", ".csv"):
        r = browse.simulate_get(f"/-/query{suffix}", params={"sql": sql})
        assert r.status_code < 500, (sql, suffix, r.status_code, r.text[:300])
        if suffix == ".json":
            assert r.status_code >= 400, (sql, r.text[:300])
        else:
            assert r.status_code >= 400 or "refused" in r.text.lower() or "error" in r.text.lower(), (sql, suffix)
        for verb in ("POST", "PUT", "DELETE", "PATCH"):
            assert browse.simulate_request(verb, f"/-/query{suffix}", params={"sql": sql}).status_code in (404, 405)
    assert browse.simulate_get("/-/query.json", params={"sql": "SELECT count(*) AS n FROM jobs"}).json == jobs_before
    assert _digest(state_copy) == before, sql
    for leftover in ("/tmp/pwned.db", "/tmp/pwned2.db", "/tmp/pwned-copy.db", "/tmp/pwned.txt"):
        assert not __import__("os").path.exists(leftover), leftover


def test_table_pages_take_no_writes(browse, state_copy):
    before = _digest(state_copy)
    assert before[1] == 0
    for path in ("/jobs", "/tasks", "/-/workers", "/-/jobs/1", "/"):
        for verb in ("POST", "PUT", "DELETE", "PATCH"):
            assert browse.simulate_request(verb, path, body="x").status_code in (404, 405), (verb, path)
    r = browse.simulate_get("/jobs", params={"_sort": "id; DROP TABLE jobs", "_where": "1; DELETE FROM jobs"})
    assert r.status_code < 500
    assert _digest(state_copy) == before


def _peak_rss_mb(pid: int) -> float:
    """The highest resident set size the process has had (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc/PID/status")


HUGE_VALUES = [
    "select zeroblob(999999999)",
    "select printf('%.*c', 999999999, 'x')",
    "select hex(zeroblob(4e8))",
    "select length(zeroblob(999999999))",
    "select group_concat(zeroblob(999999)) from (with recursive r(n) as"
    " (select 1 union all select n + 1 from r limit 5000) select n from r)",
]
MANY_BIG_ROWS = ("with recursive r(n) as (select 1 union all select n + 1 from r limit 1000)"
                 " select n, zeroblob(999999) as blob from r")


def test_huge_values_are_refused_fast_and_memory_stays_bounded(tmp_path):
    """Through a real control plane: each query answers 400 at once, pages stay small, RSS stays put."""
    with ControlPlaneProcess(tmp_path) as plane:
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {plane.client_token}"
        url = f"{plane.url}/explorer/-/query"
        assert session.get(url + ".json", params={"sql": "select 1"}, timeout=30).status_code == 200
        before = _peak_rss_mb(plane.pid)
        for sql in HUGE_VALUES:
            for suffix in (".json", ".csv", ""):
                answer = session.get(url + suffix, params={"sql": sql}, timeout=30)
                assert answer.status_code == 400, (sql, suffix, answer.text[:300])
                if suffix == ".json":
                    assert "too big" in answer.json()["error"], answer.text[:300]
        for suffix in (".json", ".csv", ""):
            answer = session.get(url + suffix, params={"sql": MANY_BIG_ROWS}, timeout=30)
            assert answer.status_code == 200 and len(answer.content) < 20_000_000, (suffix, len(answer.content))
        page = session.get(url + ".json", params={"sql": MANY_BIG_ROWS}, timeout=30).json()
        assert page["truncated"] is True and 0 < len(page["rows"]) < 1000
        assert plane.healthy()
        assert _peak_rss_mb(plane.pid) - before < 300, "the explorer's queries grew the server's memory"
