"""A worker that joins with the name of an online worker is let in, and told (an event, a warning)."""
from __future__ import annotations

from helpers import SERVER_JOIN


def _register(sched, name, session):
    body = {"name": name, "labels": {}, "slots": 1, "version": "test",
            "resources": {"cpus": 1, "gpus": 0, "memory_mb": 1000, "gpu_models": []}}
    return sched.register(body=body, token=SERVER_JOIN, session_hash=session, peer_address="127.0.0.1")


def _kinds(sched):
    return [e["kind"] for e in sched.store.read(lambda c: c.execute("SELECT kind FROM events").fetchall())]


def test_a_namesake_of_an_online_worker_is_warned(sched):
    first = _register(sched, "gpu-01", "s1")
    assert "warnings" not in first
    second = _register(sched, "gpu-01", "s2")
    assert second["worker_id"] != first["worker_id"]
    assert second["warnings"] == [f"a worker named 'gpu-01' is online already (worker {first['worker_id']}): "
                                  "unless it is this machine's previous run, give this one another --name"]
    assert _kinds(sched).count("worker_name_in_use") == 1
    assert "warnings" not in _register(sched, "gpu-02", "s3")


def test_a_namesake_of_a_departed_worker_is_not(sched):
    first = _register(sched, "gpu-01", "s1")
    sched.deregister(first["worker_id"])
    assert "warnings" not in _register(sched, "gpu-01", "s2")
