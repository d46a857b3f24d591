"""gpulayer.testing itself: a control plane starts, answers, stops cleanly; a worker joins; waits fail clearly."""
from __future__ import annotations

import pytest

from gpulayer.testing import ControlPlaneProcess, ProcessExited, TimedOut, free_port, wait_for

pytestmark = pytest.mark.timeout(90)


def test_a_control_plane_starts_answers_runs_a_job_on_a_worker_and_stops_cleanly(tmp_path):
    plane = ControlPlaneProcess(tmp_path, heartbeat_interval=0.5, lease_ttl=3).start()
    try:
        assert plane.healthy() and plane.url == f"http://127.0.0.1:{plane.port}"
        worker = plane.start_worker("w1", gpus=0)
        assert plane.wait_workers_online(1)[0]["name"] == "w1" and worker.running
        job = plane.wait_job(plane.submit({"command": ["echo", "from-the-harness"]}))
        assert job["state"] == "succeeded" and job["tasks"][0]["worker_id"] == plane.online_worker("w1")["id"]
        rc, out, err = plane.cli("job", "logs", str(job["id"]))
        assert rc == 0 and "from-the-harness" in out.splitlines(), err
        assert plane.sql("SELECT state FROM jobs WHERE id = ?", (job["id"],)) == [("succeeded",)]
    finally:
        codes = plane.close()
    assert codes == {"w1": 0, "server": 0}, plane.logs()
    assert not plane.running and "w1" in (tmp_path / "w1.log").read_text()


def test_a_worker_that_exits_fails_the_wait_with_its_log(tmp_path):
    with ControlPlaneProcess(tmp_path) as plane:
        with pytest.raises(ProcessExited, match="worker w-bad exited"):
            plane.start_worker("w-bad", join_token="glj_not-a-token", timeout=20)


def test_a_crashed_control_plane_restarts_on_its_port_with_its_tokens(tmp_path):
    plane = ControlPlaneProcess(tmp_path, port=free_port()).start()
    try:
        port, token = plane.port, plane.client_token
        assert plane.kill() == -9
        with pytest.raises(ProcessExited):
            plane.healthy()
        plane.start()
        assert plane.port == port and plane.request("GET", "/v1/jobs", token=token).status_code == 200
        assert plane.starts == 2
    finally:
        assert plane.close()["server"] == 0


def test_wait_for_returns_the_value_or_names_what_it_waited_for():
    assert wait_for(lambda: 7, 1) == 7
    with pytest.raises(TimedOut, match="waiting for nothing.*\nthe details"):
        wait_for(lambda: None, 0.1, "nothing", details=lambda: "the details")


def test_no_two_test_files_share_a_name():
    """The test folders are not packages: two files of one name (tests/unit/test_x.py, tests/integration/test_x.py)
    stop the whole run at collection ("import file mismatch")."""
    from collections import Counter
    from pathlib import Path
    names = Counter(p.name for p in Path(__file__).parents[1].rglob("test_*.py"))
    assert [n for n, c in names.items() if c > 1] == []
