"""Archives that are small on the wire and huge unpacked: gzip bombs of zeros (issue 22 item 11)."""
from __future__ import annotations

import io
import tarfile


class Zeros:
    """`size` zero bytes, read in chunks (never held whole)."""

    def __init__(self, size: int):
        self.left = size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        self.left -= n
        return b"\0" * n


def tar_gz_of_zeros(members: list[tuple[str, int]]) -> bytes:
    """A tar.gz of files of zeros, (name, size) each: about 1,000 times smaller than what it unpacks to."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, size in members:
            info = tarfile.TarInfo(name)
            info.size = size
            archive.addfile(info, Zeros(size))
    return buffer.getvalue()
