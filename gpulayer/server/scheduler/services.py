"""The scheduler's calls for services that follow their traffic (issue 39): drain a replica, and upkeep's
step that stops the drained ones (service_drain.py). The ingress's in-flight counts come from memory
(runtime/ingress_counters.py), read off the proxy's loop."""
from __future__ import annotations

from gpulayer.server.scheduler import service_drain
from gpulayer.server.scheduler.facade import Facade


class Services(Facade):
    """Service replicas leaving (drain) on the writer path."""

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
