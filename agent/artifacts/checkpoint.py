"""A task's checkpoint directory (docs/training.md): restored before it starts, uploaded when it stops.

Every task gets ``GPULAYER_CHECKPOINT_DIR``, a folder in its working directory (so the sandbox binds
it read-write at the path the variable names). Before the process starts, the newest complete
checkpoint of the task's element or rank (the Assignment's ``checkpoint``) is fetched through the
artifact cache and copied in. When an attempt ends without success, and every
``checkpoint_every_seconds`` while it runs, the folder is uploaded file by file as artifacts (a file
whose digest the control plane has is not sent again) and its manifest recorded: with the finish, or
``POST /worker/checkpoint``. The control plane records a manifest only once every file is stored.

A snapshot is consistent as of the moment its files are opened: each is hashed and uploaded from
the descriptor opened then, so a file the task replaces meanwhile by a rename (``torch.save`` to a
temporary name, then ``os.replace``) is sent as it was. A file the task rewrites in place while it
is sent fails the server's digest check, and that checkpoint is not recorded (the last one stays).
A file's digest is kept by (path, inode, size, mtime), so an unchanged 10 GB file is hashed once.

The task owns the folder and may swap any folder in it (the folder itself too) for a link to a host folder
while a snapshot is taken: every path is resolved beneath the task's directory without following a link
(``agent.artifacts.beneath``), so a link is never followed, nor a folder entered through one.
"""

import os
import shutil
import stat
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO, Callable

from gpulayer.protocol import plural
from gpulayer.protocol.assignment import CheckpointRef

from ..errors import AgentError, DigestMismatch, Rejected, TaskSetupError, Unreachable
from ..events import log_event
from ..link.transport import Transport
from .beneath import Beneath, LinkOnTheWay
from .bundle import safe_relative_path
from .cache import ArtifactCache, sha256_handle

#: The folder's name in the task's working directory.
DIR_NAME = ".gpulayer-checkpoint"
#: Files held open at once while a snapshot is taken (a larger folder is taken in batches of this many).
OPEN_BATCH = 256
#: Files hashed and sent (or fetched) at once: their round trips and fsyncs overlap.
UPLOADS_AT_ONCE = 4
#: Digests remembered per worker.
MEMO_ENTRIES = 100_000

Key = tuple[str, int, int, int]


class DigestMemo:
    """``sha256:`` digests of files already read, by (path, inode, size, mtime_ns); thread-safe, bounded (LRU)."""

    def __init__(self, limit: int = MEMO_ENTRIES):
        self.limit = limit
        self._found: OrderedDict[Key, str] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(path: str | os.PathLike, st: os.stat_result) -> Key:
        return (os.fspath(path), st.st_ino, st.st_size, st.st_mtime_ns)

    def get(self, key: Key) -> str | None:
        with self._lock:
            found = self._found.get(key)
            if found is not None:
                self._found.move_to_end(key)
            return found

    def put(self, key: Key, digest: str) -> None:
        with self._lock:
            self._found[key] = digest
            self._found.move_to_end(key)
            while len(self._found) > self.limit:
                self._found.popitem(last=False)


