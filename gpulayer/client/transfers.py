"""Artifact transfers for the client: uploads by digest, verified downloads, progress bars.

Artifacts are content-addressed (`sha256:<hex>`): an upload first asks
`HEAD /v1/artifacts/{digest}` and sends nothing when the server has it.
Transfers over PROGRESS_MIN_BYTES show a progress bar on stderr when stderr
is a terminal.
"""
from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Protocol

from gpulayer.client.bundle import named_but_left_out, pack, unreadable, walk_files
from gpulayer.client.errors import BadInput, ClientError
from gpulayer.client.images import looks_like_path, prepare_image


class Client(Protocol):
    """What transfers need of a client: its HTTP request, nothing more (gpulayer.client.api.Client, which
    imports this module; transfers never call back into the rest of it)."""

    def request(self, method: str, path: str, **kwargs: Any) -> Any: ...


CHUNK = 1024 * 1024
PROGRESS_MIN_BYTES = 4 * 1024 * 1024
TRANSFER_TIMEOUT_S = 600.0


def file_digest(path: Path) -> str:
    """`sha256:<hex>` of a file, read in chunks."""
    sha = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            sha.update(chunk)
    return f"sha256:{sha.hexdigest()}"


class Progress:
    """A one-line progress bar on stderr, redrawn at most 10 times a second."""

    def __init__(self, label: str, total: int, enabled: bool | None = None):
        if enabled is None:
            enabled = total > PROGRESS_MIN_BYTES and sys.stderr.isatty()
        self.label, self.total, self.enabled = label, total, enabled
        self.done, self._drawn_at = 0, 0.0

    def advance(self, n: int) -> None:
        """Count `n` more bytes; redraw when due."""
        self.done += n
        now = time.monotonic()
        if self.enabled and (now - self._drawn_at > 0.1 or self.done >= self.total):
            self._drawn_at = now
            frac = self.done / self.total if self.total else 1.0
            bar = "#" * int(frac * 30)
            sys.stderr.write(f"\r{self.label} [{bar:<30}] {self.done / 1e6:.1f}/{self.total / 1e6:.1f} MB {frac:4.0%}")
            sys.stderr.flush()

    def close(self) -> None:
        """End the bar's line."""
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


class _ProgressReader:
    """A file wrapper with a length, so requests streams it with Content-Length."""

    def __init__(self, fh: BinaryIO, size: int, progress: Progress):
        self.fh, self.size, self.progress = fh, size, progress

    def __len__(self) -> int:
        return self.size

    def read(self, n: int = -1) -> bytes:
        data = self.fh.read(CHUNK if n is None or n < 0 else n)
        self.progress.advance(len(data))
        return data


def has_artifact(client: Client, digest: str) -> bool:
    """HEAD /v1/artifacts/{digest}: True when the server holds it."""
    return client.request("HEAD", f"/artifacts/{digest}", ok=(200, 404)).status_code == 200


def upload_file(client: Client, path: Path, progress: bool | None = None) -> str:
    """Upload `path` unless the server already has its digest; return the digest."""
    if not path.is_file():
        raise ClientError(f"cannot upload {path}: not a readable file")
    digest = file_digest(path)
    if has_artifact(client, digest):
        return digest
    size = path.stat().st_size
    bar = Progress(f"upload {path.name}", size, progress)
    with open(path, "rb") as fh:
        client.request("PUT", f"/artifacts/{digest}", data=_ProgressReader(fh, size, bar),
                       headers={"Content-Type": "application/octet-stream"}, timeout=TRANSFER_TIMEOUT_S)
    bar.close()
    return digest


def download_artifact(client: Client, digest: str, dest: Path, progress: bool | None = None) -> Path:
    """Stream an artifact into `dest` (atomically), checking its SHA-256 against `digest`."""
    response = client.request("GET", f"/artifacts/{digest}", stream=True, timeout=TRANSFER_TIMEOUT_S)
    dest.parent.mkdir(parents=True, exist_ok=True)
    bar = Progress(f"download {dest.name}", int(response.headers.get("Content-Length") or 0), progress)
    sha = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    try:
        with os.fdopen(fd, "wb") as out, response:
            for chunk in response.iter_content(CHUNK):
                sha.update(chunk)
                out.write(chunk)
                bar.advance(len(chunk))
        bar.close()
        if f"sha256:{sha.hexdigest()}" != digest:
            raise ClientError(f"downloaded bytes of {dest.name} do not match {digest}")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest


def download_outputs(client: Client, outputs: dict[str, str], dest: Path,
                     progress: bool | None = None) -> list[Path]:
    """Download {relative path: digest} under `dest`; refuse paths that leave it."""
    written = []
    for rel, digest in sorted(outputs.items()):
        target = safe_join(dest, rel)
        written.append(download_artifact(client, digest, target, progress))
    return written


def safe_join(root: Path, rel: str) -> Path:
    """`root / rel`, refusing absolute paths and `..` (ClientError)."""
    parts = PurePosixPath(rel).parts
    if not parts or PurePosixPath(rel).is_absolute() or ".." in parts:
        raise ClientError(f"refusing the output path {rel!r}: it leads outside {root}")
    return root.joinpath(*parts)


