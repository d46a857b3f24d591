"""One door for writes: outside the scheduler and the store, nothing writes the state file but through the Scheduler.

`Store.write(fn, ...)` runs `fn(conn, ...)` on the one writer. The scheduler's facade wraps it (facade.Facade._write:
the cascades a write asks for, the wake-up of parked acquires) and every caller above it (the /v1 app, the relay,
notifications, provisioning, the process) calls a named Scheduler method instead. Checked on the source: any
`<...>.store.write` or `store.write`, called or handed on as a callable, outside gpulayer/server/scheduler/ and
gpulayer/server/store/ fails.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOOR = (ROOT / "gpulayer/server/scheduler", ROOT / "gpulayer/server/store")


def _store_writes(tree: ast.AST) -> list[int]:
    """The lines of `store.write`, `x.store.write`, `Store.write` (a call or a reference)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "write":
            owner = node.value
            name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
            if name in ("store", "Store", "_store"):
                found.append(node.lineno)
    return found


def test_nothing_outside_the_scheduler_and_the_store_calls_store_write():
    bad = []
    for package in ("gpulayer", "agent", "explorer"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if any(path.is_relative_to(door) for door in DOOR):
                continue
            bad += [f"{path.relative_to(ROOT)}:{line}" for line in _store_writes(ast.parse(path.read_text()))]
    assert bad == [], f"writes around the Scheduler (add a named Scheduler call for each): {bad}"


def test_the_check_sees_a_call_and_a_handed_on_write():
    tree = ast.parse("self.store.write(f, 1)\nrun(self.scheduler.store.write, f)\nstore.write(g)\nout.write(b'x')\n")
    assert _store_writes(tree) == [1, 2, 3]
