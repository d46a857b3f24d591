"""`gpulayer server backup` during a submit storm: the copy opens, passes PRAGMA integrity_check
and holds every job acknowledged before the backup began."""
from __future__ import annotations

import sqlite3
import threading
import time

import requests

from fleet_cluster import bearer


def test_backup_during_a_submit_storm(fleet):
    acked: list[int] = []
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[str] = []

    def storm():
        with requests.Session() as s:
            s.headers.update(bearer(fleet.client_token))
            while not stop.is_set():
                answer = s.post(f"{fleet.url}/v1/jobs", json={"command": ["true"], "labels": {"pool": "storm"}},
                                timeout=10)
                if answer.status_code != 201:
                    errors.append(answer.text)
                    return
                with lock:
                    acked.append(answer.json()["id"])

    threads = [threading.Thread(target=storm) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 10
        while len(acked) < 30 and time.monotonic() < deadline:
            time.sleep(0.02)
        with lock:
            before = set(acked)
        dest = fleet.root / "backup.db"
        out = fleet.cli("server", "backup", str(dest), "--home", str(fleet.home))
        assert out.returncode == 0, out.stderr
        during = len(acked)
    finally:
        stop.set()
        for t in threads:
            t.join(15)
    assert not errors, errors[:3]
    assert len(before) >= 30 and len(acked) > len(before), (len(before), len(acked))

    conn = sqlite3.connect(f"file:{dest}?mode=ro", uri=True)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        held = {r[0] for r in conn.execute("SELECT id FROM jobs")}
        tasks = {r[0] for r in conn.execute("SELECT job_id FROM tasks")}
        events = {r[0] for r in conn.execute("SELECT job_id FROM events WHERE kind = 'job_submitted'")}
    finally:
        conn.close()
    assert before <= held and before <= tasks and before <= events
    assert len(held & set(acked)) <= during + len(threads)  # nothing from after the copy ended
