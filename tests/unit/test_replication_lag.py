"""The lag of a replica that is not a directory: Litestream's control socket's `last_sync_at` (server/replication/lag.py, supervisor.py).

A small unix-socket server stands for Litestream's control socket
(tests/reliability/test_replication.py runs the real binary).
"""
from __future__ import annotations

import json
import socket
import threading
import time
from datetime import datetime, timezone

import pytest

from gpulayer.server.replication import supervisor
from gpulayer.server.config import HomeLayout
from gpulayer.server.replication.lag import LAG_DEGRADED_S, rfc3339
from gpulayer.server.replication.replica import Replica
from gpulayer.server.replication.supervisor import Replicator


class FakeControlSocket:
    def __init__(self, path, state):
        self.path, self.state, self.synced_at = path, state, None
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(4)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                conn.recv(4096)
                stamp = None if self.synced_at is None else datetime.fromtimestamp(
                    self.synced_at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"
                body = json.dumps({"databases": [{"path": str(self.state), "status": "replicating",
                                                  "last_sync_at": stamp}]}).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                             + str(len(body)).encode() + b"\r\n\r\n" + body)

    def close(self):
        self.server.close()


@pytest.fixture
def s3_replicator(home, monkeypatch):
    monkeypatch.setattr(supervisor, "require_binary", lambda: "/bin/true")
    monkeypatch.setattr(supervisor, "SYNC_QUERY_S", 0.0)
    now = [time.time()]
    r = Replicator(HomeLayout(home), Replica.parse("s3://bucket/state"), 1.0, clock=lambda: now[0])
    r._unsynced_since = now[0]
    r.state = "running"
    fake = FakeControlSocket(r.socket_path, r.layout.state)
    yield r, fake, now
    fake.close()


def test_go_times_are_read_to_the_microsecond():
    assert rfc3339("2026-12-01T11:12:50.135518766Z") == pytest.approx(1796123570.135518766, abs=1e-6)
    assert rfc3339("2026-12-01T12:12:50+01:00") == 1796123570.0
    with pytest.raises(ValueError):
        rfc3339("yesterday")


def test_an_s3_replica_lags_from_the_last_sync_that_shipped_everything(s3_replicator):
    r, fake, now = s3_replicator
    assert r._config_text().count(str(r.socket_path)) == 1
    r._refresh()   # no sync yet: the lag counts from the start
    assert r.status()["lag_seconds"] == 0.0
    fake.synced_at = now[0]
    now[0] += 0.5
    r._refresh()
    status = r.status()
    assert status["lag_seconds"] == pytest.approx(0.5, abs=0.01) and not status["degraded"]
    assert status["replicated_txid"] is None
    now[0] += LAG_DEGRADED_S + 1   # every upload fails: Litestream's last sync stays where it was
    r._refresh()
    status = r.status()
    assert status["lag_seconds"] > LAG_DEGRADED_S and status["degraded"]
    fake.synced_at = now[0]        # an upload went through again
    r._refresh()
    assert r.status()["lag_seconds"] < 0.01 and not r.status()["degraded"]


def test_no_answer_from_the_socket_keeps_the_last_sync(s3_replicator):
    r, fake, now = s3_replicator
    fake.synced_at = now[0]
    r._refresh()
    fake.close()                   # Litestream restarts, or hangs
    now[0] += LAG_DEGRADED_S + 1
    r._refresh()
    assert r.status()["lag_seconds"] > LAG_DEGRADED_S and r.status()["degraded"]


def test_a_replica_never_reached_lags_from_the_start(s3_replicator):
    r, fake, now = s3_replicator
    now[0] += LAG_DEGRADED_S + 1
    r._refresh()
    assert r.status()["lag_seconds"] > LAG_DEGRADED_S and r.status()["degraded"]
