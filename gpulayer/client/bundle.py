"""Pack a `--source DIR` into a deterministic tar.gz.

In a git checkout the files git tracks and the untracked ones it does not
ignore are packed (what .gitignore names stays home, as a user means by
"the checkout"); elsewhere every file under DIR except `.git` folders. A file
the command names (`python train.py`) that is left out is refused, naming
why (`named_but_left_out`), rather than found missing on the worker. The
same files with the same contents give the same bytes, hence the same digest,
so an unchanged source is never uploaded twice: names are sorted, times,
owners and the gzip header are zeroed, and modes are reduced to 0644/0755.

A folder or file that cannot be read (its permissions) is refused, naming it
(BadInput): the job would otherwise run without it, told nothing.
"""
from __future__ import annotations

import gzip
import os
import stat
import subprocess
import tarfile
from pathlib import Path

from gpulayer.client.errors import BadInput, ClientError


def list_files(directory: Path) -> list[str]:
    """Relative POSIX paths to pack, sorted: in a checkout, what git tracks or does not ignore.

    Raises BadInput naming a folder under DIR that cannot be read (or a tracked file that cannot be reached).
    """
    directory = Path(directory)
    tracked = _git_tracked(directory)
    names = tracked if tracked is not None else walk_files(directory, "--source", skip=(".git",), links=True)
    return sorted(n for n in names if _packable(directory / n))


def _packable(path: Path) -> bool:
    """A symlink, or a file that still exists (git lists deleted and submodule entries too); BadInput for one
    that cannot be reached (a folder on its way that may not be searched)."""
    try:
        return stat.S_ISLNK(path.lstat().st_mode) or not path.is_dir()
    except FileNotFoundError:
        return False
    except OSError as exc:  # a folder on its way that may not be searched
        raise unreadable("--source", path, exc) from None


def unreadable(option: str, path: Path | str, exc: OSError) -> BadInput:
    """The refusal of a path under `option` that cannot be read: it names the path and why."""
    return BadInput(f"{option}: cannot read {exc.filename or path}: {exc.strerror or exc} (nothing was sent)")


def _git_tracked(directory: Path) -> list[str] | None:
    """Files git tracks under `directory` (relative to it), its submodules' too, and the untracked ones
    it does not ignore; None when it is no checkout."""
    try:
        inside = subprocess.run(["git", "-C", str(directory), "rev-parse", "--is-inside-work-tree"],
                                capture_output=True, text=True, check=False)
        if inside.returncode != 0 or inside.stdout.strip() != "true":
            return None
        # --recurse-submodules goes with --cached alone (git ls-files), so untracked files are a second list
        listed = [subprocess.run(["git", "-C", str(directory), "ls-files", "-z", *mode], capture_output=True,
                                 check=True).stdout
                  for mode in (["--cached", "--recurse-submodules"], ["--others", "--exclude-standard"])]
    except (OSError, subprocess.CalledProcessError):
        return None
    names = {name for out in listed for name in out.decode("utf-8", "surrogateescape").split("\0") if name}
    return sorted(names)


def named_but_left_out(directory: Path, names: list[str], command: list[str]) -> list[str]:
    """The command's arguments that name a file under `directory` (relative, as the task sees its working
    directory) which is not among the packed `names`: git ignores it, or it is not readable as a member."""
    packed, found = set(names), []
    for arg in command[1:] if command else []:
        if not arg or arg.startswith("-") or os.path.isabs(arg) or ".." in Path(arg).parts:
            continue
        try:
            if (directory / arg).is_file() and Path(os.path.normpath(arg)).as_posix() not in packed:
                found.append(arg)
        except OSError:
            continue
    return found


def walk_files(directory: Path, option: str, skip: tuple[str, ...] = (), links: bool = False) -> list[str]:
    """The files under `directory`, as relative POSIX paths (symlinked folders not followed; with `links`,
    listed themselves, as symlinks to pack); folders named in `skip` left out.

    Raises BadInput (unreadable, naming `option`) for a folder that cannot be listed: os.walk would leave
    it out, and so would pathlib's rglob, without a word.
    """
    def refuse(exc: OSError) -> None:
        raise unreadable(option, exc.filename or directory, exc)

    names: list[str] = []
    for root, dirs, files in os.walk(directory, onerror=refuse):
        symlinked = [d for d in dirs if os.path.islink(os.path.join(root, d))]
        dirs[:] = [d for d in dirs if d not in skip and d not in symlinked]
        rel_root = Path(root).relative_to(directory)
        names.extend((rel_root / f).as_posix() for f in files)
        if links:
            names.extend((rel_root / d).as_posix() for d in symlinked)
    return names


def _member(directory: Path, name: str) -> tuple[tarfile.TarInfo, Path | None]:
    """A normalised TarInfo for one file or symlink (no times, owners or odd modes)."""
    path = directory / name
    info = tarfile.TarInfo(name)
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, os.readlink(path), 0o777
        return info, None
    if not stat.S_ISREG(st.st_mode):
        raise ClientError(f"cannot pack {path}: not a regular file or symlink")
    info.size = st.st_size
    info.mode = 0o755 if st.st_mode & 0o111 else 0o644
    return info, path


def pack(directory: Path | str, dest: Path | str) -> list[str]:
    """Write the tar.gz of `directory` to `dest`; return the packed names.

    Raises ClientError when DIR is not a folder or holds a special file, BadInput naming a folder or
    file under it that cannot be read.
    """
    directory, dest = Path(directory), Path(dest)
    if not directory.is_dir():
        raise ClientError(f"cannot pack {directory}: not a directory")
    names = list_files(directory)
    with open(dest, "wb") as raw, \
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            info, path = _member(directory, name)
            if path is None:
                tar.addfile(info)
                continue
            try:
                fh = open(path, "rb")
            except OSError as exc:
                raise unreadable("--source", path, exc) from None
            with fh:
                tar.addfile(info, fh)
    return names
