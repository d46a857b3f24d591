"""Cascades: the big changes a job's end sets off, as a run of small writes instead of one long one.

Cancelling a 100,000-element array, or ending the one job that sixteen such
arrays wait on, changes millions of task rows. In one transaction that holds
the state file's only writer for seconds, and every heartbeat waits behind it
(issue 22). So such a change is cut into steps (scheduler/outcomes.py: `end`
a batch of a job's tasks, `settle` a batch of the jobs waiting on one that
ended, `release` a batch of a job's held tasks, `insert` a batch of a big
array's elements), each one write of at most
`outcomes.BATCH` task rows or `outcomes.FANOUT` jobs, and the writer serves
others between two steps.

Every step leaves the state file consistent, and what is left to do can be
read from it (query `cascades_pending`): a job being cancelled keeps its
state and has its `reason` set (no active job has one otherwise) until its
last task ended; a waiting job whose dependency ended is still waiting. So a
control plane that stops between two steps finishes them after its restart.

A transaction function asks for a next step with `follow`; runtime/cascades.py's
`Cascades` (one per Scheduler) runs them: the call that set the cascade off
runs its first `INLINE_STEPS` (and those of the job it cancelled, to its
end), a thread runs the rest. Called with no collector (a direct
`store.write`, as tools and some tests do), the steps run at once, in the
same transaction, as before.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

INLINE_STEPS = 200  # steps the call that set a cascade off runs itself (1-5 ms each), before the thread

#: A step still to run: (kind, job id, argument), kind one of outcomes.STEPS.
Step = tuple[str, int, int]
_NOTED: ContextVar[list[Step] | None] = ContextVar("gpulayer_cascade_steps", default=None)


def follow(step: Step) -> bool:
    """Ask for `step` to run in a write of its own; False when nothing collects steps (run it now)."""
    noted = _NOTED.get()
    if noted is None:
        return False
    noted.append(step)
    return True


def asked() -> bool:
    """Whether this write asked for steps so far (a finish that set a cascade off)."""
    return bool(_NOTED.get())


@contextmanager
def collecting() -> Iterator[list[Step]]:
    """Within it, `follow` collects the steps asked for (in the context Store.write copies to the writer)."""
    noted: list[Step] = []
    token = _NOTED.set(noted)
    try:
        yield noted
    finally:
        _NOTED.reset(token)
