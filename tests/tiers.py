"""The slow tier: every test that starts a process is marked `slow` by itself, and no other test may start one.

`scripts/test -m "not slow"` is the fast loop (the unit and API tiers: real SQLite files, falcon.testing,
threads); a plain `scripts/test`, as CI runs it, runs every test. Nobody marks a test by hand:

Marking, at collection. A test is `slow` when its function, a fixture it uses (its whole closure, and any
fixture named in `request.getfixturevalue("...")`), or a function or class any of them names, followed through
the test code (test modules, conftests, support modules, gpulayer.testing) and the product, names one of the
STARTERS: subprocess.run, os.fork, multiprocessing, pty, playwright, the agent's run_worker... A test with a
marker of PROCESS_MARKERS (a browser, Slurm, network namespaces) is slow too, and so is a property or fuzz test
(SEARCHES: hypothesis's `given`, which schemathesis's cases go through too), hundreds of examples each. The
marker's `why` says how a test gets there: `python -m pytest --collect-only -q -m slow --why-slow`.

By hand, one rule: a test that holds real sockets to a server's deadlines (a stalled handshake, a slowloris
head, a 50 MB transfer over TLS) waits seconds of wall clock by design, so it is integration-like though it
starts no process. It carries `@WALL_CLOCK` (below), whose `why` says so; nothing else is marked by hand
but a test reaching a process by a way the marking cannot see.

The guard, in every run (the fast loop and CI alike). While a test that is not `slow` sets up or runs, starting
a process from its thread, or from a thread started since its setup began, fails it with "... starts a process
(COMMAND) but is not marked slow ...". A test that reaches a process by a way the marking cannot see (a typer
CliRunner whose command runs `ip`) fails at once for its author, instead of slowing the fast loop down unseen.
"""
from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import importlib
import inspect
import os
import sys
import threading
import types
from pathlib import Path

import pytest

#: What starts a process, by (module, name) as an import sees it (`posix` is `os` seen from `from os import fork`).
STARTERS: dict[str, frozenset[str]] = {
    "subprocess": frozenset({"Popen", "run", "call", "check_call", "check_output", "getoutput", "getstatusoutput"}),
    "os": frozenset({"fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp", "spawnl", "spawnle", "spawnlp",
                     "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe"}),
    "pty": frozenset({"fork", "spawn"}),
    "multiprocessing": frozenset({"Process", "Pool", "get_context"}),
    "asyncio": frozenset({"create_subprocess_exec", "create_subprocess_shell"}),
    "playwright.sync_api": frozenset({"sync_playwright"}),
    # The product, called in-process: the worker runs each task as a child process.
    "agent.worker": frozenset({"run_worker"}),
    # ... and the outbox's delivery thread hands its tries to a child process (gpulayer/server/notify/courier.py).
    "gpulayer.server.notify.outbox": frozenset({"Notifier"}),
}
STARTERS["posix"] = STARTERS["os"]
#: What makes a test slow without a process: a property or fuzz search of hundreds of examples (schemathesis too).
SEARCHES: dict[str, frozenset[str]] = {"hypothesis": frozenset({"given"}), "hypothesis.core": frozenset({"given"})}
#: Markers whose tests start processes whatever their code says.
PROCESS_MARKERS = ("browser", "slurm", "netns")

#: The one hand mark (see above): real sockets held to their deadlines, seconds of wall clock each.
WALL_CLOCK = pytest.mark.slow(why="real sockets held to a server's deadlines: seconds of wall clock by design")

#: The product's packages: followed from a test only through functions and constructors (Reach._followed).
PRODUCT = ("gpulayer", "agent", "explorer")
#: ... but for the harness tests use, followed in full like the test code.
HARNESS = ("gpulayer.testing",)


class _Starter(str):
    """The name of something that starts a process ("subprocess.Popen"), or of a search ("hypothesis.given")."""


def _starter(module_name: str, name: str) -> _Starter | None:
    slow = name in STARTERS.get(module_name, ()) or name in SEARCHES.get(module_name, ())
    return _Starter(f"{module_name}.{name}") if slow else None


