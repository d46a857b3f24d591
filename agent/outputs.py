"""Collecting a task's declared outputs and uploading them by digest."""

import os
from pathlib import Path
from typing import Callable

from .bundle import safe_relative_path
from .cache import sha256_file
from .errors import TaskSetupError


def _inside(path: Path, root: Path) -> bool:
    real = path.resolve()
    return real == root or root in real.parents


def collect_outputs(workdir: str | os.PathLike, declared: list[str]) -> tuple[dict[str, Path], list[str]]:
    """Files to upload, keyed by their path relative to ``workdir``, and problems found.

    A declared file is itself; a declared folder is every file under it. A
    path outside the working directory (through ``..``, or a link) is skipped
    and reported, as is a declared path that does not exist.
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
        if not path.exists():
            problems.append(f"output {raw!r} was not produced")
        elif not _inside(path, root):
            problems.append(f"output {raw!r} leads outside the task directory: skipped")
        elif path.is_dir():
            _walk(path, root, files, problems)
        else:
            files[name] = path
    return files, problems


def _walk(folder: Path, root: Path, files: dict[str, Path], problems: list[str]) -> None:
    for dirpath, _, filenames in os.walk(folder):
        for filename in sorted(filenames):
            path = Path(dirpath) / filename
            key = path.relative_to(root).as_posix()
            if not path.is_file():
                continue
            if not _inside(path, root):
                problems.append(f"output {key!r} leads outside the task directory: skipped")
                continue
            files[key] = path


def upload_outputs(files: dict[str, Path], upload: Callable[[str, str], bool]) -> dict[str, str]:
    """Upload each file with ``upload(digest, path)`` (False: refused, not recorded).

    Returns {relative path: digest} of the uploaded files.
    """
    recorded = {}
    for key, path in sorted(files.items()):
        digest = sha256_file(path)
        if upload(digest, str(path)):
            recorded[key] = digest
    return recorded
