"""A local artifact cache by digest: verified on download and at use, bounded, LRU-evicted.

Files are named by their hex digest under the cache root. A download streams
into a temporary file in the same folder, hashed as it is written (from disk
again only when the fetcher wrote out of order), and is renamed into place
only when the SHA-256 matches, so a reader never sees a partial or wrong file. Using a file refreshes its mtime; eviction removes the oldest
mtime first until the total is under the limit.

The root is the agent's own (``agent.artifacts.private_folder``: 0700, its user's, checked at start) and files are 0444,
so no one else may change one. At use, a file must still be a regular file of the agent's user, written by no
one else, with the (device, inode, size, mtime) it had when this agent verified its bytes; one the agent has
not verified (cached before it started, or by another agent sharing the cache) or that changed is hashed again
first, and one whose bytes no longer match is removed and downloaded again. Hashing at every use would cost
about 1.5 s per GiB (SHA-256 measured on the test host: 1.43-1.65 s for 1 GiB in the page cache), each time a
task starts with 20 GiB of weights.
"""

import contextlib
import hashlib
import logging
import os
import re
import stat
import tempfile
import threading
from pathlib import Path
from typing import BinaryIO, Callable

from ..errors import DigestMismatch, TaskSetupError
from ..events import log_event
from .caps import CappedWriter
from .private_folder import private_folder

DEFAULT_CACHE_BYTES = 1024**3
CHUNK_BYTES = 1024 * 1024
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})\Z")  # \Z: `$` would let a trailing newline through

#: Writes the whole artifact named by a digest into the open binary file.
Fetcher = Callable[[str, BinaryIO], None]


def digest_hex(digest: str) -> str:
    """The 64 hex characters of ``sha256:<hex>``; raises TaskSetupError otherwise."""
    match = _DIGEST.fullmatch(str(digest))
    if not match:
        raise TaskSetupError(f"not an artifact digest: {digest!r} (expected sha256:<64 hex>)")
    return match.group(1)


def sha256_handle(handle: BinaryIO) -> str:
    """``sha256:<hex>`` of an open binary file's bytes from its start, read in chunks."""
    hasher = hashlib.sha256()
    handle.seek(0)
    for chunk in iter(lambda: handle.read(CHUNK_BYTES), b""):
        hasher.update(chunk)
    return "sha256:" + hasher.hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    """``sha256:<hex>`` of a file, read in chunks."""
    with open(path, "rb") as handle:
        return sha256_handle(handle)


class HashingWriter:
    """A binary file that hashes what is written to it in order from its start (a download, written once
    or started again after a seek to 0 and a truncate); ``digest()`` is None after any other seek."""

    def __init__(self, out: BinaryIO):
        self.out = out
        self._restart()

    def _restart(self) -> None:
        self.hasher, self.at, self.in_order = hashlib.sha256(), 0, True

    def write(self, data) -> int:
        written = self.out.write(data)
        if self.in_order:
            self.hasher.update(data if written == len(data) else memoryview(data)[:written])
            self.at += written
        return written

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        where = self.out.seek(offset, whence)
        if where != self.at:
            self.in_order = False  # until a truncate to 0 starts it again
        return where

    def tell(self) -> int:
        return self.out.tell()

    def truncate(self, size: int | None = None) -> int:
        end = self.out.truncate(size)
        if end == 0 and self.out.tell() == 0:
            self._restart()
        elif end < self.at:
            self.in_order = False
        return end

    def flush(self) -> None:
        self.out.flush()

    def digest(self) -> str | None:
        """``sha256:<hex>`` of the file's bytes when they were all written in order; None otherwise."""
        if not self.in_order or self.out.tell() != self.at:
            return None
        return "sha256:" + self.hasher.hexdigest()


def default_cache_dir() -> str:
    """$GPULAYER_ARTIFACT_CACHE, else ``gpulayer-artifacts`` in the temp folder."""
    return os.environ.get("GPULAYER_ARTIFACT_CACHE") or os.path.join(tempfile.gettempdir(), "gpulayer-artifacts")


def default_cache_bytes() -> int:
    """$GPULAYER_ARTIFACT_CACHE_BYTES, else 1 GiB."""
    raw = os.environ.get("GPULAYER_ARTIFACT_CACHE_BYTES", "").strip()
    return int(raw) if raw else DEFAULT_CACHE_BYTES


#: What a cached file looked like when this agent last verified its bytes: (device, inode, size, mtime_ns).
Stamp = tuple[int, int, int, int]


