"""The artifact sweep against PUT and GET of the same digest, and partial uploads left by a kill."""
from __future__ import annotations

import hashlib
import io
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import falcon.testing
import pytest

from gpulayer.server.scheduler import retention
from gpulayer.server.http.app import create_app, new_deps
from gpulayer.testing import wait_for

DAY = 86400.0
DATA = b"the bytes of one artifact"
DIGEST = "sha256:" + hashlib.sha256(DATA).hexdigest()


@pytest.fixture
def app(config, clock, home):
    deps = new_deps(config, clock=clock)
    client = falcon.testing.TestClient(create_app(deps))
    token = json.loads((home / "tokens.json").read_text())["client_token"]
    yield client, deps, {"Authorization": f"Bearer {token}"}
    deps.store.close()


def _recorded(deps) -> bool:
    return deps.store.read(lambda conn: conn.execute("SELECT count(*) AS n FROM artifacts").fetchall()[0]["n"]) == 1


def test_a_put_between_the_sweeps_commit_and_its_unlink_keeps_row_and_file(app, clock, monkeypatch):
    api, deps, headers = app
    assert api.simulate_put(f"/v1/artifacts/{DIGEST}", headers=headers, body=DATA).status_code == 201
    put_done = threading.Event()
    unlink = deps.artifacts.delete

    def late_delete(digest, *args, **kwargs):  # the sweep, after its commit, before its unlink
        put_done.wait()
        return unlink(digest, *args, **kwargs)

    monkeypatch.setattr(deps.artifacts, "delete", late_delete)
    with ThreadPoolExecutor(1) as pool:
        swept = pool.submit(retention.sweep, deps.store, deps.artifacts, now=clock.now + 8 * DAY, retention_s=7 * DAY)
        wait_for(lambda: not _recorded(deps), 10, "the sweep to commit the row's removal")
        again = api.simulate_put(f"/v1/artifacts/{DIGEST}", headers=headers, body=DATA)
        put_done.set()
        swept.result()
    assert again.status_code == 201
    assert _recorded(deps) and deps.artifacts.exists(DIGEST)  # never a row without its file
    got = api.simulate_get(f"/v1/artifacts/{DIGEST}", headers=headers)
    assert got.status_code == 200 and got.content == DATA


def test_a_get_whose_file_is_swept_after_open_still_answers_the_bytes(app, monkeypatch):
    api, deps, headers = app
    assert api.simulate_put(f"/v1/artifacts/{DIGEST}", headers=headers, body=DATA).status_code == 201
    opened = deps.artifacts.open

    def open_then_swept(digest):
        result = opened(digest)
        os.unlink(deps.artifacts.path(digest))
        return result

    monkeypatch.setattr(deps.artifacts, "open", open_then_swept)
    got = api.simulate_get(f"/v1/artifacts/{DIGEST}", headers=headers)
    assert got.status_code == 200 and got.content == DATA
    assert api.simulate_head(f"/v1/artifacts/{DIGEST}", headers=headers).status_code == 404


def test_concurrent_puts_and_sweeps_never_leave_a_row_without_its_file(app, clock):
    api, deps, headers = app
    stop = threading.Event()

    def sweeping():
        while not stop.is_set():
            retention.sweep(deps.store, deps.artifacts, now=clock.now + 8 * DAY, retention_s=7 * DAY)

    with ThreadPoolExecutor(1) as pool:
        sweeper = pool.submit(sweeping)
        try:
            for _ in range(150):
                deps.artifacts.put(DIGEST, io.BytesIO(DATA), len(DATA), record=deps.scheduler.record_artifact)
        finally:
            stop.set()
        sweeper.result()
    assert not _recorded(deps) or deps.artifacts.exists(DIGEST)


def test_partial_uploads_older_than_a_day_are_swept(config):
    from gpulayer.server.store.artifacts import ArtifactStore
    store = ArtifactStore(config.layout.artifacts)
    old, fresh = store.root / "tmp" / "tmpold", store.root / "tmp" / "tmpfresh"
    old.write_bytes(b"half an upload")
    fresh.write_bytes(b"an upload in progress")
    now = os.stat(fresh).st_mtime
    os.utime(old, (now - 2 * DAY, now - 2 * DAY))
    assert store.sweep_tmp(now=now) == 1
    assert not old.exists() and fresh.exists()
