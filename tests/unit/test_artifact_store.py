"""ArtifactStore.put keeps an upload's bytes out of the page cache: sent to disk behind the writer and
dropped, so a big upload does not push the state file's pages out (fincore counts what is resident)."""
import hashlib
import io
import os
import shutil
import subprocess

import pytest

from gpulayer.server.store.artifacts import CHUNK, WRITE_BEHIND, ArtifactStore

pytestmark = pytest.mark.skipif(shutil.which("fincore") is None, reason="needs util-linux's fincore")


def _resident(path) -> int:
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
                         capture_output=True, text=True, check=True).stdout
    return int(out.strip() or 0)


class _Watched(io.RawIOBase):
    """`size` random bytes, read in CHUNKs; notes the upload's resident bytes as it goes."""

    def __init__(self, size: int, tmp_dir):
        self.left, self.tmp_dir, self.seen, self.hasher = size, tmp_dir, [], hashlib.sha256()

    def read(self, n=-1):
        for name in os.listdir(self.tmp_dir):
            self.seen.append(_resident(self.tmp_dir / name))
        chunk = os.urandom(min(n, self.left, CHUNK))
        self.left -= len(chunk)
        self.hasher.update(chunk)
        return chunk


def test_an_upload_leaves_at_most_two_windows_of_itself_in_the_page_cache_and_none_once_stored(tmp_path):
    store = ArtifactStore(tmp_path / "artifacts")
    size = 6 * WRITE_BEHIND + 12345
    # The digest is known only once the bytes are made: hash them first, then put the same bytes again.
    body = _Watched(size, store.root / "tmp")
    data = b"".join(iter(lambda: body.read(CHUNK), b""))
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    watched = _Watched(0, store.root / "tmp")
    stream = io.BytesIO(data)

    class Reader:
        def read(self, n):
            watched.read(0)
            return stream.read(n)

    assert store.put(digest, Reader(), len(data)) == size
    assert max(watched.seen) <= 2 * WRITE_BEHIND + 2 * CHUNK, watched.seen  # never the whole upload
    assert max(watched.seen) > 0  # the bytes did go through the cache
    assert _resident(store.path(digest)) == 0
    with open(store.path(digest), "rb") as stored:
        assert hashlib.sha256(stored.read()).hexdigest() == digest.split(":")[1]
