"""One control plane per home: an exclusive `flock` on `HOME/control-plane.lock` for the life of one.

Two control planes on one home would both write its state file and run its
upkeep, and a second `gpulayer up` would point `client.json` at itself. The
kernel drops an flock when the process that holds it dies, however it dies
(SIGKILL included), so a lock file left behind never blocks a restart. The
holder writes its pid, what it is and (once it listens) its URL into the file,
for a refusal to name.
"""
from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

from gpulayer.server.errors import ConfigError

LOCK_FILE = "control-plane.lock"
HOLDER_READS = 10  # tries, 50 ms apart, to read the pid of a holder that has only just locked


class HomeInUse(ConfigError):
    """Another process runs a control plane on this home; `holder` is what its lock file says."""

    code = "home_in_use"

    def __init__(self, home: Path, holder: dict):
        self.holder = holder
        what = holder.get("what") or "a control plane"
        where = f" on {holder['url']}" if holder.get("url") else ""
        super().__init__(f"{home} is in use by {what} (pid {holder.get('pid', '?')}){where}: one control plane "
                         "per home. Stop it first, or use another --home (GPULAYER_HOME)")


class HomeLock:
    """The exclusive lock of one home, held from `acquire()` to `release()` (or the process's end)."""

    def __init__(self, home: Path, what: str):
        self.path = Path(home) / LOCK_FILE
        self.what = what
        self.fd: int | None = None
        self.record: dict = {}

    def acquire(self) -> "HomeLock":
        """Take the lock now or raise HomeInUse (naming the holder's pid); no waiting."""
        if self.fd is not None:
            return self
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            for _ in range(HOLDER_READS):  # the holder writes its pid just after it locked
                if holder:
                    break
                time.sleep(0.05)
                holder = _read(fd)
            os.close(fd)
            raise HomeInUse(self.path.parent, holder) from None
        self.fd = fd
        self.note(pid=os.getpid(), what=self.what, started_at=time.time())
        return self

    def note(self, **fields) -> None:
        """Add fields (the URL once listening) to what the lock file tells a refused second control plane."""
        if self.fd is None:
            return
        self.record.update(fields)
        data = (json.dumps(self.record, sort_keys=True) + "\n").encode()
        # Written over the old record, then cut to length: the record only grows (fields are added), so a
        # reader never meets the empty file that truncating first would show it.
        os.pwrite(self.fd, data, 0)
        os.ftruncate(self.fd, len(data))

    def release(self) -> None:
        """Empty the lock file (no stale pid to read) and drop the lock."""
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        try:
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)

    def __enter__(self) -> "HomeLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read(fd: int) -> dict:
    """The holder's record ({} while it is still writing it, or for a file that is not ours)."""
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
