"""Scale to zero through the ingress: a request for a service at zero is held while a replica starts
(issue 39, point 2; docs/access.md, "Scale to zero").

A service with `service.autoscale.min` 0 and no replica in the ingress's set has its requests held here, up to
`cold_start_timeout_s` each and at most `max_held` at once (one more: 503 `cold_start_queue_full` at once). The
first held request asks the scheduler for a replica now (`Scheduler.wake_service`: a write, off the loop; a
replica already on its way makes it a no-op), and one poller per service reads the ingress's set every
`POLL_S` (off the loop, uncached) until a replica is ready, which every held request then goes to. A held
request past its timeout is answered 503 `cold_start_timeout`; both are counted by code, and the requests held
now by service, on /metrics (`gpulayer_ingress_cold_start_refused`, `gpulayer_ingress_held`). Held requests count as the service's load
(`Counters.held`), so the autoscaler neither scales it to zero again meanwhile nor undersizes it.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from gpulayer.server.errors import GpulayerError
from gpulayer.server.runtime.ingress_counters import Counters
from gpulayer.server.scheduler.ingress import Ingress

POLL_S = 0.05  # how often the held requests' poller reads the ingress's set


class ColdStartTimeout(GpulayerError):
    code = "cold_start_timeout"
    status = 503


class ColdStartFull(GpulayerError):
    code = "cold_start_queue_full"
    status = 503


class ColdStarts:
    """The requests held per service at zero, and each service's poller for its first ready replica."""

    def __init__(self, counters: Counters, read: Callable[[int], Awaitable[Ingress | None]],
                 wake: Callable[[int], Awaitable[object]]):
        """`read(job_id)`: the job's ingress read now (no cache); `wake(job_id)`: ask for a replica now."""
        self.counters, self.read, self.wake = counters, read, wake
        self.waking: dict[int, asyncio.Future] = {}

    async def wait(self, found: Ingress) -> Ingress | None:
        """Hold until a replica of `found`'s service is ready: its ingress then (None: the service ended).
        ColdStartFull at once when `max_held` requests are held already; ColdStartTimeout past the timeout."""
        assert found.cold_start is not None
        timeout_s, max_held = found.cold_start
        job_id, held = found.job_id, self.counters.held
        if held[job_id] >= max_held:
            self.counters.cold_refused[(job_id, ColdStartFull.code)] += 1
            raise ColdStartFull(f"job {job_id} is starting a replica (it was scaled to zero) and already holds {max_held} "
                                "requests (`service.autoscale.max_held`): try again in a moment")
        held[job_id] += 1
        try:
            future = self.waking.get(job_id)
            if future is None or future.done():
                future = self.waking[job_id] = asyncio.get_running_loop().create_future()
                asyncio.ensure_future(self._poll(job_id, future))
            return await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except asyncio.TimeoutError:
            self.counters.cold_refused[(job_id, ColdStartTimeout.code)] += 1
            raise ColdStartTimeout(f"job {job_id} was scaled to zero and no replica of it became ready within "
                                   f"{timeout_s:g} s (`service.autoscale.cold_start_timeout_s`); one may still be "
                                   "starting: try again") from None
        finally:
            held[job_id] -= 1
            if held[job_id] <= 0:
                del held[job_id]

    async def _poll(self, job_id: int, future: asyncio.Future) -> None:
        """Ask for a replica, then read the ingress's set until one is ready (or nobody waits any more)."""
        try:
            await self.wake(job_id)
            while self.counters.held.get(job_id, 0) > 0:
                found = await self.read(job_id)
                if found is None or found.state not in ("queued", "running") or found.replicas:
                    future.set_result(found if found is not None and found.replicas else None)
                    return
                await asyncio.sleep(POLL_S)
        except Exception as exc:  # noqa: BLE001 - the held requests get it (a 500 each), the next one tries again
            if not future.done():
                future.set_exception(exc)
        finally:
            if not future.done():
                future.cancel()
            if self.waking.get(job_id) is future:
                del self.waking[job_id]


def serving(found: Ingress, draining: frozenset[int]) -> bool:
    """Whether any replica in `found`'s set is not draining (one a request may go to)."""
    return any(r.task_id not in draining for r in found.replicas)


__all__ = ["ColdStartFull", "ColdStartTimeout", "ColdStarts", "POLL_S", "serving"]
