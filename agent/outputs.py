"""Collecting a task's declared outputs and uploading them by digest.

Outputs are regular files only. A FIFO, socket, device or symbolic link at a
declared path is skipped and reported, never opened in a way that can block:
opening a FIFO for reading waits for a writer, which held the worker's slot
for ever. Files are checked with ``lstat`` when collected and again, on the
open descriptor, when hashed and uploaded (the task may have swapped them).
"""

import hashlib
import os
import stat
from pathlib import Path
from typing import BinaryIO, Callable

from .bundle import safe_relative_path
from .cache import CHUNK_BYTES
from .errors import TaskSetupError

#: O_NONBLOCK: a FIFO opens at once instead of waiting for a writer; O_NOFOLLOW: a link is not followed.
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class NotRegularFile(OSError):
    """A declared output that is not a regular file (or no longer one)."""


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words."""
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "a special file"


def open_regular(path: str | os.PathLike) -> BinaryIO:
    """Open ``path`` for reading when it is a regular file; never blocks, never follows a final link.

    Raises NotRegularFile for anything else (OSError when it cannot be opened at all).
    """
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        if os.path.islink(path):
            raise NotRegularFile(f"{os.fspath(path)} is a symbolic link") from exc
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(f"{os.fspath(path)} is {kind_of(mode)}")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def sha256_regular(path: str | os.PathLike) -> str:
    """``sha256:<hex>`` of a regular file (NotRegularFile otherwise)."""
    hasher = hashlib.sha256()
    with open_regular(path) as handle:
        for chunk in iter(lambda: handle.read(CHUNK_BYTES), b""):
            hasher.update(chunk)
    return "sha256:" + hasher.hexdigest()


def _inside(path: Path, root: Path) -> bool:
    real = path.resolve()
    return real == root or root in real.parents


def _skipped(key: str, mode: int) -> str:
    return f"output {key!r} is {kind_of(mode)}, not a regular file: skipped"


def collect_outputs(workdir: str | os.PathLike, declared: list[str]) -> tuple[dict[str, Path], list[str]]:
    """Files to upload, keyed by their path relative to ``workdir``, and problems found.

    A declared file is itself; a declared folder is every regular file under
    it. A path outside the working directory (through ``..``, or a linked
    folder), a declared path that does not exist and anything that is not a
    regular file are skipped and reported.
    """
    root = Path(workdir).resolve()
    files: dict[str, Path] = {}
    problems: list[str] = []
    for raw in declared:
        try:
            name = safe_relative_path(raw, "output")
        except TaskSetupError as exc:
            problems.append(str(exc))
            continue
        path = root / name
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            problems.append(f"output {raw!r} was not produced")
            continue
        if not _inside(path.parent, root):
            problems.append(f"output {raw!r} leads outside the task directory: skipped")
        elif stat.S_ISDIR(mode):
            _walk(path, root, files, problems)
        elif stat.S_ISREG(mode):
            files[name] = path
        else:
            problems.append(_skipped(raw, mode))
    return files, problems


def _walk(folder: Path, root: Path, files: dict[str, Path], problems: list[str]) -> None:
    for dirpath, _, filenames in os.walk(folder):  # does not follow linked folders
        for filename in sorted(filenames):
            path = Path(dirpath) / filename
            key = path.relative_to(root).as_posix()
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                continue
            if stat.S_ISREG(mode):
                files[key] = path
            else:
                problems.append(_skipped(key, mode))


def upload_outputs(files: dict[str, Path], upload: Callable[[str, str], bool],
                   note: Callable[[str], None] = lambda _text: None) -> dict[str, str]:
    """Upload each file with ``upload(digest, path)`` (False: refused, not recorded).

    A file that is no longer a regular file is skipped with ``note(text)``.
    Returns {relative path: digest} of the uploaded files.
    """
    recorded = {}
    for key, path in sorted(files.items()):
        try:
            digest = sha256_regular(path)
        except OSError as exc:
            note(f"output {key!r} is not a regular file any more, or unreadable ({exc}): skipped")
            continue
        if upload(digest, str(path)):
            recorded[key] = digest
    return recorded
