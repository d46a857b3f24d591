"""The granian bridge's thread pool (gpulayer/server/frontends/granian_bridge.py, `_Pool`) on a real asyncio loop.

Each call's result or exception reaches its own future, however many finish between two wake-ups of the
loop; no more threads than asked for are started; a call whose request was given up first does not run;
closing cancels the calls not started.
"""
from __future__ import annotations

import asyncio
import threading

import pytest

from gpulayer.server.frontends.granian_bridge import _Pool

JOIN_S = 30


def test_every_call_gets_its_own_answer_and_the_threads_stay_bounded():
    loop = asyncio.new_event_loop()
    pool = _Pool(loop, 4, "test-pool")
    threads_seen: set[str] = set()

    def call(i: int) -> int:
        threads_seen.add(threading.current_thread().name)
        if i % 7 == 0:
            raise ValueError(f"call {i}")
        return i * i

    async def main():
        return await asyncio.gather(*(pool.submit(call, i) for i in range(500)), return_exceptions=True)

    try:
        answers = loop.run_until_complete(asyncio.wait_for(main(), JOIN_S))
    finally:
        pool.close()
        loop.close()
    for i, answer in enumerate(answers):
        if i % 7 == 0:
            assert isinstance(answer, ValueError) and str(answer) == f"call {i}"
        else:
            assert answer == i * i
    assert 1 <= len(pool.threads) <= 4 and len(threads_seen) <= 4


def test_an_idle_thread_is_reused_rather_than_a_new_one_started():
    loop = asyncio.new_event_loop()
    pool = _Pool(loop, 8, "test-pool")

    async def main():
        for i in range(20):   # one at a time: the thread of the first call is idle for each next one
            assert await pool.submit(lambda x: x + 1, i) == i + 1

    try:
        loop.run_until_complete(asyncio.wait_for(main(), JOIN_S))
    finally:
        pool.close()
        loop.close()
    assert len(pool.threads) == 1


def test_a_call_given_up_before_it_ran_does_not_run_and_close_cancels_the_calls_not_started():
    loop = asyncio.new_event_loop()
    pool = _Pool(loop, 1, "test-pool")
    ran: list[str] = []

    def holder(name: str):
        holding, release = threading.Event(), threading.Event()

        def hold():
            holding.set()
            assert release.wait(JOIN_S)
            ran.append(name)

        return hold, holding, release

    async def main():
        hold, holding, release = holder("first")
        first = pool.submit(hold)
        given_up = pool.submit(ran.append, "given up")
        queued = pool.submit(ran.append, "queued")
        await loop.run_in_executor(None, holding.wait, JOIN_S)
        given_up.cancel()   # its request went away while the one thread was busy
        release.set()
        await first
        await queued
        hold, holding, release = holder("second")
        second = pool.submit(hold)
        not_started = pool.submit(ran.append, "not started")
        await loop.run_in_executor(None, holding.wait, JOIN_S)
        pool.close()
        release.set()
        await second
        return not_started

    try:
        not_started = loop.run_until_complete(asyncio.wait_for(main(), JOIN_S))
    finally:
        loop.close()
    assert not_started.cancelled()
    for thread in pool.threads:
        thread.join(JOIN_S)
        assert not thread.is_alive()
    assert ran == ["first", "queued", "second"]
    with pytest.raises(RuntimeError):
        pool.submit(ran.append, "after close")