def _local_names(tree: ast.AST) -> set[str]:
    """The names `tree` binds itself (parameters, assignments): there they do not name the module's globals."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            arguments = node.args
            names.update(a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
                                         arguments.vararg, arguments.kwarg) if a is not None)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _imports(tree: ast.AST) -> dict[str, object]:
    """What the imports inside a function bind (`from gpulayer.testing import ControlPlaneProcess` in a fixture)."""
    bound: dict[str, object] = {}
    for node in ast.walk(tree):
        try:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    top = alias.name.partition(".")[0]
                    bound[alias.asname or top] = importlib.import_module(alias.name if alias.asname else top)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                module = importlib.import_module(node.module)
                for alias in node.names:
                    bound[alias.asname or alias.name] = getattr(module, alias.name, None)
        except Exception:  # noqa: BLE001 - a module that will not import here starts nothing we can see
            continue
    return bound


def _walk_code(tree: ast.AST):
    """ast.walk without annotations: a function that takes a Popen does not start one."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for field, value in ast.iter_fields(node):
            if field in ("annotation", "returns"):
                continue
            todo.extend(v for v in (value if isinstance(value, list) else [value]) if isinstance(v, ast.AST))


@functools.cache
def _definitions(filename: str) -> dict[int, ast.FunctionDef | ast.AsyncFunctionDef]:
    """Each function defined in a file by its first line (its first decorator's, as the code object has it)."""
    try:
        tree = ast.parse(Path(filename).read_text(), filename)
    except (OSError, SyntaxError, ValueError):
        return {}
    return {min([node.lineno, *(d.lineno for d in node.decorator_list)]): node for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


class Reach:
    """Which functions and classes start a process, and through what (memoized for one collection).

    It follows the code of the run's root (the tests, their conftests and support modules, scripts/) and of
    the product. A class of the test code is followed whole (its functions and bases); a class of the product
    only through `__init__`, as its other methods run on conditions this cannot see (a control plane built in a
    test runs a Slurm command only when Slurm is configured).
    """

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self._seen: dict[object, tuple[str, ...] | None] = {}

    def why(self, obj: object) -> tuple[str, ...] | None:
        """The names from `obj` to a starter (("Cluster.start_server", "ControlPlaneProcess.start", "subprocess.Popen")), or None."""
        try:
            obj = inspect.unwrap(obj) if callable(obj) else obj
            direct = _starter(getattr(obj, "__module__", None) or "", getattr(obj, "__name__", None) or "")
            if direct:
                return (direct,)
            if obj in self._seen:
                return self._seen[obj]
        except (TypeError, ValueError):  # unhashable, or a __wrapped__ loop
            return None
        self._seen[obj] = None  # a cycle ends here
        if isinstance(obj, type):
            chain = next(filter(None, map(self.why, self._followed(obj))), None)
        elif isinstance(obj, types.FunctionType) and self._where(obj):
            chain = self._scan(obj)
        else:
            chain = None
        self._seen[obj] = chain
        return chain

    def _where(self, function: types.FunctionType) -> str | None:
        """"product", "test" (code under the root, or the harness), or None (not followed)."""
        module = function.__module__ or ""
        if module in HARNESS:
            return "test"
        if module.partition(".")[0] in PRODUCT:
            return "product"
        return "test" if Path(function.__code__.co_filename).resolve().is_relative_to(self.root) else None

    def _followed(self, cls: type) -> list[object]:
        functions = []
        for value in vars(cls).values():
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            elif isinstance(value, property):
                value = value.fget
            if isinstance(value, types.FunctionType):
                functions.append(value)
        if functions and self._where(functions[0]) == "product":
            functions = [f for f in functions if f.__name__ == "__init__"]
        return [*functions, *cls.__bases__]

    def _scan(self, function: types.FunctionType) -> tuple[str, ...] | None:
        tree = _definition(function)
        if tree is None:
            return None
        local = _local_names(tree)
        namespace = {name: value for name, value in function.__globals__.items() if name not in local}
        namespace.update(_imports(tree))
        for node in _walk_code(tree):
            target = self._resolve(node, namespace)
            chain = (target,) if isinstance(target, _Starter) else self.why(target) if target is not None else None
            if chain:
                return (function.__qualname__, *chain)
        return None

    @staticmethod
    def _resolve(node: ast.AST, namespace: dict) -> object:
        """A starter's name, or what `node` (a name, or a module's attribute) names in `namespace`, or None."""
        if isinstance(node, ast.Name):
            return namespace.get(node.id)
        if not isinstance(node, ast.Attribute):
            return None
        attributes = []
        while isinstance(node, ast.Attribute):
            attributes.insert(0, node.attr)
            node = node.value
        value = namespace.get(node.id) if isinstance(node, ast.Name) else None
        for attribute in attributes:
            if not isinstance(value, types.ModuleType):
                return None
            found = _starter(value.__name__, attribute)
            if found:
                return found
            value = getattr(value, attribute, None)
        return value


@functools.cache
def _fixtures_asked(function: types.FunctionType) -> tuple[str, ...]:
    """The fixtures a function asks for by name: request.getfixturevalue("NAME")."""
    node = _definition(function)
    return () if node is None else tuple(
        call.args[0].value for call in ast.walk(node)
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "getfixturevalue"
        and call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str))


