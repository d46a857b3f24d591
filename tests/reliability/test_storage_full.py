"""A full disk: the writer survives, a full disk answers 507 and writes nothing, health says so, and it recovers.

Two ways to fill it: `PRAGMA max_page_count` on the writer (in-process, any
machine) and a real small tmpfs under a real server process (root only).
"""
from __future__ import annotations

import os
import sqlite3
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpulayer.server.store.db import Store
from gpulayer.server.errors import StorageFull, Unavailable
from gpulayer.testing import ControlPlaneProcess, wait_for

BIG = "x" * 20_000


def _count_jobs(conn) -> int:
    return conn.execute("SELECT count(*) AS n FROM jobs").fetchall()[0]["n"]


def test_writer_survives_max_page_count_and_recovers(sched, store):
    pages = store.read(lambda conn: conn.execute("PRAGMA page_count").fetchall()[0]["page_count"])
    store.write(lambda conn: conn.execute(f"PRAGMA max_page_count = {pages + 20}"))
    acked, full = [], 0
    for _ in range(200):
        try:
            acked.append(sched.submit({"command": ["true", BIG], "labels": {"pool": "nowhere"}}))
        except StorageFull:
            full += 1
            if full >= 3:
                break
    assert full >= 3 and acked, (full, len(acked))
    # The writer is alive and answers: a change that needs no new page still commits.
    assert store.write(lambda conn: 42) == 42
    health = store.health()
    assert health["ok"] is False and health["disk"]["full"] and health["writer"]["alive"]

    store.write(lambda conn: conn.execute("PRAGMA max_page_count = 1000000"))
    assert store.health()["ok"] is True
    acked.append(sched.submit({"command": ["true", BIG]}))
    stored = store.read(lambda conn: [r["id"] for r in conn.execute("SELECT id FROM jobs").fetchall()])
    assert sorted(stored) == sorted(acked)  # every acknowledged job, and nothing a 507 answered
    assert store.read(lambda conn: conn.execute("PRAGMA integrity_check").fetchall()[0]["integrity_check"]) == "ok"


def test_write_after_close_fails_at_once(config):
    s = Store(config.layout.state)
    s.close()
    with pytest.raises(Unavailable):
        s.write(lambda conn: None)


def test_a_write_the_writer_never_takes_answers_unavailable_and_never_runs(config):
    s = Store(config.layout.state, write_timeout_s=0.2)
    release = threading.Event()
    ran = []
    try:
        with ThreadPoolExecutor(1) as pool:
            busy = pool.submit(s.write, lambda conn: release.wait())
            wait_for(lambda: s._queue.qsize() == 0, 10, "the writer to take the first write")
            with pytest.raises(Unavailable):
                s.write(lambda conn: ran.append(1))
            release.set()
            busy.result()
        assert s.write(lambda conn: "next") == "next"
        assert ran == []  # given up by its caller: never run, never committed
    finally:
        release.set()
        s.close()


def test_readers_are_query_only(store):
    import apsw
    with pytest.raises(apsw.ReadOnlyError):
        store.read(lambda conn: conn.execute("DELETE FROM jobs"))


# -- a real server on a real small filesystem ---------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount = tmp_path / "home"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_server_on_a_full_tmpfs_answers_507_and_recovers(tmp_path, small_disk):
    with ControlPlaneProcess(tmp_path) as plane:
        assert plane.home == small_disk
        filler = small_disk / "filler"
        free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
        with open(filler, "wb") as fh:  # leave ~300 kB
            fh.write(b"\0" * max(0, free - 300_000))
        acked, statuses = [], []
        lock = threading.Lock()

        def submit(_):
            answer = plane.request("POST", "/v1/jobs", json={"command": ["true", BIG], "labels": {"p": "none"}},
                                   timeout=60)
            with lock:
                statuses.append(answer.status_code)
                if answer.status_code == 201:
                    acked.append(answer.json()["id"])
                else:
                    assert answer.json()["error"]["code"] == "storage_full", answer.text
            return answer.status_code

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(submit, range(80)))
        assert set(statuses) <= {201, 507} and 507 in statuses, statuses
        health = plane.request("GET", "/v1/health")
        assert health.status_code == 503 and health.json()["disk"]["full"], health.text

        filler.unlink()
        wait_for(lambda: plane.request("GET", "/v1/health").status_code == 200, 30, "health to recover")
        acked.append(plane.submit({"command": ["true"], "labels": {"p": "none"}}))
        stored = sorted(r[0] for r in plane.sql("SELECT id FROM jobs"))
        assert stored == sorted(acked)
        assert plane.sql("PRAGMA integrity_check") == [("ok",)]
    assert sqlite3.connect(str(small_disk / "state.db")).execute("PRAGMA integrity_check").fetchone() == ("ok",)
