"""The architecture's import rules (docs/architecture.md, "Import contracts"), checked on the source.

Every `import` and `from ... import` in every module counts, including those
inside functions (a lazy import is still a dependency) and those under `if
TYPE_CHECKING:` (a type-only import still ties the two modules together). A
rule names who may not import what, so a new module is covered the day it is
added. No module of gpulayer, agent or explorer may be part of an import
cycle, lazy and type-only imports counted.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


class Import:
    """One imported name; `names` are what `from target import ...` took from it (empty otherwise)."""

    def __init__(self, target: str, line: int, lazy: bool, names: tuple[str, ...] = ()):
        self.target, self.line, self.lazy, self.names = target, line, lazy, names


def _imports(path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(), str(path))
    module, is_package = _module_name(path), path.name == "__init__.py"
    found: list[Import] = []

    def visit(node, lazy: bool):
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                found.extend(Import(alias.name, child.lineno, lazy) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = _resolve(module, child, is_package)
                found.append(Import(base, child.lineno, lazy, tuple(alias.name for alias in child.names)))
                # `from gpulayer import client` imports gpulayer.client
                found.extend(Import(f"{base}.{alias.name}", child.lineno, lazy) for alias in child.names)
            visit(child, inner)

    visit(tree, False)
    return found


def _sources(*packages: str) -> list[Path]:
    return sorted(p for package in packages for p in (ROOT / package).rglob("*.py"))


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _violations(sources, forbidden, *, allow_lazy=False, allowed=()) -> list[str]:
    bad = []
    for path in sources:
        for imp in _imports(path):
            if any(_under(imp.target, a) for a in allowed):
                continue
            if any(_under(imp.target, f) for f in forbidden) and not (allow_lazy and imp.lazy):
                bad.append(f"{path.relative_to(ROOT)}:{imp.line} imports {imp.target}")
    return sorted(set(bad))


#: The agent's folders by concern (docs/architecture.md, "agent/"), bottom first.
AGENT_FOLDERS = ("gpu", "link", "artifacts", "sandbox", "run", "relay")
SERVER_ADMIN_COMMANDS = ("server.py", "up.py", "local.py", "policy.py")  # start or administer a local control plane
#                                                    (policy.py: a replay on copies of its state file, offline)
READONLY_SQL = "gpulayer/server/store/readonly_sql.py"  # the standalone explorer's one piece of gpulayer
FRONTENDS = "gpulayer.server.frontends"  # granian's and cheroot's private APIs, patched: fenced
# The modules that start a front end: the process, and a front-end process of `--front-ends N`.
PROCESS_ENTRIES = ("gpulayer/server/process.py", "gpulayer/server/multiproc/frontend.py")


RULES = {
    "agent imports nothing of gpulayer but its protocol, the relay link and the process runtime": (
        _sources("agent"), ["gpulayer", "explorer"], False),
    # The agent's folders, from the bottom: gpu/ and link/ (each alone), artifacts/, sandbox/, run/, relay/; the
    # root (the entry point and the worker's session) on top. A folder imports nothing of those above it.
    "agent's folders import nothing of the worker's session": (
        _sources(*(f"agent/{f}" for f in AGENT_FOLDERS)),
        [f"agent.{m}" for m in ("__main__", "worker", "config", "hardening", "session", "worker_state", "registration",
                                "heartbeat")], False),
    "agent/gpu imports nothing of the agent's other folders": (
        _sources("agent/gpu"), [f"agent.{f}" for f in AGENT_FOLDERS if f != "gpu"], False),
    "agent/link imports nothing of the agent's other folders": (
        _sources("agent/link"), [f"agent.{f}" for f in AGENT_FOLDERS if f != "link"], False),
    "agent/artifacts imports nothing of the agent's folders but the link": (
        _sources("agent/artifacts"), ["agent.gpu", "agent.sandbox", "agent.run", "agent.relay"], False),
    "agent/sandbox imports nothing of the task runner or the relay": (
        _sources("agent/sandbox"), ["agent.gpu", "agent.run", "agent.relay"], False),
    "agent/run imports nothing of the relay": (_sources("agent/run"), ["agent.gpu", "agent.relay"], False),
    "explorer imports nothing of gpulayer but the read-only SQL runner": (
        _sources("explorer"), ["gpulayer", "agent"], False),
    "the read-only SQL runner imports nothing of gpulayer": (
        [ROOT / READONLY_SQL], ["gpulayer", "explorer", "agent"], False),
    "protocol imports nothing of gpulayer but itself": (_sources("gpulayer/protocol"), ["gpulayer"], False),
    "the relay link imports nothing of gpulayer but the protocol": (_sources("gpulayer/relaylink"), ["gpulayer"], False),
    "the process runtime imports nothing of gpulayer": (_sources("gpulayer/proc"), ["gpulayer"], False),
    "client imports nothing of server or cli": (
        _sources("gpulayer/client"), ["gpulayer.server", "gpulayer.cli", "agent", "explorer"], False),
    "cli imports the server only in server/up/local, lazily": (
        [p for p in _sources("gpulayer/cli") if p.name not in SERVER_ADMIN_COMMANDS], ["gpulayer.server"], False),
    "cli imports the read-only SQL runner lazily (apsw is the server extra's)": (
        _sources("gpulayer/cli"), ["gpulayer.server.store.readonly_sql"], True),
    "cli's server commands import the server lazily": (
        [ROOT / "gpulayer/cli" / name for name in SERVER_ADMIN_COMMANDS], ["gpulayer.server"], True),
    "store imports nothing above it": (
        _sources("gpulayer/server/store"),
        ["gpulayer.server.scheduler", "gpulayer.server.http", "gpulayer.server.provisioning", "gpulayer.server.kube",
         "gpulayer.server.process", "gpulayer.client", "gpulayer.cli", "falcon", "cheroot", "granian"], False),
    "validators import nothing of the server but its errors": (
        [ROOT / "gpulayer/server/validators.py"], ["gpulayer.server", "gpulayer.client", "gpulayer.cli"], False),
    "security imports nothing above the store": (
        _sources("gpulayer/server/security"),
        ["gpulayer.server.scheduler", "gpulayer.server.http", "gpulayer.server.provisioning",
         "gpulayer.server.process", "gpulayer.server.replication", "falcon", "cheroot", "granian"], False),
    "replication imports nothing of the scheduler, HTTP or the process": (
        _sources("gpulayer/server/replication"),
        ["gpulayer.server.scheduler", "gpulayer.server.http", "gpulayer.server.provisioning",
         "gpulayer.server.process", "falcon", "cheroot", "granian"], False),
    "relay imports nothing of HTTP (what both use sits below them)": (
        _sources("gpulayer/server/relay"),
        ["gpulayer.server.http", "gpulayer.server.process", "gpulayer.server.provisioning", "gpulayer.client",
         "gpulayer.cli", "falcon", "cheroot"], False),
    "nothing but the process entries imports the front ends (they patch granian's and cheroot's private APIs)": (
        [p for p in _sources("gpulayer", "agent", "explorer")
         if p not in {ROOT / e for e in PROCESS_ENTRIES} and not _under(_module_name(p), FRONTENDS)], [FRONTENDS], False),
    "the /v1 app imports nothing of the front ends, nor their servers": (
        _sources("gpulayer/server/http"), [FRONTENDS, "cheroot", "granian"], False),
    "the front ends import nothing of the app or what it calls (they carry a WSGI app they are given)": (
        _sources("gpulayer/server/frontends"),
        ["gpulayer.server.http", "gpulayer.server.scheduler", "gpulayer.server.store", "gpulayer.server.relay",
         "gpulayer.server.notify", "gpulayer.server.process", "gpulayer.server.provisioning",
         "gpulayer.server.replication", "gpulayer.server.security", "falcon"], False),
    "the runtime state imports nothing of the scheduler's facade, nor above it (the facade holds it)": (
        _sources("gpulayer/server/runtime"),
        ["gpulayer.server.scheduler.core", "gpulayer.server.scheduler.facade", "gpulayer.server.scheduler.worker_requests",
         "gpulayer.server.scheduler.notifications", "gpulayer.server.http", FRONTENDS, "gpulayer.server.relay",
         "gpulayer.server.notify", "gpulayer.server.process", "gpulayer.server.provisioning", "falcon", "cheroot",
         "granian"], False),
    "metrics renders what the scheduler counts, and runs no query": (
        [ROOT / "gpulayer/server/http/metrics.py"], ["gpulayer.server.store"], False),
    "scheduler imports nothing of HTTP": (
        _sources("gpulayer/server/scheduler"),
        ["gpulayer.server.http", "gpulayer.server.process", "gpulayer.server.provisioning", "gpulayer.server.kube",
         "gpulayer.client", "gpulayer.cli", "falcon", "cheroot", "granian", "waitress", "requests"], False),
    "provisioning does not reach into HTTP": (
        _sources("gpulayer/server/provisioning"), ["gpulayer.server.http", "gpulayer.cli", "falcon"], False),
    "kube (the Kubernetes API, the pod's init step) imports nothing of the scheduler, the store, HTTP or the process": (
        _sources("gpulayer/server/kube"),
        ["gpulayer.server.scheduler", "gpulayer.server.store", "gpulayer.server.http", "gpulayer.server.process",
         "gpulayer.server.runtime", "gpulayer.cli", "falcon", "cheroot", "granian"], False),
    "the server imports nothing of the client or the CLI": (
        _sources("gpulayer/server"), ["gpulayer.client", "gpulayer.cli"], False),
}

#: What a rule lets through of what it forbids: the protocol (gpulayer/protocol/: the wire), the relay link
#: (gpulayer/relaylink/) and the process runtime (gpulayer/proc/) are the pieces of gpulayer the agent shares, and they
#: import nothing of gpulayer but themselves (the link: and the protocol); the read-only SQL runner is the one piece the
#: explorer shares (and `gpulayer sql`, lazily, for its hidden columns), and it imports nothing of gpulayer.
ALLOWED = {"agent imports nothing of gpulayer but its protocol, the relay link and the process runtime": [
               "gpulayer.protocol", "gpulayer.relaylink", "gpulayer.proc"],
           "explorer imports nothing of gpulayer but the read-only SQL runner": ["gpulayer.server.store.readonly_sql"],
           "cli imports the server only in server/up/local, lazily": ["gpulayer.server.store.readonly_sql"],
           "protocol imports nothing of gpulayer but itself": ["gpulayer.protocol"],
           "the relay link imports nothing of gpulayer but the protocol": ["gpulayer.relaylink", "gpulayer.protocol"],
           "the process runtime imports nothing of gpulayer": ["gpulayer.proc"],
           "validators import nothing of the server but its errors": ["gpulayer.server.errors"]}


@pytest.mark.parametrize("rule", RULES)
def test_import_contract(rule):
    sources, forbidden, allow_lazy = RULES[rule]
    assert sources, f"{rule}: no source files found"
    assert _violations(sources, forbidden, allow_lazy=allow_lazy, allowed=ALLOWED.get(rule, ())) == []


def test_the_checker_sees_lazy_and_relative_imports(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("from . import sibling\ndef f():\n    import gpulayer.server.process\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    imports = {(i.target, i.lazy) for i in _imports(pkg / "mod.py")}
    assert ("pkg.sibling", False) in imports and ("gpulayer.server.process", True) in imports


def _import_graph(paths: list[Path]) -> dict[str, set[str]]:
    """Module -> the modules it imports (lazy ones included), among `paths` only."""
    modules = {_module_name(p): p for p in paths}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for imp in _imports(path):
            if imp.names and all(f"{imp.target}.{n}" in modules for n in imp.names):
                continue  # `from pkg import mod` depends on mod (its own entry), not on pkg/__init__
            target = imp.target
            while target and target not in modules:  # `from a.b import name`: the module a.b
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_import_cycles():
    """A cycle hidden by a lazy or a type-only import is still a cycle: move the shared piece down, or let the
    lower module name what it needs (a Protocol, as agent/run/services.py's ReplicaRunner), or pass it in."""
    assert _cycles(_import_graph(_sources("gpulayer", "agent", "explorer"))) == []


def test_the_cycle_check_sees_a_lazy_cycle(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("from .b import thing\n")
    (pkg / "b.py").write_text("thing = 1\ndef f():\n    from .a import x\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert _cycles(_import_graph(_sources("pkg"))) == [["pkg.a", "pkg.b"]]


def test_the_cycle_check_sees_a_type_only_cycle(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import thing\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nthing = 1\nif TYPE_CHECKING:\n    from .a import x\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert _cycles(_import_graph(_sources("pkg"))) == [["pkg.a", "pkg.b"]]
