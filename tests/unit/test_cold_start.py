"""Scale to zero's held requests (gpulayer/server/relay/cold_start.py) on a real asyncio loop, the scheduler's
reads and wake-up faked: held until a replica is ready (one wake-up and one poller for all of them), 503
`cold_start_timeout` past the timeout, 503 `cold_start_queue_full` at once past `max_held`, the count of held
requests back to zero whatever happened."""
from __future__ import annotations

import asyncio

import pytest

from gpulayer.server.relay.cold_start import ColdStartFull, ColdStarts, ColdStartTimeout, serving
from gpulayer.server.runtime.ingress_counters import Counters
from gpulayer.server.scheduler.ingress import Ingress
from gpulayer.server.scheduler.sessions import Target

REPLICA = Target(7, 70, 0, 1, "w", ("tcp",), False, "t")


def _ingress(replicas=(), state="running", cold=(0.5, 3)) -> Ingress:
    return Ingress(7, state, "public", None, tuple(replicas), tuple(8000 for _ in replicas), cold)


class Fake:
    def __init__(self, ready_after: int | None):
        self.reads, self.wakes, self.ready_after = 0, 0, ready_after

    async def read(self, job_id):
        self.reads += 1
        return _ingress([REPLICA] if self.ready_after is not None and self.reads > self.ready_after else [])

    async def wake(self, job_id):
        self.wakes += 1


def test_held_requests_go_to_the_first_ready_replica_after_one_wake_up():
    counters, fake = Counters(), Fake(ready_after=3)
    cold = ColdStarts(counters, fake.read, fake.wake)

    async def run():
        return await asyncio.gather(*(cold.wait(_ingress()) for _ in range(3)))

    got = asyncio.run(run())
    assert [g.replicas for g in got] == [(REPLICA,)] * 3
    assert fake.wakes == 1 and fake.reads == 4 and not counters.held and not cold.waking


def test_past_the_timeout_503_and_past_max_held_503_at_once():
    counters, fake = Counters(), Fake(ready_after=None)
    cold = ColdStarts(counters, fake.read, fake.wake)

    async def run():
        first = asyncio.ensure_future(cold.wait(_ingress(cold=(0.3, 1))))
        await asyncio.sleep(0.05)
        assert counters.held[7] == 1 and counters.stats()["held"] == {7: 1}   # /metrics' gpulayer_ingress_held
        with pytest.raises(ColdStartFull, match="already holds 1 requests"):
            await cold.wait(_ingress(cold=(0.3, 1)))
        with pytest.raises(ColdStartTimeout, match="within 0.3 s") as caught:
            await first
        return caught.value

    timeout = asyncio.run(run())
    assert (timeout.status, timeout.code) == (503, "cold_start_timeout")
    assert not counters.held and counters.stats()["held"] == {}
    assert counters.stats()["cold_refused"] == {(7, "cold_start_queue_full"): 1, (7, "cold_start_timeout"): 1}


def test_a_service_that_ended_meanwhile_answers_none():
    counters = Counters()

    async def ended(job_id):
        return _ingress(state="cancelled")

    async def wake(job_id):
        return None

    assert asyncio.run(ColdStarts(counters, ended, wake).wait(_ingress())) is None
    assert serving(_ingress([REPLICA]), frozenset()) and not serving(_ingress([REPLICA]), frozenset({70}))
