"""The home, the state file and backups are the owner's alone, whatever existed before and whatever the umask."""
from __future__ import annotations

import sqlite3
import stat

from gpulayer.server.store.db import Store
from gpulayer.testing import run_cli


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_init_into_an_existing_home_makes_it_and_its_state_file_private(tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    sqlite3.connect(home / "state.db").close()
    (home / "state.db").chmod(0o644)
    done = run_cli("server", "init", "--home", str(home), "--json", timeout=60)
    assert done.returncode == 0, done.stderr
    assert _mode(home) == 0o700
    assert _mode(home / "state.db") == 0o600


def test_a_new_state_file_and_its_wal_are_private(tmp_path):
    store = Store(tmp_path / "state.db")
    try:
        store.write(lambda conn: conn.execute("SELECT 1").fetchall())
        for name in ("state.db", "state.db-wal", "state.db-shm"):
            assert _mode(tmp_path / name) == 0o600, name
    finally:
        store.close()


def test_backup_is_written_0600(home, store):
    dest = home.parent / "copy.db"
    done = run_cli("server", "backup", str(dest), "--home", str(home), timeout=60)
    assert done.returncode == 0, done.stderr
    assert _mode(dest) == 0o600
    again = run_cli("server", "backup", str(dest), "--home", str(home), timeout=60)
    assert again.returncode != 0 and "exists already" in again.stderr and "Traceback" not in again.stderr
