"""Heartbeats off the write path, through a real `gpulayer server start` process.

Renewals that change nothing are noted in memory and written at each upkeep
tick (scheduler/renewals.py). The workers here are old agents: plain HTTP
loops that heartbeat every interval and ignore the answer's new fields
(`heartbeat_interval_s`, `requests_renew_lease`). A SIGKILL loses the notes;
the restart's grace (one TTL from the start) must cover them.
"""
from __future__ import annotations

import threading
import time

import apsw
import pytest
import requests

from faultlib import PROTO, check_state

from gpulayer.testing import ControlPlaneProcess

INTERVAL, TTL = 0.5, 3.0


class OldAgent:
    """Registers, takes one long task, heartbeats every INTERVAL reporting it; notes when a cancel is heard."""

    def __init__(self, srv: ControlPlaneProcess, name: str):
        self.url = srv.url
        self.http = requests.Session()
        self.http.trust_env = False
        r = self.http.post(f"{self.url}/v1/workers/register", headers={**PROTO, "Authorization": f"Bearer {srv.tokens['join_token']}"},
                           json={"name": name, "labels": {}, "version": "old", "resources":
                                 {"cpus": 4, "gpus": 0, "memory_mb": 4096, "gpu_models": []}}, timeout=10)
        r.raise_for_status()
        self.worker_id = r.json()["worker_id"]
        self.headers = {**PROTO, "Authorization": f"Bearer {r.json()['session_token']}"}
        self.task_id: int | None = None
        self.cancel_heard_at: float | None = None
        self.beating = threading.Event()
        self.beating.set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def take(self) -> int:
        task = self.post("/worker/acquire", {"wait_s": 5})["task"]
        self.post(f"/worker/tasks/{task['task_id']}/start", {"pid": 4242})
        self.task_id = task["task_id"]
        self.thread.start()
        return task["task_id"]

    def post(self, path: str, body: dict) -> dict:
        r = self.http.post(f"{self.url}/v1{path}", json=body, headers=self.headers, timeout=10)
        r.raise_for_status()
        return r.json()

    def _loop(self) -> None:
        while not self.stop.wait(INTERVAL):
            if not self.beating.is_set():
                continue
            try:
                answer = self.post("/worker/heartbeat", {"tasks": [
                    {"task_id": self.task_id, "state": "running", "endpoint": None, "restarts": 0}]})
            except requests.RequestException:
                continue  # the control plane is down: the next beat tries again
            if self.task_id in answer["cancel_task_ids"] and self.cancel_heard_at is None:
                self.cancel_heard_at = time.monotonic()


def read(srv: ControlPlaneProcess, sql: str, *args) -> list[dict]:
    conn = apsw.Connection(f"file:{srv.state}?mode=ro", flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
    conn.set_busy_timeout(10_000)
    try:
        cur = conn.execute(sql, args)
        return [dict(zip([d[0] for d in cur.getdescription()], r)) for r in cur]
    finally:
        conn.close()


def fleet(srv: ControlPlaneProcess, n: int) -> list[OldAgent]:
    client = {"Authorization": f"Bearer {srv.tokens['client_token']}"}
    for _ in range(n):
        requests.post(f"{srv.url}/v1/jobs", json={"command": ["sleep", "1000"]}, headers=client,
                      timeout=10).raise_for_status()
    agents = [OldAgent(srv, f"old-{i}") for i in range(n)]
    for agent in agents:
        agent.take()
    return agents


@pytest.mark.timeout(120)
def test_sigkill_and_restart_lose_no_worker_and_no_task_within_the_grace(tmp_path):
    srv = ControlPlaneProcess(tmp_path, heartbeat_interval=INTERVAL, lease_ttl=TTL).start()
    agents = fleet(srv, 4)
    try:
        time.sleep(2 * TTL)  # heartbeats that change nothing: noted, flushed each upkeep tick
        assert read(srv, "SELECT count(*) AS n FROM tasks WHERE state = 'running'") == [{"n": 4}]
        for _ in range(2):
            srv.kill()
            time.sleep(TTL + 1)  # down past the TTL: the notes are gone, the SQL leases have passed
            srv.start()
            time.sleep(2 * TTL)
            assert read(srv, "SELECT state, count(*) AS n FROM tasks GROUP BY state") == [{"state": "running", "n": 4}]
            assert read(srv, "SELECT state, count(*) AS n FROM workers GROUP BY state") == [{"state": "online", "n": 4}]
            assert read(srv, "SELECT count(*) AS n FROM events WHERE kind IN ('task_lost', 'worker_offline')") \
                == [{"n": 0}]
            assert check_state(srv.state) == []
        # A worker that stops heartbeating is still lost after its TTL (plus one upkeep tick).
        silent = agents[0]
        silent.beating.clear()
        stopped = time.monotonic()
        while read(srv, "SELECT state FROM tasks WHERE id = ?", silent.task_id) != [{"state": "lost"}]:
            assert time.monotonic() - stopped < TTL + 5, "a silent worker's task was not lost"
            time.sleep(0.1)
        assert time.monotonic() - stopped >= TTL - INTERVAL - 0.1
        assert read(srv, "SELECT state FROM workers WHERE id = ?", silent.worker_id) == [{"state": "offline"}]
        assert read(srv, "SELECT count(*) AS n FROM tasks WHERE state = 'running'") == [{"n": 3}]
        assert check_state(srv.state) == []
    finally:
        for agent in agents:
            agent.stop.set()
        srv.stop()


@pytest.mark.timeout(60)
def test_the_lease_in_sql_is_within_one_flush_of_the_heartbeat_and_a_cancel_arrives_within_an_interval(tmp_path):
    srv = ControlPlaneProcess(tmp_path, heartbeat_interval=INTERVAL, lease_ttl=TTL).start()
    agents = fleet(srv, 2)
    try:
        time.sleep(1.0)
        worst = 0.0
        for _ in range(10):  # how far SQL's worker lease trails the newest heartbeat answer's
            answered = agents[0].post("/worker/heartbeat", {"tasks": [
                {"task_id": agents[0].task_id, "state": "running", "endpoint": None, "restarts": 0}]})
            sql = read(srv, "SELECT lease_expires_at AS l FROM workers WHERE id = ?", agents[0].worker_id)[0]["l"]
            worst = max(worst, answered["lease_expires_at"] - sql)
            time.sleep(0.13)
        # Upkeep flushes every min(interval, 1 s); its transaction may wait for the writer under load.
        assert worst <= INTERVAL + 1.0, worst
        assert INTERVAL <= answered["heartbeat_interval_s"] <= INTERVAL * 1.2  # jittered up to 20%
        assert answered["requests_renew_lease"] is True
        job = read(srv, "SELECT job_id FROM tasks WHERE id = ?", agents[1].task_id)[0]["job_id"]
        asked = time.monotonic()
        requests.post(f"{srv.url}/v1/jobs/{job}/cancel", headers={"Authorization": f"Bearer {srv.tokens['client_token']}"},
                      timeout=10).raise_for_status()
        while agents[1].cancel_heard_at is None:
            assert time.monotonic() - asked < INTERVAL + 2.0, "the cancel did not reach the worker"
            time.sleep(0.02)
        assert agents[1].cancel_heard_at - asked <= INTERVAL + 1.0
    finally:
        for agent in agents:
            agent.stop.set()
        srv.stop()