class Checkpointer:
    """One task's checkpoint folder: its restore, its snapshots and their records."""

    def __init__(self, directory: Path, transport: Transport, cache: ArtifactCache, memo: DigestMemo, note: Callable[[str], None]):
        self.dir = directory
        self.transport = transport
        self.cache = cache
        self.memo = memo
        self.note = note
        #: The manifest last restored or recorded: a snapshot equal to it is not recorded again.
        self.last: list[dict] | None = None
        self._lock = threading.Lock()  # one snapshot at a time (the periodic thread and the final one)
        self.supported = True  # False once the control plane answered 404 to the record (an older one)

    def prepare(self, ref: CheckpointRef | None) -> int | None:
        """Make the folder, and restore ``ref`` into it; the attempt it came from, or None.

        Raises TaskSetupError for a manifest path outside the folder or a file that cannot be fetched (the task
        then fails to start: it never silently starts from scratch); Unreachable passes through.
        """
        self.dir.mkdir(parents=True, exist_ok=True)
        if ref is None:
            return None
        places = [safe_relative_path(str(entry["path"]), "checkpoint file") for entry in ref.files]
        try:
            with ThreadPoolExecutor(UPLOADS_AT_ONCE, thread_name_prefix="checkpoint-restore") as pool:
                list(pool.map(self._place, places, ref.files))  # list(): the first error raises here
        except (Rejected, DigestMismatch, OSError) as exc:  # the task fails to start rather than start from scratch
            raise TaskSetupError(f"checkpoint {ref.id} of attempt {ref.attempt} could not be restored: {exc}") from None
        total = sum(int(entry["size"]) for entry in ref.files)
        self.last = sorted((dict(e) for e in ref.files), key=lambda e: str(e["path"]))
        self.note(f"checkpoint {ref.id} of attempt {ref.attempt} restored: {plural(len(ref.files), 'file')}, {total} bytes")
        return ref.attempt

    def _place(self, relative: str, entry: dict) -> None:
        """Put one file of a checkpoint in under a temporary name, then its own: copied from the artifact cache
        when it is there, else downloaded straight into place (hashed as it is written, verified, not kept
        in the cache: each byte is written once)."""
        digest, mode = str(entry["digest"]), int(entry.get("mode", 0o644)) & 0o7777
        target = self.dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.with_name(f".{target.name}.restoring")
        cached = self.cache.cached(digest)
        try:
            if cached is None:
                raise FileNotFoundError(digest)
            shutil.copyfile(cached, temp)
        except FileNotFoundError:  # not cached, or evicted meanwhile
            self.cache.fetch_into(digest, temp)
        os.chmod(temp, mode)
        os.replace(temp, target)
        self.memo.put(DigestMemo.key(target, os.stat(target)), digest)

    def snapshot(self) -> tuple[list[dict], int] | None:
        """Upload the folder as it is now: (manifest, bytes sent); None when it is empty (or a link, noted) or
        unchanged since the last restore or record. Raises Rejected (a file changed while sent, or refused),
        OSError, Unreachable."""
        try:
            with Beneath.at(self.dir.parent) as workdir, workdir.folder(self.dir.name) as folder:
                taken = self._upload(folder, folder.files()[0])
        except FileNotFoundError:
            return None
        except LinkOnTheWay:
            self.note(f"checkpoint not uploaded: {self.dir.name} is not a folder (a symbolic link?)")
            return None
        manifest, sent = taken
        if not manifest or manifest == self.last:
            return None
        return manifest, sent

    def _upload(self, folder: Beneath, files: list[str]) -> tuple[list[dict], int]:
        """Open the files (in batches), then hash and send them from those descriptors: (manifest, bytes sent)."""
        manifest: list[dict] = []
        sent = 0
        for start in range(0, len(files), OPEN_BATCH):
            opened: list[tuple[str, Path, BinaryIO]] = []
            try:
                for relative in files[start : start + OPEN_BATCH]:
                    try:
                        opened.append((relative, self.dir / relative, folder.open_regular(relative)))
                    except OSError:  # removed, or swapped for something else (a link) meanwhile
                        continue
                with ThreadPoolExecutor(UPLOADS_AT_ONCE, thread_name_prefix="checkpoint-upload") as pool:
                    for entry, bytes_sent in pool.map(lambda o: self._send(*o), opened):
                        manifest.append(entry)
                        sent += bytes_sent
            finally:
                for _, _, handle in opened:
                    handle.close()
        return manifest, sent

    def _send(self, relative: str, path: Path, handle: BinaryIO) -> tuple[dict, int]:
        st = os.fstat(handle.fileno())
        key = DigestMemo.key(path, st)
        digest = self.memo.get(key)
        if digest is None:
            digest = sha256_handle(handle)
            self.memo.put(key, digest)
        sent = 0
        if not self.transport.retrying(f"HEAD /artifacts/{digest}", self.transport.artifact_exists, digest):
            # The descriptor opened at the snapshot, opened again: the file as it was, even if replaced since.
            self.transport.upload_artifact(digest, f"/proc/self/fd/{handle.fileno()}", probe=False)
            sent = st.st_size
        return {"path": relative, "digest": digest, "size": st.st_size, "mode": stat.S_IMODE(st.st_mode)}, sent

    def final(self) -> list[dict] | None:
        """The manifest to send with the finish of an attempt that did not succeed (None: nothing new, or the
        upload failed, with a log line)."""
        with self._lock:
            try:
                taken = self.snapshot()
            except (Rejected, OSError, Unreachable) as exc:
                self.note(f"checkpoint not uploaded: {exc}")
                return None
            if taken is None:
                return None
            manifest, sent = taken
            self.note(
                f"checkpoint uploaded with the finish: {plural(len(manifest), 'file')}, {sum(int(e['size']) for e in manifest)} bytes, {sent} sent"
            )
            return manifest

    def periodic(self, task_id: int, attempt: int) -> bool:
        """Upload and record a checkpoint now (``--checkpoint-every``); False when the control plane has no
        checkpoint route (an older one): no more are tried."""
        with self._lock:
            try:
                taken = self.snapshot()
                if taken is None:
                    return True
                manifest, sent = taken
                answer = self.transport.call("POST", "/worker/checkpoint", {"task_id": task_id, "attempt": attempt, "files": manifest})
            except Rejected as exc:
                if exc.status in (404, 405):
                    self.supported = False
                    return False
                self.note(f"checkpoint not recorded: {exc}")
                return True
            except (OSError, Unreachable, AgentError) as exc:
                self.note(f"checkpoint not recorded: {exc}")
                return True
            self.last = manifest
            self.note(f"checkpoint {answer.get('checkpoint_id')} recorded: {plural(len(manifest), 'file')}, {answer.get('bytes')} bytes, {sent} sent")
            log_event("checkpoint_recorded", task_id=task_id, attempt=attempt, files=len(manifest), sent=sent)
            return True


class Periodic:
    """A thread that takes a checkpoint every ``interval_s`` until stopped."""

    def __init__(self, checkpointer: Checkpointer, task_id: int, attempt: int, interval_s: float):
        self.checkpointer, self.task_id, self.attempt, self.interval_s = checkpointer, task_id, attempt, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"checkpoint-{task_id}")

    def start(self) -> "Periodic":
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self.checkpointer.periodic(self.task_id, self.attempt):
                return

    def stop(self) -> None:
        """Stop taking checkpoints; waits for one being taken to end."""
        self._stop.set()
        self._thread.join()
