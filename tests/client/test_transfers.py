"""Local paths in specs: where inputs land, and output paths that may not escape."""
import pytest

from gpulayer.client.errors import ClientError
from gpulayer.client.transfers import file_digest, remote_path, safe_join


def test_remote_path_keeps_relative_paths_and_drops_the_rest():
    assert remote_path("data/x.bin") == "data/x.bin"
    assert remote_path("./data/x.bin") == "data/x.bin"
    assert remote_path("/abs/x.bin") == "x.bin"
    assert remote_path("../up/x.bin") == "x.bin"


def test_safe_join_refuses_escapes(tmp_path):
    assert safe_join(tmp_path, "out/a.txt") == tmp_path / "out" / "a.txt"
    for bad in ("/etc/passwd", "../x", "out/../../x", ""):
        with pytest.raises(ClientError):
            safe_join(tmp_path, bad)


def test_file_digest(tmp_path):
    (tmp_path / "f").write_bytes(b"hello")
    assert file_digest(tmp_path / "f") == (
        "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824")
