"""Every read of the state file has a deadline (gpulayer/server/store/deadline.py, datasette's habit): a read
past `read_timeout_s` is stopped by SQLite's progress handler and answered ReadTimeout (503 read_timeout, the
error shape); the reader it held is given back usable, outside any transaction."""
from __future__ import annotations

import time

import pytest

from gpulayer.server.errors import ReadTimeout, Unavailable
from gpulayer.server.store.db import READ_TIMEOUT_S, Store

# Counts to a billion: minutes of SQLite's virtual machine, so only the deadline ends it.
ENDLESS = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000000000) SELECT count(*) FROM n"
LIMIT_S = 0.2


def _endless(conn):
    return conn.execute(ENDLESS).fetchall()


def _jobs(conn):
    return conn.execute("SELECT count(*) AS n FROM jobs").fetchall()[0]["n"]


@pytest.fixture
def one_reader(config):
    """A store with one reader, so the read after a stopped one runs on the very connection it stopped on."""
    s = Store(config.layout.state, readers=1, read_timeout_s=LIMIT_S)
    yield s
    s.close()


@pytest.mark.parametrize("how", ["read", "read_statement"])
def test_a_read_past_its_deadline_answers_503_and_leaves_the_reader_usable(one_reader, how):
    started = time.monotonic()
    with pytest.raises(ReadTimeout) as caught:
        getattr(one_reader, how)(_endless)
    took = time.monotonic() - started
    assert LIMIT_S <= took < LIMIT_S + 2, took
    error = caught.value
    assert isinstance(error, Unavailable) and error.status == 503
    body = error.to_dict()
    assert body["error"]["code"] == "read_timeout"
    assert f"{LIMIT_S:g} s" in body["error"]["message"] and "--read-timeout" in body["error"]["message"]
    # The same (only) reader answers the next read, outside any transaction, with no deadline left set.
    assert one_reader.read(_jobs) == 0
    assert one_reader.read_statement(lambda conn: conn.getautocommit()) is True
    with one_reader.reading() as conn:
        assert not conn.getautocommit()
    time.sleep(LIMIT_S * 1.5)  # past the stopped read's deadline: a handler left behind would interrupt this one
    assert one_reader.read_statement(
        lambda conn: conn.execute("SELECT count(*) FROM (WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL "
                                  "SELECT i + 1 FROM n WHERE i < 100000) SELECT i FROM n)").fetchall()[0])


def test_writes_have_no_read_deadline(one_reader):
    """The writer's connection is not a reader: a write transaction longer than the read deadline commits."""
    def slow_write(conn):
        conn.execute("CREATE TEMP TABLE IF NOT EXISTS t(x)")
        return conn.execute("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3000000) "
                            "SELECT count(*) AS c FROM n").fetchall()[0]["c"]
    assert one_reader.write(slow_write) == 3_000_000


def test_the_default_deadline_is_generous():
    assert READ_TIMEOUT_S >= 10


def test_close_waits_for_a_read_on_another_thread_then_stops_it_and_later_reads_are_refused(config, monkeypatch):
    """A stop while a background read runs (a forecast's snapshot) closed its busy connection: apsw's
    ThreadingViolationError failed the server's stop (exit 1). Now the read is waited for, then interrupted."""
    import threading

    import gpulayer.server.store.db as db
    monkeypatch.setattr(db, "CLOSE_WAIT_S", 0.2)
    store = Store(config.layout.state, readers=2, read_timeout_s=60)
    outcome: list[BaseException] = []
    reading = threading.Thread(target=lambda: _caught(outcome, store.read, _endless))
    reading.start()
    time.sleep(0.1)  # the endless read is under way
    started = time.monotonic()
    store.close()    # raised ThreadingViolationError before
    reading.join(10)
    assert not reading.is_alive() and time.monotonic() - started < 5
    assert len(outcome) == 1 and isinstance(outcome[0], ReadTimeout)  # stopped, as a read past its deadline is
    with pytest.raises(Unavailable, match="closed"):
        store.read(_jobs)


def _caught(into: list, fn, *args):
    try:
        fn(*args)
    except BaseException as exc:  # noqa: BLE001 - the test reads what ended it
        into.append(exc)
