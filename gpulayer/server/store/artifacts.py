"""Content-addressed artifact store under $GPULAYER_HOME/artifacts.

Bytes stream through: PUT writes to a temporary file while hashing SHA-256 and
renames it into place only when the digest matches; GET streams the file.
Memory use does not grow with an artifact's size, and neither does the page
cache's: an upload's bytes are written once and read rarely (a restore, a
worker's first fetch), so they are sent to disk as they come and dropped
from the cache behind the writer (`_WriteBehind`), rather than pushing the
state file's pages out. On a VM whose free memory goes back to its host
this is also the cheap path: writing into freshly freed pages cost a fifth
to a tenth of the CPU of writing into new ones (docs/benchmarks/issue-27.md,
"Checkpoint upload: the artifact store writes behind itself").

A digest's lock is held while its file is renamed into place and its row
recorded, and while the sweep re-checks that the row is gone and unlinks the
file: a PUT racing the sweep never leaves a row without its file. The row
itself is the scheduler's (scheduler/access.py): this module holds no SQL.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import tempfile
import threading
import time
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from gpulayer.server.errors import BodyTooLarge, DigestMismatch, InvalidRequest
from gpulayer.server.validators import check_digest

CHUNK = 1024 * 1024
MAX_ARTIFACT_BYTES = 1 << 40
TMP_MAX_AGE_S = 86400.0  # a partial upload this old has no request left writing it (killed mid-upload)
LOCK_STRIPES = 64
WRITE_BEHIND = 8 * CHUNK  # an upload's bytes this far behind the writer are sent to disk and dropped from the cache


class _WriteBehind:
    """Keep what a streamed write leaves in the page cache to about 2 x WRITE_BEHIND.

    Linux's way for streaming writes: each window of WRITE_BEHIND bytes is handed to writeback once
    written (sync_file_range WRITE), and the window before it is waited for and dropped from the cache
    (sync_file_range WAIT, then posix_fadvise DONTNEED). A disk slower than the upload holds the
    upload back by at most a window, where the fsync at the end would have waited for all of it.
    `done()`, after the fsync, drops the rest. Without sync_file_range (not Linux or no glibc) only
    the fadvise is done; without that, nothing.
    """

    def __init__(self, fd: int):
        self.fd, self.sent, self.dropped = fd, 0, 0

    def wrote(self, size: int) -> None:
        """`size` bytes of the file are written (handed to the file object) so far."""
        if size - self.sent < WRITE_BEHIND:
            return
        _sync_range(self.fd, self.sent, size - self.sent, _SYNC_WRITE)
        if self.sent > self.dropped:
            _sync_range(self.fd, self.dropped, self.sent - self.dropped, _SYNC_WAIT_WRITE_WAIT)
            self._drop(self.dropped, self.sent - self.dropped)
            self.dropped = self.sent
        self.sent = size

    def done(self) -> None:
        """The file is fsynced: drop all of it."""
        self._drop(0, 0)

    def _drop(self, offset: int, length: int) -> None:
        try:
            os.posix_fadvise(self.fd, offset, length, os.POSIX_FADV_DONTNEED)
        except (AttributeError, OSError):
            pass


_SYNC_WRITE = 2               # SYNC_FILE_RANGE_WRITE
_SYNC_WAIT_WRITE_WAIT = 1 | 2 | 4  # WAIT_BEFORE | WRITE | WAIT_AFTER


def _libc_sync_file_range():
    try:
        call = ctypes.CDLL(None, use_errno=True).sync_file_range  # ctypes lets the GIL go during the call
    except (OSError, AttributeError):
        return None
    call.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    call.restype = ctypes.c_int
    return call


_SYNC_FILE_RANGE = _libc_sync_file_range()


def _sync_range(fd: int, offset: int, length: int, flags: int) -> None:
    """sync_file_range(2) where it exists; a failure (an odd file system) only costs the cache."""
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, offset, length, flags)


class ArtifactStore:
    """Files named by digest: root/sha256/<2 hex>/<62 hex>."""

    def __init__(self, root: Path, *, max_bytes: int = MAX_ARTIFACT_BYTES):
        self.root = Path(root)
        self.max_bytes = max_bytes
        (self.root / "tmp").mkdir(parents=True, exist_ok=True)
        self._locks = [threading.Lock() for _ in range(LOCK_STRIPES)]

    @contextmanager
    def locked(self, digest: str) -> Iterator[None]:
        """Hold this digest's lock: its file and its row change together."""
        with self._locks[zlib.crc32(digest.encode()) % LOCK_STRIPES]:
            yield

    def path(self, digest: str) -> Path:
        hexd = check_digest(digest).split(":", 1)[1]
        return self.root / "sha256" / hexd[:2] / hexd[2:]

    def exists(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def size(self, digest: str) -> int | None:
        """The stored bytes' size; None when absent (or removed meanwhile)."""
        try:
            return self.path(digest).stat().st_size
        except FileNotFoundError:
            return None

    def put(self, digest: str, stream: BinaryIO, length: int | None = None,
            record: Callable[[str, int], None] | None = None) -> int:
        """Store the bytes read from `stream` under `digest`; returns their size.

        `record(digest, size)` runs under the digest's lock right after the file is in place.
        Raises DigestMismatch (nothing stored) when the bytes hash to something else,
        BodyTooLarge past the store's limit.
        """
        target = self.path(digest)
        if length is not None and length > self.max_bytes:
            raise BodyTooLarge(f"artifact of {length} bytes is over the limit of {self.max_bytes}")
        hasher = hashlib.sha256()
        size = 0
        fd, tmp_path = tempfile.mkstemp(dir=self.root / "tmp")
        tmp: str | None = tmp_path  # None once it is in place
        try:
            with os.fdopen(fd, "wb") as out:
                behind = _WriteBehind(out.fileno())
                while chunk := stream.read(CHUNK):
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise BodyTooLarge(f"artifact is over the limit of {self.max_bytes} bytes")
                    hasher.update(chunk)
                    out.write(chunk)
                    behind.wrote(size)
                out.flush()
                os.fsync(out.fileno())
                behind.done()
            if length is not None and size != length:
                raise InvalidRequest(f"body ended after {size} of {length} bytes", code="incomplete_body")
            actual = "sha256:" + hasher.hexdigest()
            if actual != digest:
                raise DigestMismatch(f"the bytes hash to {actual}, not {digest}; nothing was stored")
            target.parent.mkdir(parents=True, exist_ok=True)
            with self.locked(digest):
                os.replace(tmp_path, target)
                tmp = None
                if record is not None:
                    record(digest, size)
            return size
        finally:
            if tmp is not None:
                os.unlink(tmp)

    def open(self, digest: str) -> tuple[BinaryIO, int]:
        """The stored file opened for reading, and its size (FileNotFoundError when absent)."""
        fh = open(self.path(digest), "rb")
        return fh, os.fstat(fh.fileno()).st_size

    def delete(self, digest: str, still_gone: Callable[[], bool] = lambda: True) -> int:
        """Remove one artifact's bytes if `still_gone()` (checked under the digest's lock); the bytes freed."""
        path = self.path(digest)
        with self.locked(digest):
            if not still_gone():
                return 0
            try:
                size = path.stat().st_size
                path.unlink()
                return size
            except FileNotFoundError:
                return 0

    def sweep_tmp(self, *, now: float | None = None, max_age_s: float = TMP_MAX_AGE_S) -> int:
        """Remove partial uploads older than max_age_s (left by a killed server); how many."""
        cutoff = (time.time() if now is None else now) - max_age_s
        removed = 0
        for entry in os.scandir(self.root / "tmp"):
            try:
                if entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mtime < cutoff:
                    os.unlink(entry.path)
                    removed += 1
            except FileNotFoundError:
                continue
        return removed
