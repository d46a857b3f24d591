"""Artifact retention: referenced artifacts stay, old unreferenced ones go, a dry run removes nothing.

The sweep runs in-process with a pinned `now`; `gpulayer artifacts gc --dry-run` runs as the CLI.
"""
from __future__ import annotations

import hashlib
import io
import json


from gpulayer.testing import run_cli

from gpulayer.server.scheduler import retention

from gpulayer.server.http import wire
from gpulayer.server.store.artifacts import ArtifactStore
from gpulayer.server.security.auth import Principal
from gpulayer.server.store.queries import row

DAY = 86400.0


def put(store, artifacts, name: str, at: float) -> str:
    data = f"artifact {name}".encode()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    artifacts.put(digest, io.BytesIO(data), len(data))
    store.write(lambda conn: row(conn, "record_artifact", digest=digest, size=len(data), now=at))
    return digest


def test_sweep_keeps_referenced_and_removes_old_unreferenced(home, store, sched, clock, config):
    artifacts = ArtifactStore(config.layout.artifacts)
    t0 = clock.now
    d = {name: put(store, artifacts, name, t0) for name in ("source", "weights", "input_old", "output_kept",
                                                            "orphan")}
    nowhere = {"pool": "nowhere"}  # no worker has it: these stay queued
    sched.submit({"command": ["true"], "source": d["source"], "labels": nowhere})
    sched.submit({"command": ["serve"], "service": {"weights": d["weights"]}, "labels": nowhere})
    cancelled = sched.submit({"command": ["true"], "inputs": {"x": d["input_old"]}})
    sched.cancel(cancelled)                                                            # finished at t0
    # A job that finishes 8 days later with an output: retained for the retention period after that.
    clock.advance(8 * DAY)
    fresh = put(store, artifacts, "fresh", clock.now - 0.5 * DAY)
    producer = sched.submit({"command": ["make"], "labels": {"only": "here"}})
    body = wire.register({"name": "w", "labels": {"only": "here"}, "resources": {"cpus": 1}})
    worker = sched.register(body=body, token=Principal(kind="join", jti="server-join"), session_hash="h",
                            peer_address="127.0.0.1")["worker_id"]
    task = sched.acquire(worker)
    assert task["job_id"] == producer
    sched.start(worker, task["task_id"], 1)
    # the worker uploaded its output (a finish names only what its worker may read: issue 36)
    store.write(lambda conn: row(conn, "record_upload", digest=d["output_kept"], uploader="worker", uploader_id=worker,
                                 project_id=None, now=clock.now))
    assert sched.finish(worker, task["task_id"], exit_code=0, outcome="succeeded",
                        outputs={"out.bin": d["output_kept"]}, reason=None)

    now, keep = clock.now, 7 * DAY
    expected = {d["input_old"], d["orphan"]}
    dry = retention.sweep(store, artifacts, now=now, retention_s=keep, dry_run=True)
    assert set(dry["removed"]) == expected and dry["dry_run"]
    assert all(artifacts.exists(x) for x in [*d.values(), fresh])

    # The CLI's dry run (real clock: everything is old) never lists a referenced artifact, removes nothing.
    out = run_cli("artifacts", "gc", "--dry-run", "--json", "--home", str(home), timeout=60)
    assert out.returncode == 0, out.stderr
    listed = set(json.loads(out.stdout))
    assert expected <= listed and not listed & {d["source"], d["weights"]}
    assert all(artifacts.exists(x) for x in [*d.values(), fresh])
    assert store.read(lambda conn: conn.execute("SELECT count(*) AS n FROM artifacts").fetchall()[0]["n"]) == 6

    swept = retention.sweep(store, artifacts, now=now, retention_s=keep)
    assert set(swept["removed"]) == expected
    for name, digest in d.items():
        assert artifacts.exists(digest) == (digest not in expected), name
    assert artifacts.exists(fresh)
    left = store.read(lambda conn: [r["digest"] for r in conn.execute("SELECT digest FROM artifacts").fetchall()])
    assert set(left) == {d["source"], d["weights"], d["output_kept"], fresh}
    assert retention.sweep(store, artifacts, now=now, retention_s=keep)["removed"] == []


def test_uploads_no_job_named_go_after_the_unnamed_retention(home, store, sched, clock, config):
    """Issue 36: an upload no job ever named is swept after `unnamed_retention_s` (24h by default), not the
    7 days of the rest; one a job named (even a job long cancelled) keeps the full retention."""
    artifacts = ArtifactStore(config.layout.artifacts)
    named, unnamed = put(store, artifacts, "named", clock.now), put(store, artifacts, "unnamed", clock.now)
    store.write(lambda conn: row(conn, "record_upload", digest=unnamed, uploader="user", uploader_id=1,
                                 project_id=None, now=clock.now))
    sched.cancel(sched.submit({"command": ["true"], "inputs": {"x": named}}))
    clock.advance(0.5 * DAY)
    assert retention.sweep(store, artifacts, now=clock.now, retention_s=7 * DAY)["removed"] == []
    clock.advance(DAY)
    swept = retention.sweep(store, artifacts, now=clock.now, retention_s=7 * DAY, unnamed_retention_s=DAY)
    assert swept["removed"] == [unnamed] and not artifacts.exists(unnamed) and artifacts.exists(named)
    assert store.read(row, "artifact_recorded", digest=unnamed) is None
    assert store.read(lambda conn: list(conn.execute("SELECT * FROM artifact_uploads WHERE digest = ?",
                                                     (unnamed,)))) == []
