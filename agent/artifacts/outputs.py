"""Collecting a task's declared outputs and uploading them by digest.

Outputs are regular files only. A FIFO, socket, device or symbolic link at a
declared path is skipped and reported, never opened in a way that can block:
opening a FIFO for reading waited for a writer, which held the worker's slot
for ever. Every path is resolved beneath the task's directory without
following a link (``agent.artifacts.beneath``): a sibling element sharing the sandbox
may swap a folder for a link to a host folder while the agent reads it. Each
file is opened once, checked on its descriptor, hashed and uploaded from that
descriptor (the task may have swapped it since it was collected).
"""

import os
import stat
from typing import Callable

from ..errors import TaskSetupError
from .beneath import Beneath, LinkOnTheWay, NotRegularFile, kind_of
from .bundle import safe_relative_path
from .cache import sha256_handle

__all__ = ["NotRegularFile", "collect_outputs", "kind_of", "upload_outputs"]


def _skipped(key: str, mode: int) -> str:
    return f"output {key!r} is {kind_of(mode)}, not a regular file: skipped"


def collect_outputs(workdir: str | os.PathLike, declared: list[str]) -> tuple[list[str], list[str]]:
    """Files to upload (paths relative to ``workdir``, sorted), and problems found.

    A declared file is itself; a declared folder is every regular file under
    it. A path through a link (or ``..``), a declared path that does not exist
    and anything that is not a regular file are skipped and reported.
    """
    files: set[str] = set()
    problems: list[str] = []
    try:
        root = Beneath.at(workdir)
    except OSError as exc:
        return [], [f"the task directory cannot be read ({exc}): no outputs"]
    with root:
        for raw in declared:
            try:
                name = safe_relative_path(raw, "output")
                mode = root.lstat(name).st_mode
            except TaskSetupError as exc:
                problems.append(str(exc))
                continue
            except LinkOnTheWay:
                problems.append(f"output {raw!r} lies beyond a symbolic link (or a file): skipped")
                continue
            except OSError:
                problems.append(f"output {raw!r} was not produced")
                continue
            if stat.S_ISDIR(mode):
                regular, others = root.files(name)
                files.update(regular)
                problems.extend(_skipped(key, kind) for key, kind in others)
            elif stat.S_ISREG(mode):
                files.add(name)
            else:
                problems.append(_skipped(raw, mode))
    return sorted(files), problems


def upload_outputs(workdir: str | os.PathLike, files: list[str], upload: Callable[[str, str, str], bool],
                   note: Callable[[str], None] = lambda _text: None) -> dict[str, str]:
    """Upload each file with ``upload(key, digest, path)`` (False: refused, not recorded), where ``path``
    reopens the descriptor it was hashed from (``/proc/self/fd/N``).

    A file that is no longer a regular file (or lies beyond a link now) is skipped with ``note(text)``.
    Returns {relative path: digest} of the uploaded files.
    """
    recorded: dict[str, str] = {}
    try:
        root = Beneath.at(workdir)
    except OSError as exc:
        note(f"the task directory cannot be read ({exc}): no outputs uploaded")
        return recorded
    with root:
        for key in sorted(files):
            try:
                handle = root.open_regular(key)
            except OSError as exc:
                note(f"output {key!r} is not a regular file any more, or unreadable ({exc}): skipped")
                continue
            with handle:
                digest = sha256_handle(handle)
                if upload(key, digest, f"/proc/self/fd/{handle.fileno()}"):
                    recorded[key] = digest
    return recorded
