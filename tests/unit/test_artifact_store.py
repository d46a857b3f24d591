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


class _Watched:
    """A body read in CHUNKs that notes, before each read, how much of the upload in progress is cached."""

    def __init__(self, data: bytes, tmp_dir):
        self.stream, self.tmp_dir, self.seen = io.BytesIO(data), tmp_dir, []

    def read(self, n: int) -> bytes:
        self.seen += [_resident(self.tmp_dir / name) for name in os.listdir(self.tmp_dir)]
        return self.stream.read(n)


def test_an_upload_leaves_at_most_two_windows_of_itself_in_the_page_cache_and_none_once_stored(tmp_path):
    store = ArtifactStore(tmp_path / "artifacts")
    data = os.urandom(6 * WRITE_BEHIND + 12345)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    body = _Watched(data, store.root / "tmp")
    assert store.put(digest, body, len(data)) == len(data)
    assert max(body.seen) <= 2 * WRITE_BEHIND + 2 * CHUNK, body.seen  # never the whole upload
    assert max(body.seen) > 0  # the bytes did go through the cache
    assert _resident(store.path(digest)) == 0
    with open(store.path(digest), "rb") as stored:
        assert stored.read() == data
