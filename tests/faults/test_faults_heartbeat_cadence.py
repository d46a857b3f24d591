"""The heartbeat interval scaled with the fleet, through a real `gpulayer server start` process.

With `--max-heartbeats-per-s 4` and a 0.5 s base interval, a fleet of 8 is asked
to beat every 2 s (jittered up to 2.4 s) and its leases last 4 × the 3 s TTL. The
workers here are new agents in plain HTTP: each beats at the interval its last
answer asked for. None may be lost while they do, and a restart gives them the
scaled grace.
"""
from __future__ import annotations

import threading
import time

import apsw
import pytest
import requests

from faultlib import PROTO, check_state

from gpulayer.testing import ControlPlaneProcess, wait_for

INTERVAL, TTL, RATE, FLEET = 0.5, 3.0, 4.0, 8


class FollowingAgent:
    """Registers, takes one long task, heartbeats at the interval each answer asks for (recorded)."""

    def __init__(self, srv: ControlPlaneProcess, name: str):
        self.url = srv.url
        self.http = requests.Session()
        self.http.trust_env = False
        r = self.http.post(f"{self.url}/v1/workers/register",
                           headers={**PROTO, "Authorization": f"Bearer {srv.tokens['join_token']}"},
                           json={"name": name, "labels": {}, "version": "new", "resources":
                                 {"cpus": 4, "gpus": 0, "memory_mb": 4096, "gpu_models": []}}, timeout=10)
        r.raise_for_status()
        self.worker_id = r.json()["worker_id"]
        self.intervals = [float(r.json()["heartbeat_interval_s"])]
        self.headers = {**PROTO, "Authorization": f"Bearer {r.json()['session_token']}"}
        self.task_id: int | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def post(self, path: str, body: dict) -> dict:
        r = self.http.post(f"{self.url}/v1{path}", json=body, headers=self.headers, timeout=10)
        r.raise_for_status()
        return r.json()

    def take(self) -> None:
        task = self.post("/worker/acquire", {"wait_s": 5})["task"]
        self.post(f"/worker/tasks/{task['task_id']}/start", {"pid": 4242})
        self.task_id = task["task_id"]
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.wait(self.intervals[-1]):
            try:
                answer = self.post("/worker/heartbeat", {"tasks": [
                    {"task_id": self.task_id, "state": "running", "endpoint": None, "restarts": 0}]})
            except requests.RequestException:
                continue  # the control plane is down: the next beat tries again
            self.intervals.append(float(answer["heartbeat_interval_s"]))


def read(srv: ControlPlaneProcess, sql: str) -> list[dict]:
    conn = apsw.Connection(f"file:{srv.state}?mode=ro", flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
    conn.set_busy_timeout(10_000)
    try:
        cur = conn.execute(sql)
        return [dict(zip([d[0] for d in cur.getdescription()], r)) for r in cur]
    finally:
        conn.close()


@pytest.mark.timeout(150)
def test_the_interval_grows_with_the_fleet_and_a_fleet_on_it_is_never_falsely_lost(tmp_path):
    srv = ControlPlaneProcess(tmp_path, heartbeat_interval=INTERVAL, lease_ttl=TTL,
                              args=["--max-heartbeats-per-s", str(RATE)]).start()
    client = {"Authorization": f"Bearer {srv.tokens['client_token']}"}
    agents: list[FollowingAgent] = []
    try:
        for _ in range(FLEET):
            requests.post(f"{srv.url}/v1/jobs", json={"command": ["sleep", "1000"]}, headers=client,
                          timeout=10).raise_for_status()
        agents = [FollowingAgent(srv, f"new-{i}") for i in range(FLEET)]
        assert INTERVAL <= agents[0].intervals[0] <= INTERVAL * 1.2  # alone, it was asked for the base interval
        for agent in agents:
            agent.take()
        # Within an upkeep tick and a beat each, the fleet of 8 is asked for 8 / 4 = 2 s (up to 2.4 s).
        wait_for(lambda: all(a.intervals[-1] >= 2.0 for a in agents), 20, "every agent told the longer interval")
        assert all(a.intervals[-1] <= 2.4 for a in agents)
        assert len({a.intervals[-1] for a in agents}) > 1  # jittered: the fleet does not beat in lockstep
        time.sleep(3 * TTL)  # three base TTLs on the longer interval: unscaled leases would have passed
        assert read(srv, "SELECT state, count(*) AS n FROM tasks GROUP BY state") == [{"state": "running", "n": FLEET}]
        assert read(srv, "SELECT state, count(*) AS n FROM workers GROUP BY state") == [{"state": "online", "n": FLEET}]
        # A restart: the fleet keeps beating every 2 s; the grace and the leases after it are the scaled TTL.
        srv.kill()
        time.sleep(TTL + 1)
        srv.start()
        time.sleep(2 * TTL)  # past an unscaled grace and a beat, within the scaled one
        assert read(srv, "SELECT count(*) AS n FROM events WHERE kind IN ('task_lost', 'worker_offline')") == [{"n": 0}]
        assert read(srv, "SELECT state, count(*) AS n FROM tasks GROUP BY state") == [{"state": "running", "n": FLEET}]
        assert check_state(srv.state) == []
    finally:
        for agent in agents:
            agent.stop.set()
        srv.stop()
