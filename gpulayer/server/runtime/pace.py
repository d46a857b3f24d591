"""Each array job's recent element run time, in memory: how many of its elements a worker may lease ahead."""
from __future__ import annotations

import math

AHEAD_WINDOW_S = 0.25  # seconds of the worker's slots' work leased ahead: a round trip or more
MAX_AHEAD = 64         # elements leased ahead to one worker, all jobs together
LONG_ELEMENT_S = 1.0   # elements that run longer are never leased ahead


class Pace:
    """Each array job's recent element run time (seconds, an exponential average), as agents report it
    (`run_s` of a finish). In memory only: after a restart no element is leased ahead until finishes
    come in again. Used on the writer path only."""

    def __init__(self, limit: int = 4096):
        self.limit = limit
        self.run_s: dict[int, float] = {}

    def note(self, job_id: int, run_s: float) -> None:
        before = self.run_s.pop(job_id, None)  # re-inserted: the dict stays in order of use, oldest first
        self.run_s[job_id] = run_s if before is None else before + 0.25 * (run_s - before)
        if len(self.run_s) > self.limit:
            del self.run_s[next(iter(self.run_s))]

    def ahead(self, job_id: int, slots: int) -> int:
        """How many of the job's elements a worker of `slots` slots may hold leased ahead."""
        run_s = self.run_s.get(job_id)
        if run_s is None or run_s > LONG_ELEMENT_S:
            return 0
        return min(MAX_AHEAD, math.ceil(max(1, slots) * AHEAD_WINDOW_S / max(run_s, 0.001)))
