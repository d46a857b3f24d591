"""Paths inside a task's directory, resolved beneath it without following a symbolic link.

The agent is root in the host's view and the task owns its directory, so every folder in it may be exchanged
with a link to a host folder (``renameat2(RENAME_EXCHANGE)``) between two system calls: a walk that then opens
``dir/sub/file`` by its full path reads whatever host file the link leads to (``O_NOFOLLOW`` guards only the
last component). So the agent opens the task's directory once (its own path: the folders above it are the
agent's) and resolves every path beneath that descriptor with ``openat2(RESOLVE_BENEATH |
RESOLVE_NO_SYMLINKS)`` (Linux 5.6+), or, where the kernel lacks it or a seccomp filter refuses it, with
``openat`` one component at a time with ``O_NOFOLLOW | O_DIRECTORY``. A link anywhere on the way fails with
``ELOOP`` (``LinkOnTheWay``); a folder swapped meanwhile is simply not entered. Files are opened without
blocking (a FIFO never holds the agent) and checked on the open descriptor.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from typing import BinaryIO

#: openat2(2)'s number: one for every architecture (it came after the tables were unified).
SYS_OPENAT2 = 437
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
#: O_NONBLOCK: a FIFO opens at once instead of waiting for a writer.
READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
#: The errors of a path that leads through a link or a non-folder.
_NOT_BENEATH = (errno.ELOOP, errno.ENOTDIR, errno.EXDEV)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class NotRegularFile(OSError):
    """A path in a task's directory that is not a regular file (or no longer one)."""


class LinkOnTheWay(OSError):
    """A path in a task's directory that leads through a symbolic link (or something not a folder)."""


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words."""
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "a special file"


def _parts(relative: str) -> list[str]:
    parts = [part for part in relative.split("/") if part not in ("", ".")]
    if ".." in parts or relative.startswith("/"):
        raise LinkOnTheWay(errno.EXDEV, f"{relative!r} is not a path beneath the folder")
    return parts


class _Openat2:
    """openat2(2) through libc's syscall(); None once the kernel (or a seccomp filter) has refused it."""

    def __init__(self) -> None:
        self.works: bool | None = None
        try:
            self._syscall = ctypes.CDLL(None, use_errno=True).syscall
        except (OSError, AttributeError):
            self.works = False

    def __call__(self, dir_fd: int, relative: str, flags: int, mode: int) -> int | None:
        if self.works is False:
            return None
        how = _OpenHow(flags | os.O_CLOEXEC, mode, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)
        for _ in range(8):  # EAGAIN: a rename raced the lookup; the kernel asks to try again
            fd = self._syscall(ctypes.c_long(SYS_OPENAT2), ctypes.c_int(dir_fd), ctypes.c_char_p(os.fsencode(relative)),
                               ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
            if fd >= 0:
                self.works = True
                return fd
            code = ctypes.get_errno()
            if code in (errno.ENOSYS, errno.EPERM) and not self.works:  # no openat2 here: components one by one
                self.works = False
                return None
            if code != errno.EAGAIN:
                raise (LinkOnTheWay if code in _NOT_BENEATH else OSError)(code, f"{relative}: {os.strerror(code)}")
        raise OSError(errno.EAGAIN, f"{relative}: renamed while opened")


_openat2 = _Openat2()


def open_beneath(dir_fd: int, relative: str, flags: int = READ_FLAGS, mode: int = 0) -> int:
    """A descriptor of ``relative`` beneath the folder ``dir_fd``, through no link (the last component
    included). Raises LinkOnTheWay for a link or non-folder on the way, OSError as open(2) otherwise."""
    parts = _parts(relative)
    if not parts:
        return os.open(".", flags | os.O_CLOEXEC, dir_fd=dir_fd)
    fd = _openat2(dir_fd, "/".join(parts), flags, mode)
    if fd is not None:
        return fd
    return _open_by_components(dir_fd, parts, flags, mode)


def _open_by_components(dir_fd: int, parts: list[str], flags: int, mode: int) -> int:
    at, opened = dir_fd, []
    try:
        try:
            for part in parts[:-1]:
                at = os.open(part, DIR_FLAGS | os.O_NOFOLLOW, dir_fd=at)
                opened.append(at)
            return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=at)
        except OSError as exc:
            if exc.errno in _NOT_BENEATH:
                raise LinkOnTheWay(exc.errno, f"{'/'.join(parts)}: {os.strerror(exc.errno)}") from None
            raise
    finally:
        for fd in opened:
            os.close(fd)


class Beneath:
    """A folder opened once (a task's directory, or one in it), and the paths beneath it; a context manager."""

    def __init__(self, fd: int, path: str):
        self.fd, self.path = fd, path

    @classmethod
    def at(cls, path: str | os.PathLike) -> "Beneath":
        """Open a folder the agent itself placed (its parents are the agent's): a link there is refused too."""
        return cls(os.open(path, DIR_FLAGS | os.O_NOFOLLOW), os.fspath(path))

    def folder(self, relative: str) -> "Beneath":
        """The folder ``relative`` beneath this one (LinkOnTheWay when it is, or is reached through, a link)."""
        return Beneath(open_beneath(self.fd, relative, DIR_FLAGS), os.path.join(self.path, relative))

    def lstat(self, relative: str) -> os.stat_result:
        """``relative``'s own status (a link's, not its target's), reached through no link on the way."""
        parent, _, name = relative.rpartition("/")
        if not parent:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        with self.folder(parent) as above:
            return os.stat(name, dir_fd=above.fd, follow_symlinks=False)

    def open_regular(self, relative: str) -> BinaryIO:
        """``relative`` opened for reading when it is a regular file; never blocks, never follows a link.

        Raises NotRegularFile for anything else, LinkOnTheWay for a link on the way, OSError as open(2).
        """
        try:
            fd = open_beneath(self.fd, relative)
        except LinkOnTheWay as exc:
            raise NotRegularFile(exc.errno, f"{relative} is a symbolic link, or lies beyond one") from None
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise NotRegularFile(errno.EINVAL, f"{relative} is {kind_of(mode)}")
            os.set_blocking(fd, True)
            return os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise

    def files(self, top: str = "") -> tuple[list[str], list[tuple[str, int]]]:
        """Every regular file under ``top`` (paths relative to this folder, sorted), and (path, mode) of every
        other entry that is not a folder. Folders are entered by descriptor, never through a link; one
        swapped for something else meanwhile is not entered."""
        regular: list[str] = []
        others: list[tuple[str, int]] = []
        pending = [top]
        while pending:
            where = pending.pop()
            try:
                folder = self.folder(where)
            except OSError:  # removed, or swapped for a link, since it was listed
                continue
            with folder, os.scandir(folder.fd) as entries:
                for entry in entries:
                    relative = f"{where}/{entry.name}" if where else entry.name
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            pending.append(relative)
                        elif entry.is_file(follow_symlinks=False):
                            regular.append(relative)
                        else:
                            others.append((relative, entry.stat(follow_symlinks=False).st_mode))
                    except OSError:
                        continue
        return sorted(regular), sorted(others)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "Beneath":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
