"""The scheduler's calls for services that follow their traffic (issue 39): drain a replica, upkeep's step that
stops the drained ones (service_drain.py), and upkeep's autoscaler (autoscale.py). The ingress's requests in
flight come from memory (runtime/ingress_counters.py), read off the proxy's loop."""
from __future__ import annotations

from functools import cached_property

from gpulayer.server.runtime.autoscale import Windows
from gpulayer.server.scheduler import autoscale, service_drain
from gpulayer.server.scheduler.facade import Facade


class Services(Facade):
    """Service replicas leaving (drain) and following the load (autoscale), on the writer path."""

    @cached_property
    def windows(self) -> Windows:
        """The autoscaler's samples of each service's load (runtime/autoscale.py)."""
        return Windows()

    def drain_replica(self, task_id: int, deadline_s: float = service_drain.DEFAULT_DEADLINE_S,
                      why: str = "scale_down") -> dict | None:
        """Start draining replica `task_id` (service_drain.drain_replica): out of the ingress's set at once,
        stopped once nothing is in flight to it, or at `deadline_s`. None: no live replica, or draining already."""
        task = self._write(service_drain.drain_replica, self.clock(), task_id, deadline_s, why, wake=True)
        if task is not None and task["state"] != "cancelled":
            self.ingress.draining = self.ingress.draining | {task_id}
        return task

    def advance_service_drains(self) -> list[int]:
        """Upkeep: stop the draining replicas with nothing in flight (or past their deadline); the task ids told
        to stop. Also refreshes the proxy's set of draining replicas from the state file (drains that another
        call started in its own transaction)."""
        found = self.store.read(service_drain.draining)
        self.ingress.draining = frozenset(t["id"] for t in found)
        if not any(not t["cancel_requested"] for t in found):
            return []
        return self._write(service_drain.advance, self.clock(), self.ingress.in_flight())

    def wake_service(self, job_id: int) -> dict | None:
        """A request held by the ingress for service `job_id` at zero (relay/cold_start.py): a replica now
        (autoscale.wake); None when one is on its way already or the service does not scale to zero."""
        made = self._write(autoscale.wake, self.clock(), job_id, self.ingress.held_now().get(job_id, 0), wake=True)
        if made is not None:
            self.windows.reset(job_id, self.clock())
        return made

    def autoscale(self) -> list[dict]:
        """Upkeep: sample each autoscaled service's requests in flight through the ingress (held ones included)
        and scale it where its window says so (autoscale.decide); the decisions made."""
        found = self.store.read(autoscale.services)
        now, in_flight, held = self.clock(), self.ingress.in_flight(), self.ingress.held_now()
        self.windows.keep({s.job_id for s in found})
        made = []
        for service in found:
            scale = service.scale
            load = sum(in_flight.get(r.task_id, 0) for r in service.live) + held.get(service.job_id, 0)
            self.windows.add(service.job_id, now, load, max(scale["up_after_s"], scale["down_after_s"]))
            decision = autoscale.decide(service, self.windows.window(service.job_id, now, scale["up_after_s"]),
                                        self.windows.window(service.job_id, now, scale["down_after_s"]))
            if decision is None:
                continue
            done = self._write(autoscale.apply, now, service.job_id, len(service.live), decision, service.ready,
                               wake=True)
            if done is not None:
                self.windows.reset(service.job_id, now)
                made.append(done)
        if any(d["drained"] for d in made):
            self.advance_service_drains()  # the proxy's set of draining replicas, now
        return made
