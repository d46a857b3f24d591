"""queries.sql: every block parses, prepares against schema.sql, and is used or documented."""
from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import apsw
import pytest
from explorer_state import ensure_gpu_samples

from explorer.queries import CANNED, PAGE_PREFIX, QUERIES, parse_queries
from gpulayer.server.store.readonly_sql import ReadOnlyDatabase

ROOT = Path(__file__).resolve().parents[2]
EXPLORER = ROOT / "explorer"


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_every_query_prepares_read_only_against_the_schema(state: Path, name: str) -> None:
    query = QUERIES[name]
    assert query.description and not query.description.startswith("--")
    if "gpu_samples" in query.sql:  # read only where the state file has it (schema version 18 on)
        db = apsw.Connection(str(state))
        ensure_gpu_samples(db)
        db.close()
    with ReadOnlyDatabase(str(state)).session() as session:
        session.parameters(query.sql)  # prepares through the authorizer; raises on an error


def test_every_page_query_is_used_and_every_canned_query_documented() -> None:
    code = "\n".join(p.read_text() for p in EXPLORER.glob("*.py"))
    for name in QUERIES:
        if name.startswith(PAGE_PREFIX):
            assert f'QUERIES["{name}"]' in code, f"{name} is used by nothing"
    docs = (ROOT / "docs" / "explorer.md").read_text()
    for name in CANNED:
        assert f"`{name}`" in docs, f"canned query {name} is not in docs/explorer.md"


def test_parse_refuses_blocks_without_description_or_sql() -> None:
    assert parse_queries("-- name: a --\n-- says a\nSELECT 1;\n")["a"].sql == "SELECT 1;"
    with pytest.raises(ValueError, match="description"):
        parse_queries("-- name: a --\nSELECT 1;\n")
    with pytest.raises(ValueError, match="twice"):
        parse_queries("-- name: a --\n-- x\nSELECT 1;\n-- name: a --\n-- y\nSELECT 2;\n")


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_every_query_prepares_on_the_stock_sqlite3(state: Path, name: str) -> None:
    """The explorer runs on apsw's SQLite (newer); ops run the same SQL on Debian's sqlite3 (3.40)."""
    if "gpu_samples" in QUERIES[name].sql:
        db = apsw.Connection(str(state))
        ensure_gpu_samples(db)
        db.close()
    conn = sqlite3.connect(f"file:{state}?mode=ro", uri=True)
    try:
        names = set(re.findall(r"(?<!:):([a-z_]+)", QUERIES[name].sql))
        conn.execute("EXPLAIN " + QUERIES[name].sql, dict.fromkeys(names, 1))
    finally:
        conn.close()