def _definition(function: types.FunctionType) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    code = function.__code__
    node = _definitions(code.co_filename).get(code.co_firstlineno)
    return node if node is not None and node.name == function.__name__ else None


def _why_slow(item: pytest.Item, reach: Reach) -> str | None:
    """Why this test starts a process ("fixture cluster -> Cluster.start -> subprocess.Popen"), or None."""
    for marker in PROCESS_MARKERS:
        if item.get_closest_marker(marker):
            return f"marker {marker}"
    function = getattr(item, "function", None)
    if function is None:
        return None
    if getattr(function, "is_hypothesis_test", False):  # @given wraps the test in a function of hypothesis's
        return f"{function.__name__} -> hypothesis.given"
    chain = reach.why(function) or (reach.why(item.cls) if getattr(item, "cls", None) else None)
    if chain:
        return " -> ".join(chain)
    manager = item.session._fixturemanager
    names = [*getattr(item, "fixturenames", ()), *_fixtures_asked(function)]
    for name in names:  # grows as fixtures ask for more by name
        for definition in manager.getfixturedefs(name, item) or ():
            chain = reach.why(definition.func)
            if chain:
                return " -> ".join((f"fixture {name}", *chain[1:]))
            names.extend(n for n in _fixtures_asked(inspect.unwrap(definition.func)) if n not in names)
    return None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--why-slow", action="store_true", help="print why each selected slow test is slow (tests/tiers.py)")


