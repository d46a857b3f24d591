"""Safe placement of artifacts in a task directory: source bundles and inputs.

A bundle is checked completely before anything is written: an absolute path,
a ``..`` component, a device file, a fifo, or a link that leads outside the
task directory rejects the whole bundle with a clear message. Links are
resolved against the other links in the bundle, so a chain of innocent-looking
links cannot climb out either. Then members are written by hand (never
``extractall``): folders, regular files with O_EXCL|O_NOFOLLOW, hard links,
and symlinks last.

The archive is read through a ``BoundedStream``: the worker's caps on bytes
and entries (``agent.artifacts.caps``) are charged as the decompressor produces them,
so a gzip bomb stops at the cap, with the task directory left empty.
"""

import bz2
import gzip
import lzma
import os
import shutil
import stat
import tarfile
import zlib
from pathlib import Path
from typing import BinaryIO

from ..errors import TaskSetupError, UnsafeBundle
from .caps import BoundedStream, UnpackBudget, UnpackLimit

MAX_LINK_HOPS = 40


def safe_relative_path(raw: str, what: str = "path") -> str:
    """Normalise a relative path; raise TaskSetupError for absolute or ``..`` paths."""
    text = str(raw).replace("\\", "/")
    if not text or text.startswith("/") or "\x00" in text:
        raise TaskSetupError(f"{what} {raw!r} must be a relative path inside the task directory")
    parts = [part for part in text.split("/") if part not in ("", ".")]
    if not parts or ".." in parts:
        raise TaskSetupError(f"{what} {raw!r} must be a relative path inside the task directory")
    return "/".join(parts)


def _member_kind(member: tarfile.TarInfo) -> str:
    if member.isreg():
        return "file"
    if member.isdir():
        return "dir"
    if member.issym():
        return "symlink"
    if member.islnk():
        return "hardlink"
    if member.ischr() or member.isblk():
        return "device"
    if member.isfifo():
        return "fifo"
    return "other"


def _resolve(parts: list[str], links: dict[str, str], hops: int = 0) -> list[str] | None:
    """Resolve a path (list of components from the task root) through bundle symlinks.

    Returns the resolved components, or None when it leaves the root or loops.
    """
    resolved: list[str] = []
    for index, part in enumerate(parts):
        if part in ("", "."):
            continue
        if part == "..":
            if not resolved:
                return None
            resolved.pop()
            continue
        resolved.append(part)
        key = "/".join(resolved)
        if key in links:
            if hops >= MAX_LINK_HOPS:
                return None
            target = links[key]
            if target.startswith("/"):
                return None
            base = resolved[:-1]
            rest = parts[index + 1 :]
            return _resolve(base + target.split("/") + rest, links, hops + 1)
    return resolved


def check_members(members: list[tarfile.TarInfo]) -> None:
    """Raise UnsafeBundle for the first member that could write outside the root."""
    links: dict[str, str] = {}
    kinds: dict[str, str] = {}
    for member in members:
        kind = _member_kind(member)
        if kind in ("device", "fifo", "other"):
            raise UnsafeBundle(f"unsafe bundle: {member.name!r} is a {kind}, only files, folders and links are allowed")
        try:
            name = safe_relative_path(member.name, "bundle member")
        except TaskSetupError as exc:
            raise UnsafeBundle(f"unsafe bundle: {exc}") from None
        parent = name.rsplit("/", 1)[0] if "/" in name else ""
        prefix = ""
        for part in parent.split("/") if parent else []:
            prefix = f"{prefix}/{part}" if prefix else part
            if kinds.setdefault(prefix, "dir") != "dir":
                raise UnsafeBundle(f"unsafe bundle: {member.name!r} lies under {prefix!r}, which is a {kinds[prefix]}")
        if kind == "symlink":
            target = member.linkname
            if not target:  # os.symlink would fail halfway through the unpacking, after files were written
                raise UnsafeBundle(f"unsafe bundle: symlink {member.name!r} has an empty target")
            if target.startswith("/") or _resolve(name.split("/")[:-1] + target.split("/"), {**links, name: target}) is None:
                raise UnsafeBundle(f"unsafe bundle: symlink {member.name!r} -> {target!r} leads outside the task directory")
            links[name] = target
        if kind == "hardlink":
            try:
                target = safe_relative_path(member.linkname, "hard link target")
            except TaskSetupError:
                raise UnsafeBundle(f"unsafe bundle: hard link {member.name!r} -> {member.linkname!r} leads outside the task directory") from None
            if kinds.get(target) != "file":
                raise UnsafeBundle(f"unsafe bundle: hard link {member.name!r} -> {member.linkname!r} names no earlier file in the bundle")
        if name in kinds and (kinds[name] != "dir" or kind != "dir"):
            raise UnsafeBundle(f"unsafe bundle: {member.name!r} appears twice")
        kinds[name] = kind
    # A link checked early may be re-routed by a later one: check them all again.
    for name, target in links.items():
        if _resolve(name.split("/")[:-1] + target.split("/"), links) is None:
            raise UnsafeBundle(f"unsafe bundle: symlink {name!r} -> {target!r} leads outside the task directory")


