"""agent/artifacts/beneath.py: paths in a task's directory resolve beneath it through no link, with openat2 and with the
component-by-component fallback alike; a folder swapped for a link between a walk and an open (the attack of
issue 36, item 2, made deterministic here) is never followed, for checkpoints and outputs."""
from __future__ import annotations

import os
import time

import pytest

from agent.artifacts import beneath
from agent.artifacts.beneath import Beneath, LinkOnTheWay, NotRegularFile, open_beneath
from agent.artifacts.checkpoint import Checkpointer, DigestMemo
from agent.artifacts.outputs import collect_outputs, upload_outputs

SECRET = b"a host file the task must never get"


@pytest.fixture(params=["openat2", "components"])
def mode(request, monkeypatch):
    """Each test runs with openat2 and with the fallback (as on a kernel before 5.6, or under seccomp)."""
    if request.param == "components":
        monkeypatch.setattr(beneath._openat2, "works", False)
    else:
        with Beneath.at("/") as root:
            os.close(open_beneath(root.fd, "etc"))
        if beneath._openat2.works is not True:
            pytest.skip("this kernel has no openat2")
    return request.param


@pytest.fixture
def task(tmp_path):
    """A task directory with a folder `sub` holding `key`, and a host folder with a `key` of its own."""
    host = tmp_path / "host"
    host.mkdir()
    (host / "key").write_bytes(SECRET)
    workdir = tmp_path / "task"
    (workdir / "sub").mkdir(parents=True)
    (workdir / "sub" / "key").write_bytes(b"the task's own")
    return workdir, host


def swap_for_link(folder, target) -> None:
    """What the racer does, once: the folder becomes a link to ``target`` (the real one moves aside)."""
    os.rename(folder, folder.with_name(folder.name + "-aside"))
    folder.symlink_to(target)


def test_a_link_on_the_way_or_at_the_end_is_refused(mode, task):
    workdir, host = task
    (workdir / "up").symlink_to(host)
    (workdir / "sub" / "link").symlink_to(host / "key")
    with Beneath.at(workdir) as root:
        with root.open_regular("sub/key") as handle:
            assert handle.read() == b"the task's own"
        for path in ("up/key", "sub/link", "up", "../host/key"):
            with pytest.raises(NotRegularFile):
                root.open_regular(path)
        with pytest.raises(LinkOnTheWay):
            root.folder("up")
        with pytest.raises(LinkOnTheWay):
            root.lstat("up/key")
        assert root.lstat("up").st_mode & 0o170000 == 0o120000  # the link itself
    with pytest.raises(OSError):
        Beneath.at(workdir / "up")  # even the folder opened first is never a link


def test_a_walk_lists_regular_files_and_enters_no_linked_folder(mode, task):
    workdir, host = task
    (workdir / "up").symlink_to(host)
    os.mkfifo(workdir / "sub" / "fifo")
    (workdir / "sub" / "deeper" / "still").mkdir(parents=True)
    (workdir / "sub" / "deeper" / "still" / "f").write_text("x")
    with Beneath.at(workdir) as root:
        regular, others = root.files()
        assert regular == ["sub/deeper/still/f", "sub/key"]
        assert sorted(path for path, _ in others) == ["sub/fifo", "up"]
        started = time.monotonic()
        with pytest.raises(NotRegularFile):
            root.open_regular("sub/fifo")
        assert time.monotonic() - started < 1


def test_a_folder_swapped_after_the_walk_is_not_followed_by_a_checkpoint(mode, task, monkeypatch):
    workdir, host = task
    folder = workdir / ".gpulayer-checkpoint"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "key").write_bytes(b"own")
    (folder / "top").write_bytes(b"top")
    sent: dict[str, bytes] = {}

    class Transport:
        def retrying(self, _what, _call, digest):
            return False

        def artifact_exists(self, digest):
            return False

        def upload_artifact(self, digest, path, probe=True):
            with open(path, "rb") as handle:
                sent[digest] = handle.read()

    real_files = Beneath.files

    def listed_then_swapped(self, top=""):
        found = real_files(self, top)
        swap_for_link(folder / "sub", host)  # between the walk and the opens: the old code read host/key
        return found

    monkeypatch.setattr(Beneath, "files", listed_then_swapped)
    keeper = Checkpointer(folder, Transport(), None, DigestMemo(), lambda _t: None)  # type: ignore[arg-type]
    manifest, _ = keeper.snapshot()
    assert [entry["path"] for entry in manifest] == ["top"]
    assert SECRET not in b"".join(sent.values())


def test_a_checkpoint_folder_that_is_a_link_uploads_nothing(mode, task):
    workdir, host = task
    (workdir / ".gpulayer-checkpoint").symlink_to(host)
    notes: list[str] = []
    keeper = Checkpointer(workdir / ".gpulayer-checkpoint", None, None, DigestMemo(), notes.append)  # type: ignore[arg-type]
    assert keeper.snapshot() is None
    assert notes == ["checkpoint not uploaded: .gpulayer-checkpoint is not a folder (a symbolic link?)"]


def test_an_output_folder_swapped_after_collecting_is_not_followed(mode, task):
    workdir, host = task
    files, problems = collect_outputs(workdir, ["sub"])
    assert files == ["sub/key"] and problems == []
    swap_for_link(workdir / "sub", host)
    notes: list[str] = []
    uploaded: list[bytes] = []

    def upload(key, digest, path):
        with open(path, "rb") as handle:
            uploaded.append(handle.read())
        return True

    assert upload_outputs(workdir, files, upload, notes.append) == {}
    assert uploaded == [] and "sub/key" in notes[0], notes
    files, problems = collect_outputs(workdir, ["sub", "sub/key"])
    assert files == [] and problems == ["output 'sub' is a symbolic link, not a regular file: skipped",
                                        "output 'sub/key' lies beyond a symbolic link (or a file): skipped"]
