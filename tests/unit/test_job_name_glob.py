"""`GET /v1/jobs?name=`: the glob, as the server hands it to SQLite's GLOB, matches exactly the names
Python's fnmatch matches (the CLI's `--name` matched with fnmatch before the server filtered)."""
from __future__ import annotations

import fnmatch
import itertools
import random
import re

import apsw
import pytest

from gpulayer.server.scheduler.views import glob_pattern

NAMES = ["".join(p) for k in range(3) for p in itertools.product("ab^!][-*?\\", repeat=k)] + \
    ["sweep-1", "sweep-12", "run-7", "sweep[x]"]
CHOSEN = ["sweep-*", "run-?", "[ab]*", "[!x]*", "[^x]*", "[^]", "[]a]", "[!]]x", "a[", "[[!]", "[a-c]?",
          "x[!a-c]", "*[*", "[*]", "?[?]", "\\*", "[\\]", "a]b", "[^^]", "[!^]", "[a^]", "sweep[[]x]", "[!"]
REVERSED_RANGE = re.compile(r"\[!?\]?[^]]*?(.)-(.)")  # `[z-a]`: empty in fnmatch, not in GLOB


def _random_patterns(n: int) -> list[str]:
    rng = random.Random(23)
    found = ["".join(rng.choice("ab^!]-[*?") for _ in range(rng.randint(1, 6))) for _ in range(n)]
    return [p for p in found if not any(a > b for a, b in REVERSED_RANGE.findall(p))]


@pytest.fixture(scope="module")
def glob():
    conn = apsw.Connection(":memory:")
    return lambda name, pattern: bool(conn.execute("SELECT ? GLOB ?", (name, pattern)).fetchall()[0][0])


@pytest.mark.parametrize("pattern", CHOSEN + _random_patterns(400))
def test_the_server_glob_matches_what_fnmatch_matches(glob, pattern):
    translated = glob_pattern(pattern)
    differ = [n for n in NAMES if glob(n, translated) != fnmatch.fnmatchcase(n, pattern)]
    assert differ == [], (pattern, translated)
