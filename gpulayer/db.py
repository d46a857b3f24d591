"""The state file: apsw connections, schema and migrations, the serialized writer.

Every write goes through `Store.write(fn, ...)`, which runs `fn(conn, ...)` on
the one writer thread inside `BEGIN IMMEDIATE`. The writer groups what is
queued into one transaction (each function in its own SAVEPOINT, so one
failure undoes only its own changes) and answers callers after the COMMIT.
Readers use one connection per thread and never block the writer (WAL).
"""
from __future__ import annotations

import queue
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import apsw

from .errors import ConfigError
from .sql import QUERIES

SYNCHRONOUS = {"normal": "NORMAL", "full": "FULL"}
BUSY_TIMEOUT_MS = 10_000
MAX_GROUP = 256          # most functions one transaction carries
_ROOT = Path(__file__).resolve().parent


def schema_path() -> Path:
    """The package's schema.sql (the repository's top-level schema.sql is a link to it)."""
    path = _ROOT / "schema.sql"
    if not path.exists():
        raise ConfigError(f"{path} not found: reinstall gpulayer")
    return path


def schema_version(sql: str | None = None) -> int:
    """The `PRAGMA user_version = N` that schema.sql sets."""
    text = sql if sql is not None else schema_path().read_text()
    for line in text.splitlines():
        if line.strip().lower().startswith("pragma user_version"):
            return int(line.split("=")[1].strip().rstrip(";"))
    raise ConfigError("schema.sql sets no user_version")


def migrations() -> dict[int, Path]:
    """{target version: file} for every gpulayer/migrations/NNNN_*.sql."""
    found = {}
    for path in sorted((_ROOT / "migrations").glob("[0-9][0-9][0-9][0-9]_*.sql")):
        found[int(path.name[:4])] = path
    return found


def _dict_row(cursor: apsw.Cursor, row: tuple) -> dict:
    return dict(zip((d[0] for d in cursor.getdescription()), row))


def connect(path: Path | str, *, synchronous: str = "normal", readonly: bool = False) -> apsw.Connection:
    """An apsw connection with GPUlayer's pragmas; rows come back as dicts."""
    flags = apsw.SQLITE_OPEN_READONLY if readonly else apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE
    conn = apsw.Connection(str(path), flags=flags)
    conn.set_busy_timeout(BUSY_TIMEOUT_MS)
    if not readonly:
        conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={SYNCHRONOUS[synchronous]}")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.row_trace = _dict_row
    return conn


def ensure_schema(conn: apsw.Connection) -> int:
    """Create the schema in an empty file or migrate an older one; returns the version.

    Raises ConfigError for a file newer than this code, or one that is not ours.
    """
    target = schema_version()
    current = conn.execute("PRAGMA user_version").fetchall()[0]["user_version"]
    if current == target:
        return current
    if current > target:
        raise ConfigError(f"state file is at schema version {current}, newer than this gpulayer ({target}): upgrade gpulayer")
    with conn:
        if current == 0:
            tables = conn.execute(QUERIES["schema_objects"]).fetchall()[0]["n"]
            if tables:
                raise ConfigError("the state file holds tables but no GPUlayer schema version: is it the right file?")
            conn.execute(schema_path().read_text())
        else:
            for version in range(current + 1, target + 1):
                conn.execute(migrations()[version].read_text())
                conn.execute(f"PRAGMA user_version = {version}")
    return target


class _Op:
    __slots__ = ("fn", "args", "kwargs", "done", "result", "error")

    def __init__(self, fn, args, kwargs):
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.done = threading.Event()
        self.result = None
        self.error: BaseException | None = None


class Store:
    """One state file: a writer thread that owns the write connection, readers per thread."""

    def __init__(self, path: Path | str, *, synchronous: str = "normal"):
        if synchronous not in SYNCHRONOUS:
            raise ConfigError(f"synchronous must be one of {sorted(SYNCHRONOUS)}, not {synchronous!r}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.synchronous = synchronous
        self._writer = connect(self.path, synchronous=synchronous)
        ensure_schema(self._writer)
        self._queue: queue.SimpleQueue[_Op | None] = queue.SimpleQueue()
        self._local = threading.local()
        self._readers: list[apsw.Connection] = []
        self._readers_lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="gpulayer-writer", daemon=True)
        self._thread.start()

    def write(self, fn: Callable[..., Any], *args, **kwargs) -> Any:
        """Run fn(conn, *args, **kwargs) in a write transaction; returns its result after COMMIT.

        Raises whatever fn raised (its changes undone), or RuntimeError once closed.
        """
        if self._closed:
            raise RuntimeError("the state file is closed")
        op = _Op(fn, args, kwargs)
        self._queue.put(op)
        op.done.wait()
        if op.error is not None:
            raise op.error
        return op.result

    @contextmanager
    def reading(self) -> Iterator[apsw.Connection]:
        """A read transaction on this thread's connection (a consistent snapshot)."""
        conn = self._reader()
        conn.execute("BEGIN")
        try:
            yield conn
        finally:
            conn.execute("COMMIT")

    def read(self, fn: Callable[..., Any], *args, **kwargs) -> Any:
        """fn(conn, *args, **kwargs) inside one read transaction."""
        with self.reading() as conn:
            return fn(conn, *args, **kwargs)

    def close(self) -> None:
        """Finish queued writes, stop the writer, close every connection."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join()
        self._writer.close()
        with self._readers_lock:
            for conn in self._readers:
                conn.close()
            self._readers.clear()

    def _reader(self) -> apsw.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect(self.path, synchronous=self.synchronous)
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            group = [first]
            stop = False
            while len(group) < MAX_GROUP:
                try:
                    op = self._queue.get_nowait()
                except queue.Empty:
                    break
                if op is None:
                    stop = True
                    break
                group.append(op)
            self._run_group(group)
            if stop:
                return

    def _run_group(self, group: list[_Op]) -> None:
        conn = self._writer
        try:
            conn.execute("BEGIN IMMEDIATE")
        except apsw.Error as exc:  # another process holds the lock past the busy timeout
            for op in group:
                op.error = exc
                op.done.set()
            return
        for op in group:
            conn.execute("SAVEPOINT op")
            try:
                op.result = op.fn(conn, *op.args, **op.kwargs)
                conn.execute("RELEASE op")
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                op.error = exc
                conn.execute("ROLLBACK TO op")
                conn.execute("RELEASE op")
        try:
            conn.execute("COMMIT")
        except apsw.Error as exc:
            if not conn.getautocommit():
                conn.execute("ROLLBACK")
            for op in group:
                op.error = op.error or exc
        for op in group:
            op.done.set()
