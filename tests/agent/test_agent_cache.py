"""The artifact cache: digest verification, size limit, LRU eviction."""

import hashlib
import os

import pytest

from agent.artifacts.cache import ArtifactCache, digest_hex, sha256_file
from agent.errors import DigestMismatch, TaskSetupError


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Store:
    """A fake artifact source that counts fetches."""

    def __init__(self, blobs):
        self.blobs = {digest_of(b): b for b in blobs}
        self.fetches = []

    def fetch(self, digest, out):
        self.fetches.append(digest)
        out.write(self.blobs[digest])


def test_download_verified_and_cached(tmp_path):
    store = Store([b"a" * 10])
    cache = ArtifactCache(tmp_path, 100, store.fetch)
    digest = digest_of(b"a" * 10)
    path = cache.get(digest)
    assert path.read_bytes() == b"a" * 10
    assert cache.get(digest) == path
    assert store.fetches == [digest]
    assert sha256_file(path) == digest
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp")]


def test_wrong_bytes_rejected_and_not_kept(tmp_path):
    digest = digest_of(b"expected")
    cache = ArtifactCache(tmp_path, 100, lambda d, out: out.write(b"tampered"))
    with pytest.raises(DigestMismatch, match="failed verification"):
        cache.get(digest)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("bad", ["sha256:xyz", "md5:" + "0" * 32, "sha256:" + "A" * 64, "../../etc/passwd"])
def test_malformed_digest(bad, tmp_path):
    with pytest.raises(TaskSetupError):
        ArtifactCache(tmp_path, 100, lambda d, o: None).get(bad)
    with pytest.raises(TaskSetupError):
        digest_hex(bad)


def test_least_recently_used_evicted_first(tmp_path):
    blobs = [bytes([i]) * 40 for i in range(3)]
    store = Store(blobs)
    cache = ArtifactCache(tmp_path, 100, store.fetch)
    first, second, third = (digest_of(b) for b in blobs)
    cache.get(first)
    cache.get(second)
    # make "first" the most recently used, "second" the oldest
    os.utime(cache.root / digest_hex(second), (1000, 1000))
    os.utime(cache.root / digest_hex(first), (2000, 2000))
    cache.get(first)  # a hit refreshes it to now
    cache.get(third)  # 120 bytes > 100: the least recently used goes
    names = set(os.listdir(tmp_path))
    assert names == {digest_hex(first), digest_hex(third)}


def test_an_artifact_larger_than_the_limit_is_still_served(tmp_path):
    blobs = [b"x" * 30, b"y" * 200]
    store = Store(blobs)
    cache = ArtifactCache(tmp_path, 100, store.fetch)
    cache.get(digest_of(blobs[0]))
    big = cache.get(digest_of(blobs[1]))
    assert big.exists()
    assert os.listdir(tmp_path) == [digest_hex(digest_of(blobs[1]))]


def test_a_download_past_its_cap_stops_and_keeps_nothing(tmp_path):
    from agent.artifacts.caps import UnpackLimit

    written = []

    def endless(digest, out):  # a server that sends more than the cap, in 1 KiB chunks
        for _ in range(1000):
            out.write(b"z" * 1024)
            written.append(1024)

    with pytest.raises(UnpackLimit, match="larger than 4096 bytes"):
        ArtifactCache(tmp_path, 10**9, endless).get(digest_of(b"anything"), max_bytes=4096)
    assert sum(written) == 4096 and os.listdir(tmp_path) == []


def test_a_download_is_hashed_as_written_even_when_started_again(tmp_path, monkeypatch):
    import agent.artifacts.cache as cache_module

    data = bytes(range(256)) * 4096
    digest = digest_of(data)

    def retrying(d, out):  # as Transport.download_artifact after a dropped connection: from 0 again
        out.write(data[:1000])
        out.seek(0)
        out.truncate()
        out.write(data[:500_000])
        out.write(data[500_000:])

    read_again = []
    monkeypatch.setattr(cache_module, "sha256_file", lambda path: read_again.append(path) or sha256_file(path))
    assert ArtifactCache(tmp_path / "a", 1 << 30, retrying).get(digest).read_bytes() == data
    assert read_again == []  # hashed as it was written: not read back

    def out_of_order(d, out):  # a fetcher that writes the end first: hashed from disk instead
        out.seek(500_000)
        out.write(data[500_000:])
        out.seek(1)
        out.write(data[1:500_000])
        out.seek(0)  # back to 0 with bytes after it and no truncate: not a fresh start
        out.write(data[:1])

    assert ArtifactCache(tmp_path / "b", 1 << 30, out_of_order).get(digest).read_bytes() == data
    assert len(read_again) == 1


def test_fetch_into_verifies_and_keeps_nothing_in_the_cache(tmp_path):
    store = Store([b"checkpoint bytes"])
    cache = ArtifactCache(tmp_path / "cache", 100, store.fetch)
    digest = digest_of(b"checkpoint bytes")
    cache.fetch_into(digest, tmp_path / "placed")
    assert (tmp_path / "placed").read_bytes() == b"checkpoint bytes"
    assert os.listdir(tmp_path / "cache") == [] and cache.cached(digest) is None
    cache.get(digest)
    assert cache.cached(digest) == tmp_path / "cache" / digest_hex(digest)
    bad = ArtifactCache(tmp_path / "cache2", 100, lambda d, out: out.write(b"tampered"))
    with pytest.raises(DigestMismatch):
        bad.fetch_into(digest_of(b"expected"), tmp_path / "wrong")
    assert not (tmp_path / "wrong").exists()
