"""The latest start-time forecast, in process memory, and when to make the next (scheduler/forecast.py).

A forecast is made from a copy of the state file (a read: the writer never waits for it), on a thread of its
own so that upkeep's other jobs do not wait either: every `--estimate-interval` seconds, and sooner when the
queue changed (a submit, a finish: the scheduler's wake-up generation moved), but never sooner than
MIN_GAP_S nor than GAP_FACTOR times the last forecast's own duration after it, so that a big queue's forecast
takes at most a fifth of a core however busy the queue. A restart loses nothing: the first upkeep tick makes
one anew. What a Job shows (`estimated_start_at`, `estimate_reason`) is read from it (`fields`).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from gpulayer.server.scheduler import forecast
from gpulayer.server.store.db import Store

log = logging.getLogger("gpulayer.server.runtime.estimates")

DEFAULT_INTERVAL_S = 30.0  # --estimate-interval: a forecast at least this often while jobs wait
MIN_GAP_S = 2.0            # a change of the queue makes a forecast no sooner than this after the last
GAP_FACTOR = 5.0           # ... nor sooner than this many times the last one's duration
WAITING_STATES = ("queued", "waiting")


class Estimates:
    """The latest Forecast (None before the first) and the rules of the next one; thread-safe."""

    def __init__(self, store: Store, clock: Callable[[], float], *, interval_s: float = DEFAULT_INTERVAL_S,
                 max_jobs: int = forecast.DEFAULT_MAX_JOBS, horizon_s: float = forecast.DEFAULT_HORIZON_S,
                 monotonic: Callable[[], float] = time.monotonic,
                 publish: Callable[[forecast.Forecast], object] = lambda made: None):
        """`publish(made)`: writes each forecast to the state file's `estimates` (the scheduler's call)."""
        self.store, self.clock, self.monotonic, self.publish = store, clock, monotonic, publish
        self.interval_s, self.max_jobs, self.horizon_s = interval_s, max_jobs, horizon_s
        self.latest: forecast.Forecast | None = None
        self._made_at = -float("inf")   # monotonic time of the last forecast's start
        self._generation: int | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def refresh(self, generation: int | None = None) -> forecast.Forecast:
        """Make a forecast now (in the calling thread) and keep it as the latest."""
        self._made_at, self._generation = self.monotonic(), generation
        copy = self.store.read(forecast.snapshot)
        try:
            made = forecast.waiting_estimates(copy, self.clock(), self.max_jobs, horizon_s=self.horizon_s)
        finally:
            copy.close()
        self.latest = made
        self.publish(made)
        log.info("forecast_made jobs=%d skipped=%d took_s=%.3f", len(made.estimates), len(made.skipped), made.took_s)
        return made

    def due(self, generation: int) -> bool:
        """Whether a forecast is due: the interval passed, or the queue changed and the gap after the last passed."""
        since = self.monotonic() - self._made_at
        if since >= self.interval_s:
            return True
        took = self.latest.took_s if self.latest else 0.0
        return generation != self._generation and since >= max(MIN_GAP_S, GAP_FACTOR * took)

    def tick(self, generation: int) -> bool:
        """Upkeep: start a forecast on its own thread when one is due and none runs; whether one started."""
        with self._lock:
            if (self._thread is not None and self._thread.is_alive()) or not self.due(generation):
                return False
            self._made_at = self.monotonic()   # not due again while this one runs
            self._thread = threading.Thread(target=self._refresh_logged, args=(generation,),
                                            name="gpulayer-forecast", daemon=True)
            self._thread.start()
            return True

    def _refresh_logged(self, generation: int) -> None:
        try:
            self.refresh(generation)
        except Exception:  # noqa: BLE001 - a failed forecast leaves the last one; the next tick tries again
            if getattr(self.store, "closed", False):  # the control plane is stopping: its read was stopped
                log.info("forecast_stopped reason=the control plane is stopping")
            else:
                log.exception("forecast_failed")

    def fields(self, job: dict) -> dict:
        """`estimated_start_at` and `estimate_reason` of a rendered Job (`id`, `state`): both null for a job
        that does not wait to start (it started, or ended)."""
        if job.get("state") not in WAITING_STATES:
            return {"estimated_start_at": None, "estimate_reason": None}
        latest = self.latest
        if latest is None:
            return {"estimated_start_at": None, "estimate_reason": self._not_yet()}
        found = latest.estimates.get(job["id"])
        if found is not None:
            return {"estimated_start_at": found.at, "estimate_reason": found.reason}
        if job["id"] in latest.skipped:
            return {"estimated_start_at": None,
                    "estimate_reason": f"not estimated: only the first {latest.max_jobs} waiting jobs are "
                                       "(--estimate-max-jobs)"}
        return {"estimated_start_at": None, "estimate_reason": self._not_yet()}

    def _not_yet(self) -> str:
        return f"not estimated yet: forecasts are made every {self.interval_s:g} seconds, sooner as the queue changes"

    def apply(self, job: dict) -> dict:
        """`job` (a rendered Job) with its estimate's fields."""
        job.update(self.fields(job))
        return job
