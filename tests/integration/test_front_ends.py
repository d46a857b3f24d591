"""`server start --front-ends 2`: a writer process and two front ends on one port, killed one at a time.

One control plane for the module (a real `gpulayer server start`), a real worker for the end-to-end jobs and
simulated workers (tests/faultlib.py) for the heartbeats and cycles under the kills. Every check polls for the
state it waits for; the state file is checked against tests/invariants.sql at the end of each kill.
"""
from __future__ import annotations

import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from faultlib import Recorder, check_state, sim_fleet

from gpulayer.testing import ControlPlaneProcess, wait_for

pytestmark = pytest.mark.slow


def children(pid: int) -> dict[str, int]:
    """The supervisor's children by role: {"writer": pid, "front-end": [pids...]} read from /proc."""
    found: dict = {"writer": None, "front-end": []}
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            if b"gpulayer.server.multiproc.child" in argv:
                role = argv[argv.index(b"gpulayer.server.multiproc.child") + 1].decode()
                if role == "writer":
                    found["writer"] = int(child)
                else:
                    found["front-end"].append(int(child))
    return found


def server_log(srv) -> str:
    return (srv.root / "server.log").read_text(errors="replace")


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    srv = ControlPlaneProcess(tmp_path_factory.mktemp("front-ends"), heartbeat_interval=0.5, lease_ttl=5,
                              args=["--front-ends", "2"]).start()
    wait_for(lambda: "control plane listening on" in server_log(srv), 60, "the writer and both front ends to serve")
    yield srv
    srv.close()


def _fleet(srv, stop: threading.Event, rec: Recorder) -> list[threading.Thread]:
    return sim_fleet(srv.url, srv.tokens["join_token"], stop, rec, 3, run_s=(0.02, 0.1), fail_rate=0.0)


def _submit_all(srv, n: int) -> list[int]:
    return [srv.submit({"command": ["true"], "name": f"fe-{i}"}) for i in range(n)]


def test_jobs_run_end_to_end_on_a_real_worker(plane):
    plane.start_worker("real", parallel=2)
    ids = [plane.submit({"command": ["sh", "-c", f"echo hello-{i}"]}) for i in range(4)]
    for job_id in ids:
        assert plane.wait_job(job_id, timeout=60)["state"] == "succeeded"
    assert any("hello-0" in line["text"] for line in plane.get_json(f"/v1/jobs/{ids[0]}/logs")["lines"])
    late = plane.submit({"command": ["sh", "-c", "sleep 0.5; echo late"]})
    with ThreadPoolExecutor(4) as pool:  # log follows parked on both front ends: each wakes with the line
        follows = list(pool.map(lambda _: requests.get(f"{plane.url}/v1/jobs/{late}/logs", params={"wait_s": 20},
                                                       headers=plane.headers(), timeout=30), range(4)))
    assert all(r.elapsed.total_seconds() < 10 and "late" in [line["text"] for line in r.json()["lines"]]
               for r in follows), [(r.elapsed, r.text[:200]) for r in follows]
    plane.workers["real"].stop()


def test_uploads_are_served_by_every_front_end(plane, tmp_path):
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(300_000))
    with plane.client() as client:
        digests = {client.upload(data) for _ in range(4)}  # new connections: both front ends take one
    assert len(digests) == 1
    digest = digests.pop()
    for _ in range(6):
        answer = requests.get(f"{plane.url}/v1/artifacts/{digest}", headers=plane.headers(), timeout=10)
        assert answer.status_code == 200 and answer.content == data.read_bytes()


