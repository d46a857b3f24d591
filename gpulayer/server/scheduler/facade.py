"""The scheduler's bound parts: one store, clock and config, the writer path and the wake-up of parked acquires.

`core.Scheduler` is this facade with the calls on it (worker_requests.WorkerRequests: an agent's
requests; core: the clients', the operators' and upkeep's). Everything a call shares lives here.
"""
from __future__ import annotations

import threading
import time
from functools import cached_property
from typing import Callable

from gpulayer.server.config import ControlPlaneConfig
from gpulayer.server.runtime import cadence, gpu_samples, renewals
from gpulayer.server.runtime.cascades import Cascades
from gpulayer.server.runtime.estimates import Estimates
from gpulayer.server.runtime.follow import LogFollowers
from gpulayer.server.runtime.ingress_counters import Counters
from gpulayer.server.runtime.pace import Pace
from gpulayer.server.runtime.relay_wants import Wants
from gpulayer.server.scheduler import cascades, forecast, gauges, outcomes, reconcile
from gpulayer.server.security.auth import Authenticator
from gpulayer.server.security.secretbox import SecretBox
from gpulayer.server.store.artifacts import ArtifactStore
from gpulayer.server.store.db import Store
from gpulayer.server.store.queries import QUERIES


class Facade:
    """Bound to one store, clock and config: the state every call shares, the writer path (`_write`, which
    drives the cascades a write asked for) and the wake-up of parked acquires."""

    def __init__(self, store: Store, config: ControlPlaneConfig, clock: Callable[[], float] = time.time, *,
                 auth: Authenticator | None = None, artifacts: ArtifactStore | None = None):
        self.store = store
        self.config = config
        self.clock = clock
        if auth is not None:
            self.auth = auth
            auth.on_invalidate(self._rights_changed)
        if artifacts is not None:
            self.artifacts = artifacts
        self.secret_box = SecretBox(config.layout)
        self.log_followers = LogFollowers(store, config.max_parked_log_polls)
        self._wake = threading.Condition()
        self._generation = 0
        # The generation the last plan of reservations was made at (-1: none yet): the first claim after the
        # generation moves plans again (worker_requests._claim_planned).
        self._planned_generation = -1
        self._parked = threading.BoundedSemaphore(max(1, config.max_parked_acquires))
        self._closing = False
        self._waiting = 0  # acquires inside self._wake.wait(): what a wake() reaches now
        self.observe_acquire: Callable[[float], None] = lambda seconds: None
        # In a front-end process (--front-ends N > 1): the writer process runs each write (server/multiproc/).
        self.remote_write: Callable[..., object] | None = None
        # Set when this plane was restored from a replica (ControlPlane.start): heartbeats reconcile against it.
        self.restored: reconcile.Restored | None = None
        # Big cancels, cascades and releases: one bounded write a step (scheduler/cascades.py).
        self.cascades = Cascades(self._write_step, outcomes.run_step, clock, after_step=self._cascade_stepped)
        self._cascades_recovered = False
        self._submit_locks: dict[int, threading.Lock] = {}
        self._submit_locks_guard = threading.Lock()
        # Per user, a number no smaller than their tasks not yet ended (the cap's count plus what they submitted
        # since): a submit that stays under the cap with it needs no count. Only submits add such tasks, but for
        # `job requeue`, which forgets them all (the generation: a count taken before a requeue is not kept).
        self._queued_bounds: dict[int, int] = {}
        self._queued_generation = 0
        # Lease renewals not yet in SQL: heartbeats that change nothing and other worker requests (renewals.py).
        self.renewals = renewals.Renewals()
        # GPU samples heartbeats brought, written with the renewals at each upkeep tick (gpu_samples.py).
        self.gpu_samples = gpu_samples.Buffer()
        # The heartbeat interval asked for and the lease TTL given, scaled with the online fleet (cadence.py).
        self.cadence = cadence.Cadence(config.heartbeat_interval_s, config.lease_ttl_s, config.max_heartbeats_per_s,
                                       config.heartbeat_jitter, clock)
        # Each array job's recent element run time, for how many elements to lease ahead (chunks.py).
        self.pace = Pace()
        # Workers whose relay link a client waits for (sessions.py): told `relay: true`.
        self.relay = Wants(self.wake)
        # Requests and bytes through the services' ingress (ingress.py; the proxy is server/relay/ingress.py).
        self.ingress = Counters()
        # The latest start-time forecast of the waiting jobs, and when to make the next (runtime/estimates.py).
        self.estimates = Estimates(store, clock, interval_s=config.estimate_interval_s,
                                   max_jobs=config.estimate_max_jobs, horizon_s=config.estimate_horizon_s,
                                   publish=self.record_forecast)

    def record_forecast(self, made: forecast.Forecast) -> int:
        """A forecast's estimates into the `estimates` table, the last one's replaced (one write)."""
        return self._write(forecast.record, made)

    # -- wake-up -------------------------------------------------------------

    def wake(self) -> None:
        """Something may have become placeable: parked acquires look again."""
        with self._wake:
            self._generation += 1
            self._wake.notify_all()

    def stop_waiting(self) -> None:
        """The server is stopping: parked acquires answer "no task" now instead of at their deadline."""
        with self._wake:
            self._closing = True
            self._generation += 1
            self._wake.notify_all()

    @property
    def generation(self) -> int:
        """How many times something may have become placeable (a wake-up): it moves as the queue changes."""
        with self._wake:
            return self._generation

    @property
    def parked_acquires(self) -> int:
        """How many acquire calls wait on the wake-up now (a wake() or submit reaches each of them)."""
        with self._wake:
            return self._waiting

    def gauges(self) -> dict:
        """The state file's counts that /metrics reports, read now (scheduler/gauges.py, `snapshot`)."""
        return self.store.read(gauges.snapshot)

    @cached_property
    def auth(self) -> Authenticator:
        made = Authenticator(self.config.layout, self.store, QUERIES)
        made.on_invalidate(self._rights_changed)
        return made

    def _rights_changed(self) -> None:
        """Principals changed (auth.invalidate): parked log follows and acquires wake to re-check their caller."""
        self.wake()
        self.log_followers.written()

    @cached_property
    def artifacts(self) -> ArtifactStore:
        return ArtifactStore(self.config.layout.artifacts)

    def _write(self, fn, *args, wake: bool = False, until_ended: int | None = None,
               inline: int = cascades.INLINE_STEPS, **kwargs):
        """fn in a write; then the cascade steps it asked for (runtime/cascades.py's Cascades.drive: `inline` of them
        here, and those of job `until_ended` until it has ended; the rest on the cascade thread). In a front-end
        process the writer process does all that (`remote_write`), and this process's parked acquires wake."""
        if self.remote_write is not None:
            result = self.remote_write(fn, args, kwargs, wake=wake, until_ended=until_ended, inline=inline)
            if wake:
                self.wake()
            return result
        with cascades.collecting() as steps:
            result = self.store.write(fn, *args, **kwargs)
        if wake:
            self.wake()
        if steps:
            self.cascades.drive(steps, until_ended, inline)
        return result

    def _write_step(self, fn):
        """One cascade step's write (the runtime's Cascades runs it): the store's writer, looked up at each step."""
        return self.store.write(fn)

    def _cascade_stepped(self) -> None:
        """A cascade step committed: it may have released tasks (acquires look again) or ended jobs."""
        self.wake()
        self.log_followers.written()

    def _forget_principals(self) -> None:
        if "auth" in self.__dict__:  # no authenticator made yet: nothing cached to forget
            self.auth.invalidate()

    def lease_ttl_s(self) -> float:
        """The TTL a renewal gives now: the configured one scaled with the fleet (cadence.py)."""
        return self.cadence.lease_ttl_s()

    def seen(self, worker_id: int) -> None:
        """A worker request other than a heartbeat: it renews the worker's leases as one would (renewals.py)."""
        self.renewals.note(worker_id, self.clock())
