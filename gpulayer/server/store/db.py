"""The state file: apsw connections, schema and migrations, the serialized writer.

Every write goes through `Store.write(fn, ...)`, which runs `fn(conn, ...)` on
the one writer thread inside `BEGIN IMMEDIATE`. The writer groups what is
queued into one transaction (each function in its own SAVEPOINT, so one
failure undoes only its own changes) and answers callers after the COMMIT.
Readers take a connection from a bounded pool and never block the writer (WAL).
The writer outlives any failure: a group that fails (a full disk) fails its
callers, and the next group starts afresh. No caller waits without bound.
"""
from __future__ import annotations

import contextvars
import errno
import logging
import math
import os
import queue
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import apsw

from gpulayer.server.errors import ConfigError, GpulayerError, ReadTimeout, StorageFull, Unavailable
from gpulayer.server.store.deadline import Deadline
from gpulayer.server.store.queries import QUERIES, row, rows
from gpulayer.server.store.readers import ReaderPool

log = logging.getLogger("gpulayer.server.store.db")

SYNCHRONOUS = {"normal": "NORMAL", "full": "FULL"}
BUSY_TIMEOUT_MS = 10_000
MAX_GROUP = 256          # most functions one transaction carries
READERS = 16             # pooled read connections, all opened at start (about 2 file descriptors each)
LOW_DISK_BYTES = 1 << 20    # /v1/health answers 503 below this much free space on the state file's disk
WRITE_TIMEOUT_S = 30.0   # longest a request waits for the writer (or a reader) before a 503
# Longest one read may run before it is stopped with a 503 (`--read-timeout`). No read of tests/unit and
# tests/api takes 50 ms; a page of 1000 jobs beside two 100,000-element arrays answers in 215 ms (2 cores).
# A read near it holds one of the readers from every other request.
READ_TIMEOUT_S = 10.0
CLOSE_WAIT_S = 2.0      # at close, how long a read still running gets before it is interrupted (then half that again)
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
    """{target version: file} for every gpulayer/server/store/migrations/NNNN_*.sql."""
    found = {}
    for path in sorted((_ROOT / "migrations").glob("[0-9][0-9][0-9][0-9]_*.sql")):
        found[int(path.name[:4])] = path
    return found


def _dict_row(cursor: apsw.Cursor, row: tuple) -> dict:
    return dict(zip((d[0] for d in cursor.getdescription()), row))


def connect(path: Path | str, *, synchronous: str = "normal", readonly: bool = False,
            query_only: bool = False) -> apsw.Connection:
    """An apsw connection with GPUlayer's pragmas; rows come back as dicts.

    `query_only`: a reader of a live file (WAL needs it opened read-write, so writes are refused by pragma).
    """
    flags = apsw.SQLITE_OPEN_READONLY if readonly else apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE
    conn = apsw.Connection(str(path), flags=flags)
    conn.set_busy_timeout(BUSY_TIMEOUT_MS)
    if not readonly:
        conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={SYNCHRONOUS[synchronous]}")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("PRAGMA temp_store=MEMORY")   # statement journals and sorts never need a new file (out of fds, a submit still commits)
    if query_only:
        conn.execute("PRAGMA query_only=ON")
    conn.row_trace = _dict_row
    return conn


def ensure_schema(conn: apsw.Connection) -> int:
    """Create the schema in an empty file or migrate an older one; returns the version.

    Raises ConfigError for a file newer than this code, or one that is not ours.
    """
    target = schema_version()
    current = conn.execute("PRAGMA user_version").fetchall()[0]["user_version"]  # type: ignore[call-overload]  # rows are dicts (row tracer)
    if current == target:
        return current
    if current > target:
        raise ConfigError(f"state file is at schema version {current}, newer than this gpulayer ({target}): upgrade gpulayer")
    with conn:
        if current == 0:
            tables = conn.execute(QUERIES["schema_objects"]).fetchall()[0]["n"]  # type: ignore[call-overload]  # rows are dicts
            if tables:
                raise ConfigError("the state file holds tables but no GPUlayer schema version: is it the right file?")
            conn.execute(schema_path().read_text())
        else:
            for version in range(current + 1, target + 1):
                conn.execute(migrations()[version].read_text())
                conn.execute(f"PRAGMA user_version = {version}")
    return target


class _Op:
    __slots__ = ("fn", "args", "kwargs", "done", "result", "error", "claimed", "abandoned", "ctx")

    def __init__(self, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]):
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.ctx = contextvars.copy_context()   # the caller's (events.ACTOR): fn runs in it on the writer
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.claimed = self.abandoned = False   # the writer took it / its caller gave up first

    def fail(self, exc: BaseException) -> None:
        self.error = self.error or exc
        self.done.set()


def domain_error(exc: BaseException) -> GpulayerError | None:
    """What a storage failure means to a caller: 507 disk full, 503 retry later; None for other errors."""
    if isinstance(exc, GpulayerError):
        return exc
    if isinstance(exc, apsw.FullError) or (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)):
        return StorageFull("the control plane's disk is full: nothing was written; free space and retry")
    if isinstance(exc, (apsw.BusyError, apsw.CantOpenError)) or \
            (isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE)):
        return Unavailable(f"the control plane is out of a resource ({type(exc).__name__}): retry later")
    return None