def pytest_configure(config: pytest.Config) -> None:
    _Guard.install()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark `slow` every test that starts a process (before -m deselects; conftest hooks run before pytest's own).

    What the marking found is kept in pytest's cache (.pytest_cache) for the Python files of the tree as they
    are (`_fingerprint`: each one's path, mtime and size): a run whose files have not changed since reads it
    back instead of following the code again (~4 s a process)."""
    cache = getattr(config, "cache", None)  # None with -p no:cacheprovider
    fingerprint = _fingerprint(config.rootpath)
    stored = cache.get(CACHE_KEY, None) if cache is not None else None
    known: dict[str, str | None] = stored["why"] if isinstance(stored, dict) and stored.get("fingerprint") == fingerprint else {}
    reach = Reach(config.rootpath)
    learned = False
    for item in items:
        if item.get_closest_marker("slow"):
            continue
        if item.nodeid in known:
            why = known[item.nodeid]
        else:
            why = known[item.nodeid] = _why_slow(item, reach)
            learned = True
        if why:
            item.add_marker(pytest.mark.slow(why=why))
    if learned and cache is not None:
        cache.set(CACHE_KEY, {"fingerprint": fingerprint, "why": known})


#: Where pytest_collection_modifyitems keeps what the marking found (config.cache).
CACHE_KEY = "gpulayer/tiers"


def _fingerprint(root: Path) -> str:
    """A digest of every Python file under `root` (path, mtime, size; not hidden folders nor build/), of this
    Python and of this module's own text: what the marking reads."""
    digest = hashlib.sha256(f"{sys.version}\n{Path(__file__).read_text()}".encode())
    for folder, folders, files in os.walk(root):
        folders[:] = sorted(f for f in folders if not f.startswith(".") and f not in ("build", "node_modules", "__pycache__"))
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with contextlib.suppress(OSError):
                    found = os.stat(path)
                    digest.update(f"{path}\0{found.st_mtime_ns}\0{found.st_size}\n".encode())
    return digest.hexdigest()


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.getoption("why_slow"):
        for item in session.items:
            marker = item.get_closest_marker("slow")
            if marker:
                print(f"{item.nodeid}: {marker.kwargs.get('why', 'marked by hand')}")


class ProcessStarted(pytest.fail.Exception):
    """A test that is not slow started a process (a BaseException, so `except Exception` in its way lets it by)."""


class _Guard:
    """Refuses to start a process for a test that is not `slow`, from its thread or a thread it started."""

    item: pytest.Item | None = None
    threads_before: frozenset[threading.Thread] = frozenset()
    started: list[str] = []

    @classmethod
    def install(cls) -> None:
        """Wrap each way to start a process, once, for the life of this pytest process."""
        import _posixsubprocess  # multiprocessing's spawn and forkserver start their process here
        import subprocess

        if getattr(os.fork, "_tiers_guard", False):
            return
        subprocess.Popen._execute_child = cls._wrap(subprocess.Popen._execute_child, lambda popen, args, *_, **__: args)
        _posixsubprocess.fork_exec = cls._wrap(_posixsubprocess.fork_exec, lambda args, *_, **__: args)
        for name in ("fork", "forkpty", "system", "posix_spawn", "posix_spawnp"):
            if hasattr(os, name):
                setattr(os, name, cls._wrap(getattr(os, name), lambda *args, _name=name, **__: args[:2] or f"os.{_name}"))

    @classmethod
    def _wrap(cls, start, describe):
        @functools.wraps(start)
        def guarded(*args, **kwargs):
            if cls.item is not None and threading.current_thread() not in cls.threads_before:
                what = describe(*args, **kwargs)
                if isinstance(what, (list, tuple)):
                    what = " ".join(os.fsdecode(a) if isinstance(a, (str, bytes, os.PathLike)) else str(a) for a in what)
                cls.started.append(str(what)[:200])
                raise ProcessStarted(cls.message(), pytrace=False)
            return start(*args, **kwargs)
        guarded._tiers_guard = True
        return guarded

    @classmethod
    def message(cls) -> str:
        return (f"{cls.item.nodeid} starts a process ({cls.started[0]}) but is not marked slow, so it would run in "
                "the fast loop (-m 'not slow'). Mark it @pytest.mark.slow, or add what starts the process to "
                "STARTERS in tests/tiers.py so that every test reaching it is marked.")

    @classmethod
    @contextlib.contextmanager
    def watch(cls, item: pytest.Item, phase: str):
        """Guard one phase of `item` (nothing for a slow one); the threads alive before its setup may start processes."""
        if item.get_closest_marker("slow"):
            yield
            return
        if phase == "setup":
            item.stash[_THREADS_BEFORE] = frozenset(t for t in threading.enumerate() if t is not threading.current_thread())
        cls.item, cls.threads_before, cls.started = item, item.stash.get(_THREADS_BEFORE, frozenset()), []
        try:
            yield
        except ProcessStarted:
            raise
        except BaseException:
            if cls.started:  # refused in another thread, which made this one fail in its own way
                raise ProcessStarted(cls.message(), pytrace=False) from None
            raise
        else:
            if cls.started:  # refused in another thread, or the refusal was caught on its way
                raise ProcessStarted(cls.message(), pytrace=False)
        finally:
            cls.item = None


_THREADS_BEFORE = pytest.StashKey[frozenset]()


# Setup and call only: a module's fixtures are torn down in the teardown of its last test, which may be fast.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    with _Guard.watch(item, "setup"):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    with _Guard.watch(item, "call"):
        return (yield)