def _write_file(archive: tarfile.TarFile, member: tarfile.TarInfo, path: Path) -> None:
    mode = (member.mode & 0o755) | 0o600
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    source = archive.extractfile(member)
    with os.fdopen(os.open(path, flags, mode), "wb") as out:
        if source is not None:
            shutil.copyfileobj(source, out, 1024 * 1024)


#: The compressions a bundle may use, by their magic bytes (the client writes gzip); anything else is read as plain tar.
_OPENERS = ((b"\x1f\x8b", gzip.open), (b"BZh", bz2.open), (b"\xfd7zXZ\x00", lzma.open))


def _open_stream(bundle: str | os.PathLike) -> BinaryIO:
    with open(bundle, "rb") as raw:
        head = raw.read(6)
    for magic, opener in _OPENERS:
        if head.startswith(magic):
            return opener(bundle, "rb")  # type: ignore[operator, return-value]
    return open(bundle, "rb")


def _listed(archive: tarfile.TarFile, budget: UnpackBudget) -> list[tarfile.TarInfo]:
    """Every member's header, each one charged as an entry (its data is charged as the stream passes it)."""
    members = []
    while (member := archive.next()) is not None:
        budget.take(n_files=1)
        members.append(member)
    return members


def unpack_bundle(bundle: str | os.PathLike, dest: str | os.PathLike, budget: UnpackBudget | None = None) -> int:
    """Unpack a tar.gz bundle into ``dest`` (an empty folder); returns the member count.

    Raises UnsafeBundle (nothing written), UnpackLimit past ``budget``'s caps
    (default: the worker's, from the environment; ``dest`` left empty) or
    TaskSetupError for an unreadable archive.
    """
    root = Path(dest)
    budget = budget if budget is not None else UnpackBudget.from_environment()
    try:
        with _open_stream(bundle) as stream, tarfile.open(fileobj=BoundedStream(stream, budget), mode="r:") as archive:  # type: ignore[call-overload]
            members = _listed(archive, budget)
            check_members(members)
            for member in members:
                _place_member(archive, member, root)
            for member in members:
                if member.issym():
                    link = root / safe_relative_path(member.name)
                    link.parent.mkdir(parents=True, exist_ok=True)  # a bundle need not list its folders
                    os.symlink(member.linkname, link)
    except UnpackLimit:
        empty_dir(root)
        raise
    except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError) as exc:
        empty_dir(root)
        raise TaskSetupError(f"cannot unpack the source bundle: {exc}") from None
    return len(members)


def empty_dir(root: Path) -> None:
    """Remove what a failed unpacking wrote (``dest`` was empty), never following a link."""
    for child in root.iterdir() if root.is_dir() else ():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def _place_member(archive: tarfile.TarFile, member: tarfile.TarInfo, root: Path) -> None:
    path = root / safe_relative_path(member.name)
    if member.isdir():
        path.mkdir(parents=True, exist_ok=True)
        return
    if member.issym():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    if member.islnk():
        os.link(root / safe_relative_path(member.linkname), path)
    else:
        _write_file(archive, member, path)


def place_file(source: str | os.PathLike, workdir: str | os.PathLike, relative: str, what: str = "input",
               budget: UnpackBudget | None = None) -> Path:
    """Copy ``source`` to ``workdir/relative``, refusing paths that end up outside.

    An existing file or link at the destination is replaced, never written through.
    The copy is charged to ``budget`` (its bytes and one entry) before it is written: UnpackLimit past a cap.
    """
    name = safe_relative_path(relative, what)
    if budget is not None:
        budget.take(os.path.getsize(source), 1)
    root = Path(workdir).resolve()
    dest = root / name
    dest.parent.mkdir(parents=True, exist_ok=True)
    real_parent = dest.parent.resolve()
    if real_parent != root and root not in real_parent.parents:
        raise TaskSetupError(f"{what} {relative!r} would land outside the task directory")
    if dest.is_symlink() or dest.exists():
        if dest.is_dir() and not dest.is_symlink():
            raise TaskSetupError(f"{what} {relative!r} is a folder in the task directory")
        dest.unlink()
    shutil.copyfile(source, dest)
    os.chmod(dest, stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IROTH)
    return dest
