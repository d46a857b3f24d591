"""CPU sets as the kernel writes them (``0-3,8``) and the affinity a task's process is born with.

`pinned(cpus)` sets the calling thread's CPU affinity for the length of a ``with`` (Linux: pid 0 is the calling
thread alone), so a process it starts (fork and exec inherit the mask) runs on ``cpus`` from its first
instruction, with no wrapper and nothing run in the child between fork and exec; the agent's other threads keep
theirs. `worker start --pin-cpus` uses it (agent/gpu/pinning.py chooses the sets; docs/workers.md, "Pinning CPUs").
"""

import contextlib
import os
from typing import Iterable, Iterator


def parse_cpu_list(text: str) -> frozenset[int]:
    """``0-3,8,10-11`` as a set of CPU numbers (ValueError on anything else); the empty text is the empty set."""
    found: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, sep, high = part.partition("-")
        first, last = int(low), int(high) if sep else int(low)
        if first < 0 or last < first:
            raise ValueError(f"not a CPU range: {part!r}")
        found.update(range(first, last + 1))
    return frozenset(found)


def cpu_list(cpus: Iterable[int]) -> str:
    """The kernel's text of a CPU set (``0-3,8``): runs of consecutive numbers as ranges."""
    runs: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def readable_affinity() -> tuple[frozenset[int] | None, str | None]:
    """The CPUs this process may run on, or None and why pinning cannot work here (no sched_getaffinity)."""
    try:
        return frozenset(os.sched_getaffinity(0)), None
    except (AttributeError, OSError) as exc:
        return None, f"the CPU affinity of this machine cannot be read ({exc})"


@contextlib.contextmanager
def pinned(cpus: frozenset[int] | None) -> Iterator[None]:
    """Within the ``with``, the calling thread (and what it starts) runs on ``cpus``; None changes nothing."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
