"""Waiting arithmetic: retry backoff with jitter, and service restart delays.

Pure functions (the clock and the random source are parameters), so tests pin them.
"""

import random
from typing import Callable

#: Retries of control-plane calls start here and double up to the cap.
RETRY_BASE_S = 0.25
RETRY_CAP_S = 10.0

#: Service restarts: the first waits 1 s, then doubling up to 30 s; a run that
#: lasted longer than a minute starts again from 1 s (docs/services).
RESTART_FIRST_S = 1.0
RESTART_MAX_S = 30.0
RESTART_RESET_AFTER_S = 60.0


def retry_delay(
    failures: int,
    base: float = RETRY_BASE_S,
    cap: float = RETRY_CAP_S,
    rand: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait after ``failures`` consecutive failures (1 = first failure).

    Exponential with "equal jitter": a value in [d/2, d] where d = min(cap, base * 2**(failures-1)),
    so many workers losing the control plane at once do not retry in lockstep.
    """
    ceiling = min(cap, base * (2 ** max(0, failures - 1)))
    return ceiling / 2 + rand() * ceiling / 2


def next_restart_delay(previous: float | None, run_seconds: float) -> float:
    """Delay before restarting a service replica.

    ``previous`` is the delay used before the run that just ended (None before
    the first restart); ``run_seconds`` is how long that run lasted.
    """
    if previous is None or run_seconds > RESTART_RESET_AFTER_S:
        return RESTART_FIRST_S
    return min(RESTART_MAX_S, previous * 2)
