"""Safe unpacking of source bundles and placement of inputs."""

import io
import os
import tarfile

import pytest

from bombs import tar_gz_of_zeros
from agent.artifacts.bundle import place_file, safe_relative_path, unpack_bundle
from agent.errors import TaskSetupError, UnsafeBundle


def make_bundle(path, members):
    """members: (name, kind, payload) with kind file/dir/symlink/hardlink/fifo/chr/blk."""
    kinds = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE,
             "fifo": tarfile.FIFOTYPE, "chr": tarfile.CHRTYPE, "blk": tarfile.BLKTYPE}
    with tarfile.open(path, "w:gz") as archive:
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            info.type = kinds[kind]
            info.mode = 0o755 if kind == "dir" else 0o644
            data = None
            if kind == "file":
                data = payload.encode()
                info.size = len(data)
            elif kind in ("symlink", "hardlink"):
                info.linkname = payload
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def tree(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, dirs, files in os.walk(root) for f in files + dirs)


@pytest.fixture
def layout(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    return tmp_path, work


def test_good_bundle_unpacks_files_dirs_and_inside_links(layout):
    tmp, work = layout
    bundle = make_bundle(tmp / "b.tar.gz", [
        ("src", "dir", None),
        ("src/main.py", "file", "print('hi')\n"),
        ("src/link.py", "symlink", "main.py"),
        ("up.py", "symlink", "src/main.py"),
        ("copy.py", "hardlink", "src/main.py"),
        ("./nested/deep/x.txt", "file", "x"),
    ])
    assert unpack_bundle(bundle, work) == 6
    assert (work / "src/main.py").read_text() == "print('hi')\n"
    assert os.readlink(work / "src/link.py") == "main.py"
    assert (work / "up.py").read_text() == "print('hi')\n"
    assert (work / "copy.py").read_text() == "print('hi')\n"
    assert (work / "nested/deep/x.txt").read_text() == "x"


@pytest.mark.parametrize(
    "members, words",
    [
        ([("/etc/evil", "file", "x")], "relative path"),
        ([("../evil", "file", "x")], "relative path"),
        ([("a/../../evil", "file", "x")], "relative path"),
        ([("dev", "chr", None)], "is a device"),
        ([("disk", "blk", None)], "is a device"),
        ([("pipe", "fifo", None)], "is a fifo"),
        ([("abs", "symlink", "/etc/passwd")], "leads outside"),
        ([("up", "symlink", "../outside")], "leads outside"),
        ([("a/b", "symlink", "../../outside")], "leads outside"),
        ([("hard", "hardlink", "/etc/passwd")], "leads outside"),
        ([("hard", "hardlink", "../outside")], "leads outside"),
        ([("hard", "hardlink", "missing")], "names no earlier file"),
        # the link is innocent on its own; writing through it is not
        ([("d", "symlink", "."), ("d/x", "file", "x")], "lies under"),
        # a chain: d -> . then e -> d/../x: lexically inside, really outside
        ([("d", "symlink", "."), ("sub", "dir", None), ("sub/e", "symlink", "../d/../x")], "leads outside"),
        # a later link re-routes an earlier one
        ([("a", "symlink", "b/c"), ("b", "symlink", "..")], "leads outside"),
    ],
)
def test_unsafe_bundle_rejected_and_nothing_written(layout, members, words):
    tmp, work = layout
    bundle = make_bundle(tmp / "bad.tar.gz", [("ok.txt", "file", "fine")] + members)
    before = tree(tmp)
    with pytest.raises(UnsafeBundle, match=words):
        unpack_bundle(bundle, work)
    assert tree(work) == []
    assert tree(tmp) == before


def test_not_a_tarball_is_a_setup_error(layout):
    tmp, work = layout
    junk = tmp / "junk.tar.gz"
    junk.write_bytes(b"not a tar at all")
    with pytest.raises(TaskSetupError, match="cannot unpack"):
        unpack_bundle(junk, work)


@pytest.mark.parametrize("bad", ["/abs", "../x", "a/../../x", "", "."])
def test_safe_relative_path_rejects(bad):
    with pytest.raises(TaskSetupError):
        safe_relative_path(bad)


def test_safe_relative_path_normalises():
    assert safe_relative_path("./data//x.bin") == "data/x.bin"


def test_place_file_creates_parents_and_replaces_links(layout):
    tmp, work = layout
    source = tmp / "src.bin"
    source.write_bytes(b"data")
    outside = tmp / "outside.txt"
    outside.write_text("keep")
    os.symlink(outside, work / "x.bin")
    place_file(source, work, "x.bin")
    place_file(source, work, "data/deep/y.bin")
    assert outside.read_text() == "keep"
    assert (work / "x.bin").read_bytes() == b"data" and not (work / "x.bin").is_symlink()
    assert (work / "data/deep/y.bin").read_bytes() == b"data"


def test_place_file_refuses_a_folder_link_leading_outside(layout):
    tmp, work = layout
    source = tmp / "src.bin"
    source.write_bytes(b"data")
    (tmp / "elsewhere").mkdir()
    os.symlink(tmp / "elsewhere", work / "data")
    with pytest.raises(TaskSetupError, match="outside"):
        place_file(source, work, "data/x.bin")
    assert not (tmp / "elsewhere/x.bin").exists()


# -- the caps on bytes and entries (issue 22 item 11) -------------------------------------------

def gzip_bomb(path, size):
    path.write_bytes(tar_gz_of_zeros([("ok.txt", 0), ("zeros.bin", size)]))
    return path


def test_a_gzip_bomb_stops_at_the_byte_cap_with_nothing_written(layout):
    from agent.artifacts.caps import UnpackBudget, UnpackLimit

    tmp, work = layout
    bomb = gzip_bomb(tmp / "bomb.tar.gz", 64 * 1024 * 1024)
    assert bomb.stat().st_size < 200_000
    budget = UnpackBudget(max_bytes=1024 * 1024)
    with pytest.raises(UnpackLimit, match="more than 1048576 bytes.*GPULAYER_UNPACK_MAX_BYTES"):
        unpack_bundle(bomb, work, budget)
    assert tree(work) == []
    assert 0 < budget.used_bytes <= 1024 * 1024  # charged before decompressing: the 64 MiB were never produced


def test_the_byte_cap_comes_from_the_environment(layout, monkeypatch):
    from agent.artifacts.caps import UnpackLimit

    tmp, work = layout
    bomb = gzip_bomb(tmp / "bomb.tar.gz", 4 * 1024 * 1024)
    monkeypatch.setenv("GPULAYER_UNPACK_MAX_BYTES", str(1024 * 1024))
    with pytest.raises(UnpackLimit):
        unpack_bundle(bomb, work)
    monkeypatch.setenv("GPULAYER_UNPACK_MAX_BYTES", str(8 * 1024 * 1024))
    assert unpack_bundle(bomb, work) == 2 and (work / "zeros.bin").stat().st_size == 4 * 1024 * 1024


def test_a_file_count_bomb_stops_at_the_entry_cap(layout):
    from agent.artifacts.caps import UnpackBudget, UnpackLimit

    tmp, work = layout
    bundle = make_bundle(tmp / "many.tar.gz", [(f"d/f{i}", "file", "") for i in range(300)])
    with pytest.raises(UnpackLimit, match="more than 200 entries.*GPULAYER_UNPACK_MAX_FILES"):
        unpack_bundle(bundle, work, UnpackBudget(max_files=200))
    assert tree(work) == []
    assert unpack_bundle(bundle, work, UnpackBudget(max_files=300)) == 300


def test_a_huge_tar_header_is_refused_before_it_is_read(layout):
    from agent.artifacts.caps import UnpackLimit

    tmp, work = layout
    bomb = tmp / "pax.tar.gz"
    with tarfile.open(bomb, "w:gz", format=tarfile.PAX_FORMAT) as archive:  # tarfile reads a pax header whole
        info = tarfile.TarInfo("x")
        info.pax_headers = {"comment": "z" * (20 * 1024 * 1024)}
        archive.addfile(info, io.BytesIO(b""))
    with pytest.raises(UnpackLimit, match="tar header"):
        unpack_bundle(bomb, work)
    assert tree(work) == []


def test_inputs_share_the_budget_of_the_bundle(layout):
    from agent.artifacts.caps import UnpackBudget, UnpackLimit

    tmp, work = layout
    source = tmp / "input.bin"
    source.write_bytes(b"x" * 600)
    budget = UnpackBudget(max_bytes=1000, max_files=10)
    place_file(source, work, "a.bin", budget=budget)
    with pytest.raises(UnpackLimit, match="more than 1000 bytes"):
        place_file(source, work, "b.bin", budget=budget)
    assert not (work / "b.bin").exists() and budget.used_bytes == 600


@pytest.mark.parametrize("raw", ["0", "-5", "many", "1.5"])
def test_a_malformed_cap_is_a_configuration_error(monkeypatch, raw):
    from agent.artifacts.caps import UnpackBudget
    from agent.errors import AgentError

    monkeypatch.setenv("GPULAYER_UNPACK_MAX_FILES", raw)
    with pytest.raises(AgentError, match="GPULAYER_UNPACK_MAX_FILES"):
        UnpackBudget.from_environment()
