"""The state file's pool of readers (gpulayer/server/store/readers.py): lent one at a time, the last given back
first, a take that finds none free waits for a give or its timeout; many threads never hold one at once."""
from __future__ import annotations

import threading

from gpulayer.server.store.readers import ReaderPool

JOIN_S = 30


def test_the_last_given_back_is_the_next_taken_and_an_empty_pool_times_out():
    pool = ReaderPool(["a", "b"])
    first, second = pool.take(1), pool.take(1)
    assert {first, second} == {"a", "b"}
    assert pool.take(0.05) is None
    pool.give(first)
    pool.give(second)
    assert pool.take(1) == second


def test_a_waiting_take_gets_the_reader_given_back():
    pool = ReaderPool(["only"])
    held = pool.take(1)
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(pool.take(JOIN_S)))
    waiter.start()
    pool.give(held)
    waiter.join(JOIN_S)
    assert got == ["only"]


def test_many_threads_never_share_a_reader():
    pool = ReaderPool(list(range(3)))
    in_use: set = set()
    guard = threading.Lock()
    errors: list = []

    def work():
        for _ in range(2000):
            item = pool.take(JOIN_S)
            if item is None:
                errors.append("timed out")
                return
            with guard:
                if item in in_use:
                    errors.append(f"{item} lent twice")
                in_use.add(item)
            with guard:
                in_use.discard(item)
            pool.give(item)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S * 4)
    assert not errors and sorted(pool.take(1) for _ in range(3)) == [0, 1, 2]