def remote_path(local: str) -> str:
    """Where a local input lands on the worker: its relative path, else its file name."""
    pure = PurePosixPath(Path(local).as_posix())
    if pure.is_absolute() or ".." in pure.parts:
        return pure.name
    return pure.as_posix().removeprefix("./")


def check_local_paths(spec: dict) -> None:
    """Raise BadInput, before anything is uploaded, for a local source, input or weights path that is
    missing or of the wrong kind (a digest is the server's to check)."""
    def check(label: str, value, folder_only: bool = False) -> None:
        if not value or _is_digest(value):
            return
        path = Path(value)
        if not path.exists():
            raise BadInput(f"{label} {value}: does not exist")
        if folder_only and not path.is_dir():
            raise BadInput(f"{label} {value}: is not a directory")
    check("--source", spec.get("source"), folder_only=True)
    for value in (spec.get("inputs") or {}).values():
        check("--input", value)
    check("--weights", (spec.get("service") or {}).get("weights"))
    image = spec.get("image")
    if isinstance(image, str) and looks_like_path(image):
        check("--image", image)


def prepare_spec(client: Client, spec: dict) -> dict:
    """A copy of `spec` with local paths in source, inputs, weights and image uploaded as digests.

    Raises BadInput before anything is uploaded when a local path is missing (check_local_paths), or
    when a folder or file under the source, an input or the weights cannot be read: the source is packed
    and every input file opened first, then they are uploaded.
    """
    check_local_paths(spec)
    spec = dict(spec)
    source = spec.get("source")
    service = spec.get("service") or {}
    weights = service.get("weights")
    with tempfile.TemporaryDirectory(prefix="gpulayer-bundle-") as tmp:
        archive = None
        if source and not _is_digest(source):
            archive = Path(tmp) / "source.tar.gz"
            _check_named(Path(source), pack(Path(source), archive), spec.get("command") or [])
        inputs = input_files(spec["inputs"]) if spec.get("inputs") else None
        if weights and not _is_digest(weights):
            _check_readable("--weights", Path(weights))
        if isinstance(spec.get("image"), str):  # read and checked whole, then its missing blobs uploaded
            spec["image"] = prepare_image(client, spec["image"], upload_file, has_artifact)
        # Everything local was read: now upload.
        if archive is not None:
            spec["source"] = upload_file(client, archive)
        if inputs is not None:
            spec["inputs"] = {remote: value if isinstance(value, str) else upload_file(client, value)
                              for remote, value in inputs.items()}
        if weights and not _is_digest(weights):
            spec["service"] = {**service, "weights": upload_file(client, Path(weights))}
    return spec


def _check_named(source: Path, packed: list[str], command: list[str]) -> None:
    """BadInput when the command names a file of the source that the bundle left out (git ignores it):
    the job would fail on the worker with `can't open file`, after an upload that could not help."""
    missing = named_but_left_out(source, packed, command)
    if missing:
        raise BadInput(f"--source: {', '.join(missing)} (named by the command) would not be sent: "
                       f"{'it is' if len(missing) == 1 else 'they are'} ignored by git in {source} "
                       f"(.gitignore; the bundle holds {len(packed)} file{'' if len(packed) == 1 else 's'}), "
                       "so the task could not open it. Remove it from .gitignore, pass it with --input, "
                       "or use a folder outside the checkout (nothing was sent)")


def input_files(inputs: dict[str, str]) -> dict[str, str | Path]:
    """{remote path: digest or local path} as {remote path: digest, or a local file}: a folder becomes
    its files, each under the folder's remote path (symlinked folders not followed).

    Raises BadInput naming a folder or file that cannot be read, ClientError for what is neither a
    digest nor a local file or folder.
    """
    out: dict[str, str | Path] = {}
    for key, value in inputs.items():
        if _is_digest(value):
            out[key] = value
            continue
        local = Path(value)
        remote = remote_path(key) if key == value else key
        if local.is_dir():
            for name in sorted(walk_files(local, "--input")):
                try:
                    regular = (local / name).is_file()  # a broken symlink, a FIFO: left out, as before
                except OSError as exc:                  # a symlink into a folder that may not be searched
                    raise unreadable("--input", local / name, exc) from None
                if regular:
                    out[f"{remote.rstrip('/')}/{name}"] = _check_readable("--input", local / name)
        elif local.is_file():
            out[remote] = _check_readable("--input", local)
        else:
            raise ClientError(f"input {value!r} is neither a digest nor a local file or folder")
    return out


def _check_readable(option: str, path: Path) -> Path:
    """`path`, once opened for reading (BadInput naming it when it cannot be)."""
    try:
        with open(path, "rb"):
            return path
    except OSError as exc:
        raise unreadable(option, path, exc) from None


def _is_digest(value: str) -> bool:
    return isinstance(value, str) and value.startswith("sha256:")
