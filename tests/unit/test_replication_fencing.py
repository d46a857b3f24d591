"""A writer that cannot renew its lease stops; health reads a cached lag; restore leaves no half-made home.

server/replication/ on real files and a real child process; Litestream itself is
replaced by small scripts (tests/reliability/test_replication.py runs the real one).
"""
from __future__ import annotations

import errno
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpulayer.server.replication import home as home_files, lease, restore, supervisor
from gpulayer.server.config import HomeLayout
from gpulayer.server.errors import ConfigError
from gpulayer.server.replication.lease import FENCE_MARGIN_S, FENCE_TTL_S, claim, read_lease, write_lease
from gpulayer.server.replication.replica import Replica
from gpulayer.server.replication.supervisor import STATUS_STALE_S, Replicator
from gpulayer.server.store.db import Store


@pytest.fixture
def replicator(home, tmp_path, monkeypatch):
    monkeypatch.setattr(supervisor, "require_binary", lambda: "/bin/true")
    fenced = threading.Event()
    r = Replicator(HomeLayout(home), Replica.parse(str(tmp_path / "replica")), 1.0, on_fenced=fenced.set)
    r.writer = claim(r.replica, r.layout, time.time())
    r.state = "running"
    r.fenced_event = fenced
    child = subprocess.Popen(["sleep", "60"])   # stands for Litestream
    r._child = child
    yield r
    r._stop.set()
    if child.poll() is None:
        child.kill()
        child.wait()


def failing_write(*args, **kwargs):
    raise OSError(errno.EIO, "Input/output error")


def test_a_short_renew_failure_is_retried_a_long_one_fences(replicator, monkeypatch):
    child = replicator._child
    monkeypatch.setattr(lease, "write_lease", failing_write)
    replicator._renewed_ok = time.monotonic() - 1.0
    assert replicator._renew() is True  # a blip: logged, the plane goes on
    assert replicator.state == "running" and "Input/output error" in replicator.last_error
    assert not replicator.fenced_event.is_set()

    replicator._renewed_ok = time.monotonic() - (FENCE_TTL_S - FENCE_MARGIN_S) - 0.1
    assert replicator._renew() is False
    assert replicator.state == "fenced" and replicator.fenced_event.is_set()
    assert child.wait(timeout=5) == -9   # killed, not asked to sync into a replica that may be another's
    assert "could not be renewed" in replicator.status()["last_error"]
    assert replicator.status()["fenced"] and replicator.status()["degraded"]


def test_the_watchdog_fences_while_the_renewal_hangs(replicator, monkeypatch):
    release = threading.Event()
    monkeypatch.setattr(supervisor, "read_lease", lambda directory: release.wait(30) and None)  # a hard NFS mount
    hung = threading.Thread(target=replicator._renew, daemon=True)
    hung.start()
    replicator._renewed_ok = time.monotonic() - (FENCE_TTL_S - FENCE_MARGIN_S) + 0.5
    watchdog = threading.Thread(target=replicator._watch, daemon=True)
    watchdog.start()
    assert replicator.fenced_event.wait(5)
    assert replicator.state == "fenced" and hung.is_alive()
    release.set()
    hung.join(5)


def test_a_fenced_writer_does_not_renew_the_lease_again(replicator):
    replicator._fence("test")
    before = read_lease(replicator.replica.directory)
    assert replicator._renew() is False
    assert read_lease(replicator.replica.directory) == before


def test_health_reads_the_last_measurement_and_an_io_error_is_degraded_not_raised(replicator, monkeypatch):
    replicator._refresh()
    assert replicator.status()["lag_seconds"] == 0.0 and not replicator.status()["degraded"]

    def eio(root):
        raise OSError(errno.ESTALE, "Stale file handle")
    monkeypatch.setattr(supervisor, "ltx_positions", eio)
    assert replicator.status()["lag_seconds"] == 0.0  # requests read no file
    replicator._refresh()
    status = replicator.status()
    assert status["lag_seconds"] is None and status["degraded"] and "Stale file handle" in status["lag_error"]


def test_a_measurement_gone_stale_is_degraded_with_the_lag_unknown(replicator):
    replicator._refresh()
    replicator._status_at = time.monotonic() - STATUS_STALE_S - 1
    status = replicator.status()
    assert status["lag_seconds"] is None and status["degraded"] and "may hang" in status["lag_error"]
    assert status["measured_s_ago"] > STATUS_STALE_S


def test_a_replica_path_that_is_a_file_is_a_config_error(config, tmp_path, monkeypatch):
    from gpulayer.server import process
    monkeypatch.setattr(process, "require_binary", lambda: "/bin/true")
    (tmp_path / "afile").write_text("x")
    for path in (tmp_path / "afile", tmp_path / "afile" / "below"):
        config.replicate = str(path)
        with pytest.raises(ConfigError, match="is a file, not a directory"):
            process.check_config(config)


