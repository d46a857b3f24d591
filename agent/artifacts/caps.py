"""The worker's caps on what one task's source bundle and inputs may write: bytes and entries.

A gzip bomb is small on the wire and huge on disk, so the caps are counted
while the archive is read, never from what it claims: every byte of the
decompressed stream that the unpacking reaches (file contents and tar
headers) and every entry (file, folder, link, input) is charged to one
``UnpackBudget`` per task, and the first charge past a cap raises
``UnpackLimit`` before the bytes are decompressed. The task then fails with
that reason; nothing is retried by the worker.
"""

import os
from dataclasses import dataclass
from typing import BinaryIO

from ..errors import AgentError, TaskSetupError

DEFAULT_UNPACK_BYTES = 20 * 1024**3
DEFAULT_UNPACK_FILES = 1_000_000
BYTES_VAR = "GPULAYER_UNPACK_MAX_BYTES"
FILES_VAR = "GPULAYER_UNPACK_MAX_FILES"
#: The largest single read of an archive stream: tarfile reads a pax or long-name header whole, in memory.
MAX_HEADER_READ = 16 * 1024 * 1024


class UnpackLimit(TaskSetupError):
    """A task's bundle and inputs would write more bytes or entries than this worker allows."""


def env_count(name: str, default: int) -> int:
    """A positive integer from the environment variable ``name``, else ``default``; AgentError (exit 2) if malformed."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise AgentError(f"{name}={raw!r}: expected a whole number >= 1")
    return value


@dataclass
class UnpackBudget:
    """What one task's source bundle and inputs may still write (the worker's caps)."""

    max_bytes: int = DEFAULT_UNPACK_BYTES
    max_files: int = DEFAULT_UNPACK_FILES
    used_bytes: int = 0
    used_files: int = 0

    @classmethod
    def from_environment(cls) -> "UnpackBudget":
        """Caps from $GPULAYER_UNPACK_MAX_BYTES and $GPULAYER_UNPACK_MAX_FILES (20 GiB, 1,000,000 by default)."""
        return cls(env_count(BYTES_VAR, DEFAULT_UNPACK_BYTES), env_count(FILES_VAR, DEFAULT_UNPACK_FILES))

    def fresh(self) -> "UnpackBudget":
        """The same caps, nothing used: one task's budget."""
        return UnpackBudget(self.max_bytes, self.max_files)

    def take(self, n_bytes: int = 0, n_files: int = 0) -> None:
        """Charge bytes and entries; raises UnpackLimit (charging nothing) past a cap."""
        if self.used_bytes + n_bytes > self.max_bytes:
            raise UnpackLimit(f"the source bundle and inputs unpack to more than {self.max_bytes} bytes, "
                              f"this worker's cap ({BYTES_VAR}): refused, nothing left in the task directory")
        if self.used_files + n_files > self.max_files:
            raise UnpackLimit(f"the source bundle and inputs hold more than {self.max_files} entries, "
                              f"this worker's cap ({FILES_VAR}): refused, nothing left in the task directory")
        self.used_bytes += n_bytes
        self.used_files += n_files


class BoundedStream:
    """A decompressed archive stream (read, seek, tell) whose furthest position reached is charged to a budget.

    Skipping forward costs the same as reading: both make the decompressor
    produce the bytes. Re-reading what was reached already costs nothing.
    """

    def __init__(self, raw: BinaryIO, budget: UnpackBudget):
        self.raw = raw
        self.budget = budget
        self.reached = 0

    def _reach(self, position: int) -> None:
        if position > self.reached:
            self.budget.take(position - self.reached)
            self.reached = position

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0 or size > MAX_HEADER_READ:
            raise UnpackLimit(f"the source bundle has a tar header over {MAX_HEADER_READ} bytes: refused")
        self._reach(self.raw.tell() + size)
        return self.raw.read(size)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_CUR:
            offset, whence = self.raw.tell() + offset, os.SEEK_SET
        if whence != os.SEEK_SET:
            raise OSError("a bundle stream seeks from its start only")
        self._reach(offset)
        return self.raw.seek(offset)

    def tell(self) -> int:
        return self.raw.tell()


class CappedWriter:
    """A binary file that refuses (UnpackLimit) to grow past ``max_bytes``: an artifact's download."""

    def __init__(self, out: BinaryIO, max_bytes: int, what: str):
        self.out = out
        self.max_bytes = max_bytes
        self.what = what

    def write(self, data: bytes) -> int:
        if self.out.tell() + len(data) > self.max_bytes:
            raise UnpackLimit(f"{self.what} is larger than {self.max_bytes} bytes, this worker's cap ({BYTES_VAR}): refused")
        return self.out.write(data)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self.out.seek(offset, whence)

    def tell(self) -> int:
        return self.out.tell()

    def truncate(self, size: int | None = None) -> int:
        return self.out.truncate(size)

    def flush(self) -> None:
        self.out.flush()