class Store:
    """One state file: a writer thread that owns the write connection, a bounded pool of readers."""

    def __init__(self, path: Path | str, *, synchronous: str = "normal", readers: int | None = None,
                 write_timeout_s: float = WRITE_TIMEOUT_S, read_timeout_s: float = READ_TIMEOUT_S,
                 autocheckpoint: bool = True):
        if synchronous not in SYNCHRONOUS:
            raise ConfigError(f"synchronous must be one of {sorted(SYNCHRONOUS)}, not {synchronous!r}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.synchronous = synchronous
        self.write_timeout_s = write_timeout_s
        self.read_timeout_s = read_timeout_s
        make_private(self.path, create=True)
        self._writer = connect(self.path, synchronous=synchronous)
        if not autocheckpoint:  # Litestream replicates the WAL and owns its checkpoints (server/replication/)
            self._writer.execute("PRAGMA wal_autocheckpoint=0")
        ensure_schema(self._writer)
        self._queue: queue.SimpleQueue[_Op | None] = queue.SimpleQueue()
        self._lock = threading.Lock()        # closing vs queueing; claiming vs abandoning an op
        # Every reader is opened now: a request never opens a file after its write committed.
        # READERS is read here, not bound as a default: the unit tests open fewer (tests/conftest.py).
        self._readers = [connect(self.path, synchronous=synchronous, query_only=True)
                         for _ in range(READERS if readers is None else readers)]
        self._pool: ReaderPool[tuple[apsw.Connection, Deadline]] = ReaderPool(
            [(conn, Deadline(conn)) for conn in self._readers])
        self._closed = False
        self.last_error: str | None = None   # the code of the last failed group; None after a commit
        self._thread = threading.Thread(target=self._run, name="gpulayer-writer", daemon=True)
        self._thread.start()

    @property
    def closed(self) -> bool:
        """Whether close() began: no read or write is taken from then on."""
        return self._closed

    def write(self, fn: Callable[..., Any], *args, **kwargs) -> Any:
        """Run fn(conn, *args, **kwargs) in a write transaction; returns its result after COMMIT.

        Raises whatever fn raised (its changes undone); StorageFull when the disk is
        full; Unavailable once closed, or when the writer has not taken the write
        within write_timeout_s (then it never will: nothing was written).
        """
        op = _Op(fn, args, kwargs)
        with self._lock:
            if self._closed:
                raise Unavailable("the state file is closed (the control plane is stopping)")
            self._queue.put(op)
        if not op.done.wait(self.write_timeout_s):
            with self._lock:
                if not op.claimed:
                    op.abandoned = True
                    raise Unavailable(f"the state file's writer did not take this write within "
                                      f"{self.write_timeout_s:g} s; nothing was written: retry")
            # Taken already: its transaction is under way and ends within the busy timeout.
            if not op.done.wait(self.write_timeout_s + BUSY_TIMEOUT_MS / 1000):
                raise Unavailable("the state file's writer is stuck; the write's outcome is unknown")
        if op.error is not None:
            raise op.error
        return op.result

    @contextmanager
    def reading(self) -> Iterator[apsw.Connection]:
        """A read transaction on a pooled connection (a consistent snapshot), its statements limited to
        read_timeout_s in all.

        Raises Unavailable when every reader stays busy for write_timeout_s; ReadTimeout (a 503) past
        read_timeout_s, the connection given back usable.
        """
        reader = self._take()
        conn, deadline = reader
        try:
            conn.execute("BEGIN")
            deadline.at = time.monotonic() + self.read_timeout_s
            try:
                yield conn
            except apsw.InterruptError:
                raise self._timed_out() from None
            finally:
                deadline.at = math.inf
                if not conn.getautocommit():
                    conn.execute("COMMIT")
        finally:
            self._pool.give(reader)

    def read_statement(self, fn: Callable[..., Any], *args, **kwargs) -> Any:
        """fn(conn, *args, **kwargs) on a pooled connection outside a transaction: for a function that runs
        one statement (its own consistent snapshot), it saves the BEGIN and COMMIT of `read`.

        Raises as `reading` does.
        """
        reader = self._take()
        conn, deadline = reader
        deadline.at = time.monotonic() + self.read_timeout_s
        try:
            return fn(conn, *args, **kwargs)
        except apsw.InterruptError:
            raise self._timed_out() from None
        finally:
            deadline.at = math.inf
            self._pool.give(reader)

    def read(self, fn: Callable[..., Any], *args, **kwargs) -> Any:
        """fn(conn, *args, **kwargs) inside one read transaction; raises as `reading` does."""
        with self.reading() as conn:
            return fn(conn, *args, **kwargs)

    def _take(self) -> tuple[apsw.Connection, Deadline]:
        """A pooled reader and its deadline; Unavailable when every reader stays busy for write_timeout_s."""
        if self._closed:
            raise Unavailable("the state file is closed (the control plane is stopping)")
        reader = self._pool.take(self.write_timeout_s)
        if reader is None:
            raise Unavailable(f"all {len(self._readers)} readers of the state file stayed busy: retry")
        return reader

    def _timed_out(self) -> ReadTimeout:
        return ReadTimeout(f"a read of the state file ran past {self.read_timeout_s:g} s and was stopped "
                           "(--read-timeout): retry, or ask for less")

    def health(self) -> dict:
        """The writer (alive, queued writes, last error) and the disk (free bytes); `ok` when writes can succeed."""
        try:
            disk = os.statvfs(self.path.parent)
            free = disk.f_bavail * disk.f_frsize
        except OSError:
            free = None
        low = free is not None and free < LOW_DISK_BYTES
        if self.last_error == StorageFull.code and not low:
            self._probe()  # space came back: clear the error without waiting for a client's write
        full = low or self.last_error == StorageFull.code
        alive = self._thread.is_alive() and not self._closed
        return {"ok": alive and not full,
                "writer": {"alive": alive, "queued": self._queue.qsize(), "last_error": self.last_error},
                "disk": {"free_bytes": free, "full": full}}

    def _probe(self) -> None:
        """A write that changes nothing but needs room in the file: sets last_error, or clears it once it fits."""
        try:
            self.write(lambda conn: row(conn, "storage_probe") and rows(conn, "storage_probe_undo"))
        except GpulayerError:
            pass

    def close(self) -> None:
        """Finish queued writes, stop the writer, close every connection; later writes fail at once."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(None)
        self._thread.join()
        self._writer.close()
        self._close_readers()

    def _close_readers(self) -> None:
        """Close each reader once it is given back. A read still running (a forecast's snapshot on its own
        thread) is waited for, then interrupted; closing a connection busy in another thread would raise
        apsw's ThreadingViolationError and fail the stop. One still busy after that is left to the exit."""
        left = {id(conn): conn for conn in self._readers}
        for wait_s, interrupt in ((CLOSE_WAIT_S, True), (CLOSE_WAIT_S / 2, False)):
            deadline = time.monotonic() + wait_s
            while left:
                reader = self._pool.take(max(0.0, deadline - time.monotonic()))
                if reader is None:
                    break
                left.pop(id(reader[0])).close()
            if interrupt:
                for conn in left.values():
                    conn.interrupt()

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
            try:
                self._run_group([op for op in group if self._claim(op)])
            except BaseException as exc:  # noqa: BLE001 - the writer outlives any one group
                self._recover(group, exc)
            if stop:
                return

    def _claim(self, op: _Op) -> bool:
        with self._lock:
            op.claimed = not op.abandoned
            return op.claimed

    def _recover(self, group: list[_Op], exc: BaseException) -> None:
        log.error("writer_group_failed error=%r", exc)
        try:
            if not self._writer.getautocommit():
                self._writer.execute("ROLLBACK")
        except apsw.Error:
            log.exception("writer_rollback_failed")
        failure = domain_error(exc) or exc
        for op in group:
            if not op.done.is_set():
                op.error = failure if op.error is None else op.error
                op.result = None
                op.done.set()

    def _run_group(self, group: list[_Op]) -> None:
        if not group:
            return
        conn = self._writer
        changes = conn.total_changes()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except apsw.Error as exc:  # another process holds the lock past the busy timeout
            self._fail(group, exc)
            return
        for i, op in enumerate(group):
            conn.execute("SAVEPOINT op")
            try:
                op.result = op.ctx.run(op.fn, conn, *op.args, **op.kwargs)
                conn.execute("RELEASE op")
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                op.error = (domain_error(exc) if isinstance(exc, apsw.Error) else None) or exc
                if isinstance(op.error, StorageFull):
                    self.last_error = StorageFull.code
                if conn.getautocommit():
                    # SQLite rolled the whole transaction back (SQLITE_FULL, IOERR, NOMEM):
                    # what ran before is undone too; the rest gets a transaction of its own.
                    self._fail(group[:i + 1], exc)
                    self._run_group(group[i + 1:])
                    return
                conn.execute("ROLLBACK TO op")
                conn.execute("RELEASE op")
        try:
            conn.execute("COMMIT")
        except apsw.Error as exc:
            if not conn.getautocommit():
                conn.execute("ROLLBACK")
            self._fail(group, exc)
            return
        if conn.total_changes() != changes:  # only a commit that wrote rows shows there is room again
            self.last_error = None
        for op in group:
            op.done.set()

    def _fail(self, group: list[_Op], exc: BaseException) -> None:
        """None of the group was written: every caller gets the error (its own first, if it had one)."""
        failure = domain_error(exc) or exc
        self.last_error = getattr(failure, "code", type(exc).__name__)
        for op in group:
            op.result = None
            op.fail(failure)


def make_private(path: Path | str, *, create: bool = False) -> None:
    """The state file and its -wal/-shm are the owner's alone (0600); SQLite gives -wal/-shm the file's mode."""
    path = Path(path)
    if create:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if p.exists():
            os.chmod(p, 0o600)