def test_home_files_are_copied_as_bytes(home, tmp_path):
    (home / "tls").mkdir()
    (home / "tls" / "key.der").write_bytes(b"\xff\xfe\x00DER")
    home_files.copy_home_files(HomeLayout(home), tmp_path / "r")
    assert (tmp_path / "r" / "home" / "tls" / "key.der").read_bytes() == b"\xff\xfe\x00DER"


def test_the_lease_is_written_through_a_temporary_file_of_its_own(tmp_path):
    write_lease(tmp_path, "w", tmp_path, 1.0)
    assert [p.name for p in tmp_path.iterdir()] == [lease.FENCE_FILE]


# -- restore ------------------------------------------------------------------------------------------

def fake_litestream(tmp_path: Path, body: str) -> str:
    script = tmp_path / "fake-litestream"
    script.write_text(f"#!{sys.executable}\nimport shutil, sys, time\nout = sys.argv[sys.argv.index('-o') + 1]\n"
                      + body)
    script.chmod(0o755)
    return str(script)


def replica_of(home: Path, tmp_path: Path) -> Path:
    """A directory replica of `home`, its lease released (a clean stop), as restore expects."""
    replica = tmp_path / "replica"
    (replica / "ltx").mkdir(parents=True)
    home_files.copy_home_files(HomeLayout(home), replica)
    write_lease(replica, "old", home, time.time(), released=True)
    return replica


def test_a_failed_or_hung_restore_leaves_no_home(home, tmp_path, monkeypatch):
    replica = replica_of(home, tmp_path)
    target = tmp_path / "new" / "home"
    monkeypatch.setattr(restore, "require_binary",
                        lambda: fake_litestream(tmp_path, "print('cannot reach the replica', file=sys.stderr)\n"
                                                          "sys.exit(1)\n"))
    with pytest.raises(ConfigError, match="litestream restore failed: cannot reach the replica"):
        restore.restore(str(replica), target)
    assert not target.exists()
    monkeypatch.setattr(restore, "require_binary", lambda: fake_litestream(tmp_path, "time.sleep(30)\n"))
    monkeypatch.setattr(restore, "RESTORE_TIMEOUT_S", 0.5)
    with pytest.raises(ConfigError, match="did not finish within 0.5 s"):
        restore.restore(str(replica), target)
    assert not target.exists()
    assert read_lease(replica)["writer"] == "old"


def test_a_restore_that_fails_copying_a_home_file_leaves_the_existing_home_empty(home, tmp_path, monkeypatch):
    replica = replica_of(home, tmp_path)
    Store(HomeLayout(home).state).close()
    monkeypatch.setattr(restore, "require_binary",
                        lambda: fake_litestream(tmp_path, f"shutil.copy({str(HomeLayout(home).state)!r}, out)\n"))
    real_write = restore.write_private

    def disk_full(path, data):
        if path.name == "server-credentials.json":
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(path, data)
    monkeypatch.setattr(restore, "write_private", disk_full)
    target = tmp_path / "existing"
    target.mkdir()
    with pytest.raises(ConfigError, match="cannot restore into .*No space left on device"):
        restore.restore(str(replica), target)
    assert target.is_dir() and list(target.iterdir()) == []
    monkeypatch.setattr(restore, "write_private", real_write)
    restore.restore(str(replica), target)  # and a retry is not refused as "holds a control plane's files"
    assert HomeLayout(target).state.exists()


def test_a_restore_to_a_timestamp_leaves_the_lease_and_may_not_replicate_there(home, tmp_path, monkeypatch):
    replica = replica_of(home, tmp_path)
    Store(HomeLayout(home).state).close()
    monkeypatch.setattr(restore, "require_binary",
                        lambda: fake_litestream(tmp_path, f"assert '-timestamp' in sys.argv\n"
                                                          f"shutil.copy({str(HomeLayout(home).state)!r}, out)\n"))
    target = tmp_path / "older"
    done = restore.restore(str(replica), target, timestamp="2026-12-01T06:00:00Z")
    assert done["timestamp"] == "2026-12-01T06:00:00Z"
    assert read_lease(replica)["writer"] == "old"   # not taken: the replica's history is not this home's
    assert json.loads((target / home_files.RESTORED_FILE).read_text())["from"] == str(replica)
    with pytest.raises(ConfigError, match="Replicate to a new directory"):
        claim(Replica.parse(str(replica)), HomeLayout(target), time.time())
    with pytest.raises(ConfigError, match="Replicate to a new directory"):
        claim(Replica.parse(f"file://{replica}"), HomeLayout(target), time.time())
    claim(Replica.parse(str(tmp_path / "fresh")), HomeLayout(target), time.time())  # a new directory is fine