def _stamp(st: os.stat_result) -> Stamp:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class ArtifactCache:
    """Artifacts by digest under ``root``, at most ``max_bytes`` in total (LRU).

    Raises NotPrivate (an AgentError) when ``root`` is not a folder of the agent's own (``agent.artifacts.private_folder``).
    """

    def __init__(self, root: str | os.PathLike, max_bytes: int, fetch: Fetcher):
        self.root = private_folder(root, "the artifact cache", "GPULAYER_ARTIFACT_CACHE")
        self.max_bytes = int(max_bytes)
        self._fetch = fetch
        self._lock = threading.Lock()
        self._digest_locks: dict[str, threading.Lock] = {}
        self._verified: dict[str, Stamp] = {}

    def get(self, digest: str, max_bytes: int | None = None) -> Path:
        """The local path of an artifact, downloading and verifying it when missing.

        Raises TaskSetupError for a malformed digest, DigestMismatch when the
        bytes do not match, UnpackLimit when a download passes ``max_bytes``
        (nothing kept); the fetcher's own errors pass through.
        """
        hex_digest = digest_hex(digest)
        path = self.root / hex_digest
        with self._lock_for(hex_digest):
            if self._usable(digest, path):
                return path
            self._download(digest, path, max_bytes)
        self.evict(keep=hex_digest)
        return path

    def cached(self, digest: str) -> Path | None:
        """The local path of an artifact already here and still its bytes (its use noted), else None; never
        downloads."""
        hex_digest = digest_hex(digest)
        path = self.root / hex_digest
        with self._lock_for(hex_digest):
            return path if self._usable(digest, path) else None

    def _usable(self, digest: str, path: Path) -> bool:
        """Whether ``path`` holds the artifact: a regular file of this user's that no one else may write, as it
        was when this agent verified it, else hashed again now; its use noted. One that fails is removed."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return False
        if self._verified.get(path.name) != _stamp(st):
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022:
                actual = sha256_file(path)
            else:  # a link, or a file someone else may have written: never read
                actual = f"mode {st.st_mode:o}, uid {st.st_uid}"
            if actual != digest:
                log_event("artifact_cache_mismatch", level=logging.WARNING, digest=digest, found=actual)
                self._forget(path)
                return False
        os.utime(path)
        self._verified[path.name] = _stamp(os.lstat(path))
        return True

    def _forget(self, path: Path) -> None:
        self._verified.pop(path.name, None)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def fetch_into(self, digest: str, target: str | os.PathLike) -> None:
        """Download an artifact into ``target`` (made or emptied), hashed as it is written, without keeping it
        here: a checkpoint restore writes each byte once. Raises TaskSetupError for a malformed digest,
        DigestMismatch (``target`` removed) when the bytes do not match; the fetcher's errors pass through."""
        digest_hex(digest)
        try:
            self._fetch_verified(digest, target, None)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(target)
            raise

    def _lock_for(self, hex_digest: str) -> threading.Lock:
        with self._lock:
            return self._digest_locks.setdefault(hex_digest, threading.Lock())

    def _download(self, digest: str, path: Path, max_bytes: int | None) -> None:
        fd, temp_name = tempfile.mkstemp(prefix=".tmp-", dir=self.root)
        os.close(fd)
        try:
            self._fetch_verified(digest, temp_name, max_bytes)
            os.chmod(temp_name, 0o444)
            os.replace(temp_name, path)
            st = os.lstat(path)
            self._verified[path.name] = _stamp(st)
            log_event("artifact_cached", digest=digest, bytes=st.st_size)
        finally:
            if os.path.exists(temp_name):
                os.unlink(temp_name)

    def _fetch_verified(self, digest: str, target: str | os.PathLike, max_bytes: int | None) -> None:
        """Fetch ``digest`` into ``target``, hashing as it is written; DigestMismatch when its bytes differ."""
        with open(target, "w+b") as handle:
            hashing = HashingWriter(handle)
            capped = CappedWriter(hashing, max_bytes, f"artifact {digest}") if max_bytes is not None else hashing  # type: ignore[arg-type]
            self._fetch(digest, capped)  # type: ignore[arg-type]
            actual = hashing.digest()
        if actual is None:  # written out of order: hashed from disk
            actual = sha256_file(target)
        if actual != digest:
            raise DigestMismatch(f"artifact {digest} failed verification: its bytes hash to {actual}")

    def entries(self) -> list[tuple[float, int, Path]]:
        """(mtime, size, path) of every cached artifact, oldest first."""
        found = []
        for entry in os.scandir(self.root):
            if entry.name.startswith(".") or not entry.is_file(follow_symlinks=False):
                continue
            try:
                stat = entry.stat(follow_symlinks=False)
            except FileNotFoundError:  # evicted by a concurrent worker
                continue
            found.append((stat.st_mtime, stat.st_size, Path(entry.path)))
        return sorted(found)

    def evict(self, keep: str | None = None) -> list[str]:
        """Remove least recently used artifacts until the total fits; returns removed names."""
        with self._lock:
            entries = self.entries()
            total = sum(size for _, size, _ in entries)
            removed = []
            for _, size, path in entries:
                if total <= self.max_bytes:
                    break
                if path.name == keep:
                    continue
                self._forget(path)
                total -= size
                removed.append(path.name)
                log_event("artifact_evicted", digest="sha256:" + path.name, bytes=size)
            return removed
