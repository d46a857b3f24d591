"""bundle.pack: in a checkout, what git tracks or does not ignore; the same bytes for the same files."""
import hashlib
import os
import shutil
import subprocess
import tarfile

import pytest

from gpulayer.client import bundle
from gpulayer.client.errors import ClientError

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})


def _names(archive):
    with tarfile.open(archive) as tar:
        return sorted(tar.getnames())


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def checkout(tmp_path):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "train.py").write_text("print('hi')\n")
    (repo / "pkg" / "model.py").write_text("X = 1\n")
    (repo / "run.sh").write_text("#!/bin/sh\necho run\n")
    (repo / "run.sh").chmod(0o755)
    (repo / ".gitignore").write_text("*.ckpt\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "init")
    (repo / "untracked.txt").write_text("not mine\n")
    (repo / "big.ckpt").write_text("ignored\n")
    return repo


@needs_git
def test_git_checkout_packs_tracked_and_untracked_files_not_ignored(checkout, tmp_path):
    """Issue 36 item 21: an untracked train.py was left out without a word (`unpacked: 0 entries`)."""
    archive = tmp_path / "s.tar.gz"
    names = bundle.pack(checkout, archive)
    assert names == [".gitignore", "pkg/model.py", "run.sh", "train.py", "untracked.txt"]  # not big.ckpt
    assert _names(archive) == names


@needs_git
def test_a_fresh_checkout_with_nothing_committed_packs_its_files(tmp_path):
    repo = tmp_path / "fresh"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "train.py").write_text("print('hi')\n")
    assert bundle.pack(repo, tmp_path / "f.tar.gz") == ["train.py"]


@needs_git
def test_a_file_the_command_names_that_git_ignores_is_told(checkout, tmp_path):
    names = bundle.pack(checkout, tmp_path / "s.tar.gz")
    command = ["python", "train.py", "--resume", "big.ckpt", "./big.ckpt", "/etc/hosts", "missing.py"]
    assert bundle.named_but_left_out(checkout, names, command) == ["big.ckpt", "./big.ckpt"]


@needs_git
def test_subdirectory_of_a_checkout_is_packed_relative_to_itself(checkout, tmp_path):
    (checkout / "pkg" / "scratch.py").write_text("untracked\n")
    assert bundle.pack(checkout / "pkg", tmp_path / "p.tar.gz") == ["model.py", "scratch.py"]


@needs_git
def test_deleted_tracked_file_is_skipped(checkout, tmp_path):
    (checkout / "train.py").unlink()
    assert "train.py" not in bundle.pack(checkout, tmp_path / "s.tar.gz")


@needs_git
def test_same_files_give_the_same_bytes(checkout, tmp_path):
    first, second = tmp_path / "a.tar.gz", tmp_path / "b.tar.gz"
    bundle.pack(checkout, first)
    os.utime(checkout / "train.py", (1, 1))
    bundle.pack(checkout, second)
    assert _sha(first) == _sha(second)
    (checkout / "train.py").write_text("print('changed')\n")
    bundle.pack(checkout, second)
    assert _sha(first) != _sha(second)


@needs_git
def test_modes_and_owners_are_normalised(checkout, tmp_path):
    archive = tmp_path / "s.tar.gz"
    bundle.pack(checkout, archive)
    with tarfile.open(archive) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["run.sh"].mode == 0o755 and members["train.py"].mode == 0o644
    assert all(m.mtime == 0 and m.uid == 0 and m.uname == "" for m in members.values())


def test_plain_directory_packs_everything_but_dot_git(tmp_path):
    src = tmp_path / "src"
    (src / "a" / "b").mkdir(parents=True)
    (src / "a" / "b" / "c.txt").write_text("c")
    (src / "top.txt").write_text("t")
    (src / "link").symlink_to("top.txt")
    archive = tmp_path / "s.tar.gz"
    # not a checkout: make sure no enclosing repo is found by pointing git elsewhere
    os.environ["GIT_CEILING_DIRECTORIES"] = str(tmp_path)
    try:
        assert bundle.pack(src, archive) == ["a/b/c.txt", "link", "top.txt"]
    finally:
        del os.environ["GIT_CEILING_DIRECTORIES"]
    with tarfile.open(archive) as tar:
        assert tar.getmember("link").issym() and tar.getmember("link").linkname == "top.txt"


def test_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(ClientError, match="not a directory"):
        bundle.pack(tmp_path / "nope", tmp_path / "x.tar.gz")
