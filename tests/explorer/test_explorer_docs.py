"""docs/sql.md's cookbook runs as written on the stock sqlite3 CLI, read-only."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from explorer_state import file_digest

DOC = Path(__file__).resolve().parents[2] / "docs" / "sql.md"
SQL_BLOCKS = re.findall(r"```sql\n(.*?)```", DOC.read_text(), re.DOTALL)


def test_the_cookbook_has_queries() -> None:
    assert len(SQL_BLOCKS) >= 10


@pytest.mark.skipif(shutil.which("sqlite3") is None, reason="the sqlite3 CLI is not installed")
@pytest.mark.parametrize("sql", SQL_BLOCKS, ids=[f"block{i}" for i in range(len(SQL_BLOCKS))])
def test_cookbook_query_runs_on_the_sqlite3_cli(state: Path, sql: str) -> None:
    before = file_digest(state)
    script = ".param set :job_id 1\n" + sql
    run = subprocess.run(["sqlite3", "-readonly", "-bail", "-header", "-column", str(state)], input=script,
                         capture_output=True, text=True, timeout=30)
    if "no such table: dbstat" in run.stderr:
        pytest.skip("this sqlite3 has no dbstat")
    assert run.returncode == 0 and not run.stderr, run.stderr
    assert file_digest(state) == before
