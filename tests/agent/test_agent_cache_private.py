"""The artifact cache is the agent's own and is verified at use (issue 36, item 8): a folder another local user
made first (a real one: `nobody`), or that others may write, or under a folder others may change, is refused
with what to do; a cached file changed behind the agent's back is hashed again and fetched again."""

import hashlib
import os
import subprocess

import pytest
from unprivileged import as_nobody, shared_temp_folder

from agent.artifacts.cache import ArtifactCache
from agent.artifacts.private_folder import NotPrivate


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture
def shared_tmp():
    with shared_temp_folder() as folder:
        yield folder


def fetches(blobs: dict[str, bytes]):
    done: list[str] = []

    def fetch(digest, out):
        done.append(digest)
        out.write(blobs[digest])

    return fetch, done


def test_a_new_cache_is_made_0700_and_an_older_agents_0755_one_is_tightened(tmp_path):
    cache = ArtifactCache(tmp_path / "new" / "cache", 100, fetches({})[0])
    assert (os.stat(cache.root).st_mode & 0o7777) == 0o700
    older = tmp_path / "older"
    older.mkdir(mode=0o755)
    os.chmod(older, 0o755)
    ArtifactCache(older, 100, fetches({})[0])
    assert (os.stat(older).st_mode & 0o7777) == 0o700


def test_a_cache_folder_another_user_made_first_is_refused(shared_tmp):
    squatted = os.path.join(shared_tmp, "gpulayer-artifacts")
    subprocess.run([*as_nobody(), "mkdir", "-m", "777", squatted], check=True)
    with pytest.raises(NotPrivate) as refused:
        ArtifactCache(squatted, 100, fetches({})[0])
    assert str(refused.value) == (
        f"the artifact cache {squatted} belongs to nobody (uid 65534), not to this agent's user root (uid 0): that "
        "user may have made it first to swap what jobs run; remove it, or set GPULAYER_ARTIFACT_CACHE to a folder "
        "of the agent's own")
    assert refused.value.exit_code == 2
    assert os.listdir(squatted) == []  # nothing written there


def test_a_cache_under_another_users_folder_or_a_writable_one_is_refused(shared_tmp, tmp_path):
    theirs = os.path.join(shared_tmp, "theirs")
    subprocess.run([*as_nobody(), "mkdir", "-m", "755", theirs], check=True)
    with pytest.raises(NotPrivate, match=r"lies in .*/theirs, which belongs to nobody \(uid 65534\)"):
        ArtifactCache(os.path.join(theirs, "cache"), 100, fetches({})[0])
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    os.chmod(open_to_all, 0o777)
    with pytest.raises(NotPrivate, match=r"which others may write to \(mode 0777, not sticky\)"):
        ArtifactCache(open_to_all / "cache", 100, fetches({})[0])
    writable = tmp_path / "writable"
    writable.mkdir()
    os.chmod(writable, 0o775)
    with pytest.raises(NotPrivate, match=r"may be written by others \(mode 0775\)"):
        ArtifactCache(writable, 100, fetches({})[0])
    (tmp_path / "link").symlink_to(tmp_path / "new-target", target_is_directory=True)
    with pytest.raises(NotPrivate, match="is not a folder but a symbolic link"):
        ArtifactCache(tmp_path / "link", 100, fetches({})[0])


def test_a_cached_file_changed_behind_the_agents_back_is_hashed_and_fetched_again(tmp_path):
    data = b"#!/bin/sh\necho benign\n"
    digest = digest_of(data)
    fetch, done = fetches({digest: data})
    cache = ArtifactCache(tmp_path / "cache", 1 << 20, fetch)
    path = cache.get(digest)
    assert cache.get(digest) == path and done == [digest]  # unchanged: neither fetched nor hashed again
    os.chmod(path, 0o644)
    path.write_bytes(b"#!/bin/sh\necho EVIL\n")  # in place: the same inode
    assert cache.get(digest).read_bytes() == data and done == [digest, digest]
    os.unlink(path)
    path.write_bytes(data.replace(b"benign", b"BENIGN"))  # another file, the same size
    assert cache.cached(digest) is None and not path.exists()
    assert cache.get(digest).read_bytes() == data


def test_a_file_the_agent_has_not_verified_is_hashed_before_it_is_used(tmp_path):
    """Cached before this agent started (or by another agent sharing the cache): hashed once, then trusted."""
    data = b"weights" * 1000
    digest = digest_of(data)
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    (root / digest.split(":")[1]).write_bytes(data)
    fetch, done = fetches({digest: data})
    cache = ArtifactCache(root, 1 << 20, fetch)
    assert cache.get(digest).read_bytes() == data and done == []
    wrong = digest_of(b"other")
    (root / wrong.split(":")[1]).write_bytes(b"not other")
    linked = digest_of(b"linked")
    outside = tmp_path / "outside"
    outside.write_bytes(b"linked")
    (root / linked.split(":")[1]).symlink_to(outside)  # never read through, even with the right bytes
    fetch2, done2 = fetches({wrong: b"other", linked: b"linked"})
    cache = ArtifactCache(root, 1 << 20, fetch2)
    assert cache.get(wrong).read_bytes() == b"other" and done2 == [wrong]
    assert not cache.get(linked).is_symlink() and done2 == [wrong, linked] and outside.exists()
