"""A stopping control plane does not wait for parked acquires to time out."""
from __future__ import annotations

import threading
import time

from helpers import add_worker

from gpulayer.testing import wait_for


def test_stop_waiting_releases_parked_acquires_at_once(sched):
    w = add_worker(sched, "w")
    answers = []
    parked = threading.Thread(target=lambda: answers.append(sched.acquire(w, wait_s=20)))
    began = time.monotonic()
    parked.start()
    wait_for(lambda: sched.parked_acquires == 1, 5, "the acquire to park")
    sched.stop_waiting()
    parked.join(5)
    assert not parked.is_alive(), "a parked acquire outlived stop_waiting()"
    assert answers == [None] and sched.parked_acquires == 0
    assert time.monotonic() - began < 3
    assert sched.acquire(w, wait_s=20) is None  # later acquires do not park either
