"""agent/artifacts/checkpoint.py against the fake control plane: a snapshot sends only what the control plane lacks,
hashes an unchanged file once, is consistent for a file replaced by a rename meanwhile, and a restore
places each file with its mode and remembers its digest (docs/training.md)."""

import hashlib
import os

import pytest

from agent.artifacts import checkpoint
from agent.artifacts.cache import ArtifactCache
from agent.artifacts.checkpoint import Checkpointer, DigestMemo
from agent.link.transport import Transport
from gpulayer.protocol.assignment import CheckpointRef


@pytest.fixture
def transport(plane):
    found = Transport(plane.url)
    found.set_token("session")
    yield found
    found.close()


@pytest.fixture
def hashed(monkeypatch):
    """The files hashed, by name (the digest memo's misses)."""
    seen: list[str] = []
    real = checkpoint.sha256_handle

    def counting(handle):
        seen.append(os.path.basename(os.readlink(f"/proc/self/fd/{handle.fileno()}")))
        return real(handle)

    monkeypatch.setattr(checkpoint, "sha256_handle", counting)
    return seen


def folder(tmp_path, files: dict[str, bytes]):
    root = tmp_path / "ckpt"
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def test_unchanged_files_are_neither_hashed_nor_sent_again(plane, transport, tmp_path, hashed):
    root = folder(tmp_path, {"model.pt": b"m" * 100_000, "optim/state.pt": b"o" * 50_000, "step": b"1"})
    keeper = Checkpointer(root, transport, None, DigestMemo(), lambda _t: None)  # type: ignore[arg-type]
    manifest, sent = keeper.snapshot()
    assert [e["path"] for e in manifest] == ["model.pt", "optim/state.pt", "step"] and sent == 150_001
    assert plane.put_bytes == 150_001 and sorted(hashed) == ["model.pt", "state.pt", "step"]
    keeper.last = manifest
    assert keeper.snapshot() is None  # nothing changed: nothing to record, nothing hashed or sent
    assert plane.put_bytes == 150_001 and len(hashed) == 3
    tmp = root / "step.tmp"
    tmp.write_bytes(b"2")
    os.replace(tmp, root / "step")  # as a training script saves: a new file renamed into place
    manifest2, sent2 = keeper.snapshot()
    assert sent2 == 1 and plane.put_bytes == 150_002 and hashed[3:] == ["step"]
    assert [e["digest"] for e in manifest2][:2] == [e["digest"] for e in manifest][:2]


def test_a_snapshot_sends_a_file_as_it_was_when_opened(plane, transport, tmp_path, monkeypatch):
    root = folder(tmp_path, {"a": b"first", "b": b"old b"})
    keeper = Checkpointer(root, transport, None, DigestMemo(), lambda _t: None)  # type: ignore[arg-type]
    real_send = keeper._send

    def replacing(relative, path, handle):  # the task replaces `b` by a rename while `a` is sent
        if relative == "a":
            (root / "b.tmp").write_bytes(b"NEW B, after the snapshot began")
            os.replace(root / "b.tmp", root / "b")
        return real_send(relative, path, handle)

    monkeypatch.setattr(checkpoint, "UPLOADS_AT_ONCE", 1)
    monkeypatch.setattr(keeper, "_send", replacing)
    manifest, _ = keeper.snapshot()
    got = {e["path"]: e["digest"] for e in manifest}
    assert got["b"] == "sha256:" + hashlib.sha256(b"old b").hexdigest()
    assert plane.artifacts[got["b"]] == b"old b"


def test_a_restore_places_each_file_with_its_mode_and_knows_its_digest(plane, transport, tmp_path, hashed):
    files = {"model.pt": (b"weights", 0o600), "sub/notes.txt": (b"notes", 0o644)}
    entries = [{"path": p, "digest": plane.put_artifact(d), "size": len(d), "mode": m} for p, (d, m) in files.items()]
    cache = ArtifactCache(tmp_path / "cache", 1 << 20, transport.download_artifact)
    memo = DigestMemo()
    keeper = Checkpointer(tmp_path / "restored", transport, cache, memo, lambda _t: None)
    assert keeper.prepare(CheckpointRef(id=7, attempt=2, files=entries)) == 2
    for path, (data, mode) in files.items():
        target = tmp_path / "restored" / path
        assert target.read_bytes() == data and (target.stat().st_mode & 0o777) == mode
    assert keeper.snapshot() is None and hashed == []  # restored as it was: unchanged, nothing hashed
    assert Checkpointer(tmp_path / "empty", transport, cache, memo, lambda _t: None).prepare(None) is None
    assert (tmp_path / "empty").is_dir()


@pytest.mark.parametrize("path", ["../escape", "/abs", "a/../../b"])
def test_a_manifest_path_outside_the_folder_is_refused(plane, transport, tmp_path, path):
    from agent.errors import TaskSetupError

    cache = ArtifactCache(tmp_path / "cache", 1 << 20, transport.download_artifact)
    entry = {"path": path, "digest": plane.put_artifact(b"x"), "size": 1, "mode": 0o644}
    keeper = Checkpointer(tmp_path / "restored", transport, cache, DigestMemo(), lambda _t: None)
    with pytest.raises(TaskSetupError):
        keeper.prepare(CheckpointRef(id=1, attempt=1, files=[entry]))
    assert not (tmp_path / "escape").exists()


def test_a_restore_copies_what_the_cache_has_and_fetches_the_rest_without_keeping_it(plane, transport, tmp_path):
    files = {"a.pt": b"a" * 5000, "b.pt": b"b" * 7000}
    entries = [{"path": p, "digest": plane.put_artifact(d), "size": len(d), "mode": 0o644} for p, d in files.items()]
    fetched: list[str] = []

    def fetch(digest, out):
        fetched.append(digest)
        transport.download_artifact(digest, out)

    cache = ArtifactCache(tmp_path / "cache", 1 << 20, fetch)
    cache.get(entries[0]["digest"])  # a.pt's bytes are on this worker already
    keeper = Checkpointer(tmp_path / "restored", transport, cache, DigestMemo(), lambda _t: None)
    assert keeper.prepare(CheckpointRef(id=3, attempt=1, files=entries)) == 1
    assert {p: (tmp_path / "restored" / p).read_bytes() for p in files} == files
    assert fetched == [entries[0]["digest"], entries[1]["digest"]]  # a.pt once, into the cache; b.pt once
    assert sorted(os.listdir(tmp_path / "cache")) == [entries[0]["digest"].split(":")[1]]  # b.pt not kept


def test_a_restored_file_whose_bytes_do_not_match_fails_the_setup_and_leaves_nothing(plane, transport, tmp_path):
    from agent.errors import TaskSetupError

    entry = {"path": "state.pt", "digest": "sha256:" + hashlib.sha256(b"expected").hexdigest(), "size": 8, "mode": 0o644}
    cache = ArtifactCache(tmp_path / "cache", 1 << 20, lambda d, out: out.write(b"tampered"))
    keeper = Checkpointer(tmp_path / "restored", transport, cache, DigestMemo(), lambda _t: None)
    with pytest.raises(TaskSetupError, match="could not be restored"):
        keeper.prepare(CheckpointRef(id=4, attempt=1, files=[entry]))
    assert os.listdir(tmp_path / "restored") == [] and os.listdir(tmp_path / "cache") == []
