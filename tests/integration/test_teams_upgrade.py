"""A state file of the release before teams (schema version 3), with data, upgrades when a real server
starts on it: its jobs are the first admin's, in project default, and its queued work still runs."""
from __future__ import annotations

import json
import time

from gpulayer.server.config import HomeLayout
from gpulayer.protocol.fields import to_wire
from gpulayer.server.scheduler.spec import validate_job
from gpulayer.server.security.secretbox import SecretBox
from gpulayer.server.store import db
from gpulayer.testing import ControlPlaneProcess

BASELINE = db.migrations()[2].parent / "baseline_0001.sql"


def _version_3_home(plane: ControlPlaneProcess) -> None:
    """server init's home, whose state file is a version-3 one holding an ended job with its logs and a
    queued job that needs a secret."""
    plane.init()
    conn = db.connect(plane.state)
    conn.execute(BASELINE.read_text())
    for version in (2, 3):
        conn.execute(db.migrations()[version].read_text())
        conn.execute(f"PRAGMA user_version = {version}")
    box = SecretBox(HomeLayout(plane.home))
    conn.execute("INSERT INTO secrets (name, labels, ciphertext, created_at, updated_at) VALUES ('HF', '{}', ?, 1, 1)",
                 (box.seal("from-version-3"),))
    done = validate_job({"command": ["echo", "old"], "name": "old"})
    waiting = validate_job({"command": ["sh", "-c", "echo secret=$HF"], "name": "queued", "secrets": ["HF"]})
    now = time.time()
    conn.execute("INSERT INTO jobs (id, name, state, spec, created_at, finished_at, exit_code) "
                 "VALUES (1, 'old', 'succeeded', ?, ?, ?, 0)", (json.dumps(to_wire(done)), now - 60, now - 50))
    conn.execute("INSERT INTO tasks (id, job_id, state, created_at, started_at, finished_at, exit_code, outcome) "
                 "VALUES (1, 1, 'succeeded', ?, ?, ?, 0, 'succeeded')", (now - 60, now - 55, now - 50))
    conn.execute("INSERT INTO logs (job_id, task_id, n, stream, at, text) VALUES (1, 1, 0, 'stdout', ?, 'old')",
                 (now - 55,))
    conn.execute("INSERT INTO jobs (id, name, state, spec, secrets, created_at) VALUES (2, 'queued', 'queued', ?, "
                 "'[\"HF\"]', ?)", (json.dumps(to_wire(waiting)), now - 10))
    conn.execute("INSERT INTO tasks (id, job_id, state, created_at) VALUES (2, 2, 'queued', ?)", (now - 10,))
    conn.execute("INSERT INTO events (at, kind, job_id, data) VALUES (?, 'job_submitted', 2, '{}')", (now - 10,))
    conn.close()


def test_version_3_state_file_upgrades_at_start_and_its_work_runs(tmp_path):
    plane = ControlPlaneProcess(tmp_path, heartbeat_interval=0.5, lease_ttl=3)
    _version_3_home(plane)
    with plane:   # starts it
        assert plane.sql("PRAGMA user_version") == [(db.schema_version(),)]
        assert plane.sql("SELECT DISTINCT user_id, project_id FROM jobs") == [(1, 1)]
        rc, out, err = plane.cli("job", "list", "--json")     # server init's token: the admin's own jobs
        assert rc == 0, err
        assert {(j["id"], j["owner"], j["project"]) for j in json.loads(out)} == {(1, "admin", "default"),
                                                                                 (2, "admin", "default")}
        assert plane.cli("job", "logs", "1").stdout.splitlines() == ["old"]
        plane.start_worker("w1")
        assert plane.wait_job(2)["state"] == "succeeded"
        assert "secret=from-version-3" in plane.cli("job", "logs", "2").stdout
        actors = [e["actor"] for e in plane.events(2)]
        assert actors[0] is None and "worker:1" in actors   # old events have none; new ones name theirs
