"""The heartbeat interval the server asks for, scaled with the fleet and jittered, and the lease TTL it implies.

As Nomad scales its heartbeat TTLs (`max_heartbeats_per_second`): with `n`
online workers and a target of `max_per_s` heartbeats a second in all, the
interval is `max(base, n / max_per_s)`, never below the configured base
interval. The lease TTL scales by the same factor, so the TTL a worker holds is
always the configured TTL/interval ratio times its interval (10 by default:
20 s over 2 s). An old agent that ignores the interval in the answers beats at
the base interval and holds the scaled TTL: longer, never shorter, than it
needs.

Each worker's interval is lengthened by a fraction of at most `jitter`, its
own (spread from its id, the same in every answer while the fleet's scale
holds: the agent logs each change of interval), so a restarted fleet does not
beat in lockstep and the mean rate stays under the target; capped so that the
longest interval told stays within a third of the TTL (a tight `--lease-ttl 6
--heartbeat-interval 2` gets no jitter).

Transitions: a growing fleet lengthens the TTL at once and the interval at each
worker's next answer. A shrinking fleet shortens the interval at once, but the
TTL keeps the larger scale for one larger TTL (`held`): a worker told the longer
interval just before is answered (and told the shorter one) well within it, so
no lease is judged on a TTL shorter than its worker was promised.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import apsw

from gpulayer.protocol import HEARTBEAT_JITTER, MAX_HEARTBEATS_PER_S
from gpulayer.server.store.queries import row

MIN_INTERVALS_PER_TTL = 3.0  # the jitter never makes an interval longer than a third of the TTL


def fleet_scale(workers: int, base_interval_s: float, max_per_s: float) -> float:
    """How many base intervals the fleet's interval is (≥ 1): `workers` beats per interval stay ≤ `max_per_s`
    a second. 0 or less for `max_per_s`: no scaling."""
    if max_per_s <= 0:
        return 1.0
    return max(1.0, workers / (max_per_s * base_interval_s))


def jitter_cap(base_interval_s: float, lease_ttl_s: float, jitter: float) -> float:
    """The jitter used: at most `jitter`, and no more than keeps (1 + jitter) intervals ≤ TTL / 3."""
    return max(0.0, min(jitter, lease_ttl_s / (MIN_INTERVALS_PER_TTL * base_interval_s) - 1.0))


class Cadence:
    """The fleet's heartbeat interval and lease TTL now; `fleet()` is told the online count (upkeep, start-up)."""

    def __init__(
        self,
        base_interval_s: float,
        lease_ttl_s: float,
        max_per_s: float = MAX_HEARTBEATS_PER_S,
        jitter: float = HEARTBEAT_JITTER,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.base_interval_s, self.base_ttl_s, self.max_per_s = base_interval_s, lease_ttl_s, max_per_s
        self.jitter = jitter_cap(base_interval_s, lease_ttl_s, jitter)
        self._clock = clock or (lambda: 0.0)
        self._lock = threading.Lock()
        self._scale = 1.0
        self._held, self._held_until = 1.0, 0.0
        self.workers = 0

    def fleet(self, workers: int, *, hold: bool = False) -> None:
        """`workers` are online now. `hold`: keep the TTL at this scale for one such TTL whatever follows
        (at start-up: workers may have been told this interval by the process before)."""
        new = fleet_scale(workers, self.base_interval_s, self.max_per_s)
        with self._lock:
            now = self._clock()
            self.workers = workers
            if new < self._scale or hold:
                top = max(self._scale, new)
                valid = now < self._held_until
                self._held = max(self._held, top) if valid else top
                self._held_until = max(self._held_until if valid else 0.0, now + self.base_ttl_s * top)
            self._scale = new

    @property
    def scale(self) -> float:
        return self._scale

    def lease_ttl_s(self) -> float:
        """The TTL a renewal gives now: the configured one times the fleet's scale (or the held, larger one)."""
        with self._lock:
            held = self._held if self._clock() < self._held_until else 1.0
            return self.base_ttl_s * max(self._scale, held)

    def interval_s(self, worker_id: int | None = None) -> float:
        """The interval asked of `worker_id`: the fleet's, lengthened by its own fraction of the jitter
        (none without an id)."""
        spread = 0.0 if worker_id is None else spread_of(worker_id)
        return round(self.base_interval_s * self._scale * (1.0 + self.jitter * spread), 3)


def spread_of(worker_id: int) -> float:
    """A fraction in [0, 1) of the worker's own, evenly spread over consecutive ids (Knuth's multiplicative hash)."""
    return ((worker_id * 2654435761) % 2**32) / 2**32


def online_workers(conn: apsw.Connection) -> int:
    """How many workers are online (the fleet the interval is scaled for)."""
    found = row(conn, "online_workers_count")
    return int(found["n"]) if found else 0
