"""Heartbeats off the write path (scheduler/renewals.py): one that changes nothing writes nothing, its
renewal reaches SQL at the next flush (upkeep's expire), and leases are still judged as before."""
from __future__ import annotations

import pytest

from helpers import add_worker, job

RUNNING = {"state": "running", "endpoint": None, "restarts": 0}


@pytest.fixture
def writes(sched):
    """The writer transactions the scheduler asks for, by function name (the real store underneath)."""
    made: list[str] = []
    real = sched.store.write

    def counting(fn, *args, **kwargs):
        made.append(getattr(fn, "__name__", repr(fn)))
        return real(fn, *args, **kwargs)
    sched.store.write = counting
    return made


def lease_in_sql(sched, table: str, row_id: int) -> float:
    return sched.store.read(lambda c: c.execute(f"SELECT lease_expires_at AS l FROM {table} WHERE id = ?",
                                                (row_id,)).fetchall())[0]["l"]


def running_task(sched, w) -> int:
    sched.submit(job())
    task_id = sched.acquire(w)["task_id"]
    sched.start(w, task_id, 100)
    sched.expire()  # what the acquire and start noted is in SQL
    return task_id


def test_a_heartbeat_that_changes_nothing_writes_nothing(sched, clock, writes):
    w = add_worker(sched)
    task_id = running_task(sched, w)
    writes.clear()
    version = sched.store.read(lambda c: c.execute("PRAGMA data_version").fetchall())
    for _ in range(5):
        clock.advance(0.5)
        answer = sched.heartbeat(w, [{"task_id": task_id, **RUNNING}])
        assert answer == {"cancel_task_ids": [], "revoked": False, "lease_expires_at": clock.now + 3.0}
    assert writes == []
    assert sched.store.read(lambda c: c.execute("PRAGMA data_version").fetchall()) == version
    # One that changes something (a new endpoint) takes the write path, as before.
    sched.heartbeat(w, [{"task_id": task_id, "state": "running", "endpoint": "10.0.0.1:80", "restarts": 0}])
    assert writes == ["heartbeat"]


def test_a_flush_brings_sql_within_one_interval_of_the_last_heartbeat(sched, clock):
    w = add_worker(sched)
    task_id = running_task(sched, w)
    before = lease_in_sql(sched, "workers", w)
    clock.advance(1.0)
    sched.heartbeat(w, [{"task_id": task_id, **RUNNING}])
    assert lease_in_sql(sched, "workers", w) == before  # noted, not written
    assert len(sched.renewals) == 1
    clock.advance(0.5)  # the next upkeep tick (at most one second later)
    assert sched.expire() == {"tasks_lost": 0, "workers_offline": 0, "gangs_released": 0}
    assert lease_in_sql(sched, "workers", w) == clock.now - 0.5 + 3.0
    assert lease_in_sql(sched, "tasks", task_id) == clock.now - 0.5 + 3.0
    assert len(sched.renewals) == 0


def test_expire_flushes_first_so_a_noted_renewal_is_never_judged_stale(sched, clock):
    w = add_worker(sched)
    task_id = running_task(sched, w)
    for _ in range(8):  # 4 s of heartbeats, past the 3 s TTL of the last value in SQL, no flush between
        clock.advance(0.5)
        sched.heartbeat(w, [{"task_id": task_id, **RUNNING}])
    assert lease_in_sql(sched, "workers", w) < clock.now
    assert sched.expire() == {"tasks_lost": 0, "workers_offline": 0, "gangs_released": 0}


def test_a_worker_that_stops_heartbeating_is_still_lost_after_its_ttl(sched, clock):
    w = add_worker(sched)
    task_id = running_task(sched, w)
    clock.advance(0.5)
    sched.heartbeat(w, [{"task_id": task_id, **RUNNING}])  # its last word, noted only
    clock.advance(2.9)
    assert sched.expire()["tasks_lost"] == 0
    clock.advance(0.2)  # 3.1 s after the last heartbeat
    assert sched.expire() == {"tasks_lost": 1, "workers_offline": 1, "gangs_released": 0}


def test_a_cancel_reaches_the_worker_in_the_next_heartbeat_without_a_write(sched, clock, writes):
    w = add_worker(sched)
    sched.submit(job())
    task = sched.acquire(w)
    sched.start(w, task["task_id"], 100)
    sched.cancel(task["job_id"])
    writes.clear()
    clock.advance(0.5)
    answer = sched.heartbeat(w, [{"task_id": task["task_id"], **RUNNING}])
    assert answer["cancel_task_ids"] == [task["task_id"]]
    assert writes == []


