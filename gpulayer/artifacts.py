"""Content-addressed artifact store under $GPULAYER_HOME/artifacts.

Bytes stream through: PUT writes to a temporary file while hashing SHA-256 and
renames it into place only when the digest matches; GET streams the file.
Memory use does not grow with an artifact's size.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator

from .errors import BodyTooLarge, DigestMismatch, InvalidRequest
from .spec import DIGEST

CHUNK = 1024 * 1024
MAX_ARTIFACT_BYTES = 1 << 40


def check_digest(digest: str) -> str:
    """Refuse anything but `sha256:<64 lowercase hex>` (no path characters reach the filesystem)."""
    if not isinstance(digest, str) or not DIGEST.match(digest):
        raise InvalidRequest("artifact digest must be written sha256:<64 lowercase hex digits>", code="invalid_digest")
    return digest


class ArtifactStore:
    """Files named by digest: root/sha256/<2 hex>/<62 hex>."""

    def __init__(self, root: Path, *, max_bytes: int = MAX_ARTIFACT_BYTES):
        self.root = Path(root)
        self.max_bytes = max_bytes
        (self.root / "tmp").mkdir(parents=True, exist_ok=True)

    def path(self, digest: str) -> Path:
        hexd = check_digest(digest).split(":", 1)[1]
        return self.root / "sha256" / hexd[:2] / hexd[2:]

    def exists(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def size(self, digest: str) -> int:
        return self.path(digest).stat().st_size

    def put(self, digest: str, stream: BinaryIO, length: int | None = None) -> int:
        """Store the bytes read from `stream` under `digest`; returns their size.

        Raises DigestMismatch (nothing stored) when the bytes hash to something else,
        BodyTooLarge past the store's limit.
        """
        target = self.path(digest)
        if length is not None and length > self.max_bytes:
            raise BodyTooLarge(f"artifact of {length} bytes is over the limit of {self.max_bytes}")
        hasher = hashlib.sha256()
        size = 0
        fd, tmp = tempfile.mkstemp(dir=self.root / "tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                while chunk := stream.read(CHUNK):
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise BodyTooLarge(f"artifact is over the limit of {self.max_bytes} bytes")
                    hasher.update(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            if length is not None and size != length:
                raise InvalidRequest(f"body ended after {size} of {length} bytes", code="incomplete_body")
            actual = "sha256:" + hasher.hexdigest()
            if actual != digest:
                raise DigestMismatch(f"the bytes hash to {actual}, not {digest}; nothing was stored")
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, target)
            tmp = None
            return size
        finally:
            if tmp is not None:
                os.unlink(tmp)

    def open(self, digest: str) -> BinaryIO:
        """The stored file, opened for reading (FileNotFoundError when absent)."""
        return open(self.path(digest), "rb")

    def delete(self, digest: str) -> int:
        """Remove one artifact's bytes; returns the bytes freed (0 when it was not there)."""
        path = self.path(digest)
        try:
            size = path.stat().st_size
            path.unlink()
            return size
        except FileNotFoundError:
            return 0

    def iter_digests(self) -> Iterator[str]:
        """Every digest whose bytes are on disk."""
        base = self.root / "sha256"
        if not base.exists():
            return
        for sub in base.iterdir():
            for f in sub.iterdir():
                yield f"sha256:{sub.name}{f.name}"

    def total_bytes(self) -> int:
        return sum(self.size(d) for d in self.iter_digests())
