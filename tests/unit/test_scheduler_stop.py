"""A stopping control plane does not wait for parked acquires to time out."""
from __future__ import annotations

import threading
import time

from helpers import add_worker


def test_stop_waiting_releases_parked_acquires_at_once(sched):
    w = add_worker(sched, "w")
    answers = []
    parked = threading.Thread(target=lambda: answers.append(sched.acquire(w, wait_s=20)))
    began = time.monotonic()
    parked.start()
    time.sleep(0.2)
    sched.stop_waiting()
    parked.join(5)
    assert not parked.is_alive() and answers == [None]
    assert time.monotonic() - began < 3
    assert sched.acquire(w, wait_s=20) is None  # later acquires do not park either