def test_a_front_end_killed_during_heartbeats_is_restarted_and_nothing_is_lost(plane):
    stop, rec = threading.Event(), Recorder()
    fleet = _fleet(plane, stop, rec)
    try:
        ids = _submit_all(plane, 20)
        before = children(plane.proc.pid)["front-end"]
        os.kill(before[0], signal.SIGKILL)
        wait_for(lambda: server_log(plane).count("process_started name=front-end") == 3, 30,
                 "the killed front end to be started again")
        ids += _submit_all(plane, 10)
        for job_id in ids:
            assert plane.wait_job(job_id, timeout=60)["state"] == "succeeded"
    finally:
        stop.set()
        for t in fleet:
            t.join(5)
    assert check_state(plane.state) == []
    assert rec.count["server_errors"] <= rec.count["worker_unreachable"] + 3  # only requests cut by the kill


def test_the_writer_killed_answers_503_to_writes_and_reads_go_on(plane):
    stop, rec = threading.Event(), Recorder()
    fleet = _fleet(plane, stop, rec)  # heartbeats and cycles through the kill
    try:
        ids = _submit_all(plane, 10)
        writer = children(plane.proc.pid)["writer"]
        os.kill(writer, signal.SIGKILL)
        answers: list = []
        refused = wait_for(lambda: (r := plane.request("POST", "/v1/jobs", json={"command": ["true"]})).status_code
                           == 503 and [r] or answers.append(r.text), 10, "a write to be refused",
                           details=lambda: f"{answers[-3:]}\n{plane.logs(4000)}")
        assert refused[0].json()["error"]["code"] == "unavailable"
        assert plane.request("GET", f"/v1/jobs/{ids[0]}").status_code == 200
        wait_for(lambda: plane.request("POST", "/v1/jobs", json={"command": ["true"]}).status_code == 201, 60,
                 "writes to be taken again once the writer is back")
        wait_for(lambda: server_log(plane).count("process_started name=writer") == 2, 10, "the writer's restart logged")
        for job_id in ids:
            assert plane.wait_job(job_id, timeout=60)["state"] == "succeeded"
    finally:
        stop.set()
        for t in fleet:
            t.join(5)
    assert check_state(plane.state) == []


def test_a_revoked_token_is_refused_by_every_front_end_at_once(plane):
    minted = plane.request("POST", "/v1/tokens", json={"kind": "metrics", "name": "scraper"}).json()
    token = minted["token"]
    for _ in range(12):  # new connections: both front ends cache the principal
        assert requests.get(f"{plane.url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=5).ok
    assert plane.request("POST", f"/v1/tokens/{minted['jti']}/revoke").ok
    def refused_everywhere() -> bool:  # the writer's push reaches the other front end within milliseconds
        return {requests.get(f"{plane.url}/metrics", headers={"Authorization": f"Bearer {token}"},
                             timeout=5).status_code for _ in range(12)} == {401}
    wait_for(refused_everywhere, 2, "every front end to refuse the revoked token")


def test_the_relay_and_the_ingress_are_refused_clearly(plane):
    for path in ("/v1/jobs/1/relay", "/ingress/1/"):
        answer = plane.request("GET", path, headers={"Connection": "Upgrade", "Upgrade": "websocket",
                                                     "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "x3JJHMbDL1EzLkh9GBhXDw=="})
        assert answer.status_code == 501 and "--front-ends 1" in answer.json()["error"]["message"], answer.text


def test_metrics_are_summed_over_the_front_ends(plane):
    def served() -> float:
        text = requests.get(f"{plane.url}/metrics", headers=plane.headers(), timeout=5).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("gpulayer_request_seconds_count") and 'route="/v1/health"' in line)
    before = served()
    for _ in range(20):  # new connections: both front ends answer some
        assert requests.get(f"{plane.url}/v1/health", timeout=5).ok
    assert [served() - before for _ in range(4)] == [20] * 4  # whichever front end answers the scrape


def test_sigterm_stops_every_process_cleanly(plane):  # last: it stops the module's plane
    pids = children(plane.proc.pid)
    running = [pids["writer"], *pids["front-end"]]
    assert len(running) == 3
    assert plane.stop() == 0
    for pid in running:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    assert "Traceback" not in server_log(plane)