def test_what_changes_state_takes_the_write_path(sched, clock, writes):
    w = add_worker(sched, gpus=1)
    sched.heartbeat(w, [], gpus=[{"index": 0, "uuid": "GPU-a", "healthy": True, "reason": None}])
    writes.clear()
    sched.heartbeat(w, [], gpus=[{"index": 0, "uuid": "GPU-a", "healthy": True, "reason": None}])
    assert writes == []
    sched.heartbeat(w, [{"task_id": 999, **RUNNING}])  # a task it does not hold
    assert writes == ["heartbeat"]
    answer = sched.heartbeat(w, [], gpus=[{"index": 0, "uuid": "GPU-a", "healthy": False, "reason": "xid 79"}])
    assert writes == ["heartbeat", "heartbeat"] and answer["lease_expires_at"] is not None
    clock.advance(10)  # silent past its lease: offline
    sched.expire()
    writes.clear()
    sched.heartbeat(w, [])  # an offline worker coming back
    assert writes == ["heartbeat"]
    assert sched.store.read(lambda c: c.execute("SELECT state FROM workers WHERE id = ?", (w,)).fetchall()) \
        == [{"state": "online"}]


def test_any_worker_request_renews_and_brings_an_offline_worker_back(sched, clock):
    w = add_worker(sched)
    clock.advance(10)
    sched.expire()
    assert sched.acquire(w) is None  # a request of the worker, offline now: noted
    assert sched.expire() == {"tasks_lost": 0, "workers_offline": 0, "gangs_released": 0}
    assert sched.store.read(lambda c: c.execute("SELECT state, lease_expires_at AS l FROM workers WHERE id = ?",
                                                (w,)).fetchall()) == [{"state": "online", "l": clock.now + 3.0}]
    kinds = sched.store.read(lambda c: c.execute("SELECT kind FROM events WHERE worker_id = ? ORDER BY seq",
                                                 (w,)).fetchall())
    assert [k["kind"] for k in kinds][-2:] == ["worker_offline", "worker_online"]


def test_a_kill_loses_the_notes_and_the_restart_grace_covers_them(sched, clock):
    w = add_worker(sched)
    task_id = running_task(sched, w)
    for _ in range(4):
        clock.advance(0.5)
        sched.heartbeat(w, [{"task_id": task_id, **RUNNING}])
    sched.renewals = type(sched.renewals)()  # a new process: the notes are gone
    clock.advance(5.0)  # and it was down past the TTL
    assert sched.restarted() == {"tasks": 1, "workers": 1}
    assert sched.expire() == {"tasks_lost": 0, "workers_offline": 0, "gangs_released": 0}
    clock.advance(2.9)  # the grace: one TTL from the start
    assert sched.expire()["tasks_lost"] == 0
    sched.heartbeat(w, [{"task_id": task_id, **RUNNING}])
    clock.advance(2.9)
    assert sched.expire()["tasks_lost"] == 0


def test_a_parked_acquire_renews_when_it_arrives_and_answers_not_while_it_waits(sched, clock):
    """The server cannot tell a parked worker from one killed while parked: the wait renews nothing (an
    agent that skips its beats parks for at most one interval), so a dead worker is lost one TTL after
    its last request, not after its acquire's deadline."""
    import threading
    import time
    w = add_worker(sched)
    clock.advance(2.0)
    done = threading.Event()
    threading.Thread(target=lambda: (sched.acquire(w, wait_s=0.8), done.set()), daemon=True).start()
    time.sleep(0.2)  # parked now (nothing queued); its arrival was noted
    clock.advance(2.9)  # within the 3 s TTL of the arrival
    assert sched.expire() == {"tasks_lost": 0, "workers_offline": 0, "gangs_released": 0}
    clock.advance(0.2)  # past it, still parked: the wait renewed nothing
    assert sched.expire()["workers_offline"] == 1
    assert done.wait(10)  # its answer is a request: the worker comes back at the next flush
    sched.expire()
    assert sched.store.read(lambda c: c.execute("SELECT state FROM workers WHERE id = ?", (w,)).fetchall()) \
        == [{"state": "online"}]
    clock.advance(3.1)  # no request since the acquire answered
    assert sched.expire()["workers_offline"] == 1
