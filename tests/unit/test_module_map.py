"""Every module of gpulayer/, agent/ and explorer/ is on docs/architecture.md's map (and the reverse).

The map is the page's first code block: a tree, two spaces a level, a folder written `name/`, each module
on a line of its own with what it holds beside it.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("gpulayer", "agent", "explorer")
# A name in the tree's name column: indented by levels of two spaces, then two spaces or the line's end.
ENTRY = re.compile(r"^((?:  )*)([\w.]+/|[\w.]+\.py)(?:  +(.*))?$")


def _map() -> dict[str, str]:
    """Each module the map names (its path from the repository root), with what the map says it holds."""
    block = DOC.read_text().split("```\n", 2)[1]
    folders: list[str] = []
    named: dict[str, str] = {}
    for line in block.splitlines():
        match = ENTRY.match(line)
        if not match:
            continue
        indent, name, holds = match.groups()
        level = len(indent) // 2
        del folders[level:]
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
        elif folders and folders[0] in PACKAGES:
            path = "/".join([*folders, name])
            assert path not in named, f"docs/architecture.md names {path} twice"
            named[path] = (holds or "").strip()
    return named


def _modules() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for package in PACKAGES for p in (ROOT / package).rglob("*.py")
            if "__pycache__" not in p.parts}


def test_every_module_is_on_the_map():
    missing = sorted(_modules() - set(_map()))
    assert not missing, f"modules missing from docs/architecture.md's map (a line each, saying what it holds): {missing}"


def test_every_module_on_the_map_exists():
    unknown = sorted(set(_map()) - _modules())
    assert not unknown, f"docs/architecture.md's map names modules that do not exist: {unknown}"


def test_each_module_on_the_map_says_what_it_holds():
    silent = sorted(path for path, holds in _map().items() if not holds)
    assert not silent, f"modules on docs/architecture.md's map with nothing beside them: {silent}"
