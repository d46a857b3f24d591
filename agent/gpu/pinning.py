"""Which CPUs each task runs on under ``worker start --pin-cpus`` (issue 40; docs/workers.md, "Pinning CPUs").

A task with GPUs runs on the CPUs local to them (NVML's CPU affinity of each GPU, its NUMA node's CPUs; the
union when its GPUs span nodes; all of the worker's where NVML cannot tell). A task without GPUs runs on the
CPUs no running GPU task holds (all of the worker's when GPU tasks hold every one). Within that pool, a task
that asks for ``cpus`` gets that many (rounded up) of the pool's CPUs, those the fewest other such tasks hold
first, so two tasks on one NUMA node overlap only where the node has too few cores; a task that asks for none
gets the pool's CPUs no task with a ``cpus`` request holds (the whole pool when none is left). Every set is
within the CPUs the worker itself may use (its own affinity at start). Pure choice here; the agent applies it
(agent/cpusets.py) when it starts the task's process.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from ..cpusets import readable_affinity


@dataclass(frozen=True)
class Held:
    """The CPUs one running task was given, whether it holds GPUs, and whether it asked for a count of CPUs."""

    cpus: frozenset[int]
    gpu: bool
    counted: bool


def pool(allowed: frozenset[int], local: dict[int, frozenset[int]], gpus: list[int],
         held: list[Held]) -> frozenset[int]:
    """The CPUs a task may be given: its GPUs' local CPUs, or (no GPU) the CPUs no GPU task holds."""
    if gpus:
        near = frozenset().union(*(local.get(g, allowed) for g in gpus)) & allowed
        return near or allowed
    taken = frozenset().union(*(h.cpus for h in held if h.gpu))
    return (allowed - taken) or allowed


def choose(allowed: frozenset[int], local: dict[int, frozenset[int]], gpus: list[int], cpus: float,
           held: list[Held]) -> frozenset[int]:
    """The CPUs for a task of ``gpus`` asking ``cpus`` (0: no count), beside the running tasks' ``held``."""
    near = pool(allowed, local, gpus, held)
    load = Counter(cpu for h in held if h.counted for cpu in h.cpus)
    wanted = math.ceil(cpus) if cpus > 0 else 0
    if wanted:
        if wanted >= len(near):
            return near
        return frozenset(sorted(near, key=lambda cpu: (load[cpu], cpu))[:wanted])
    return (near - frozenset(load)) or near


class CpuPins:
    """The worker's running tasks' CPU sets: `take` one when a task's process starts, `release` it when it ends."""

    def __init__(self, allowed: frozenset[int], local: dict[int, frozenset[int]]):
        self.allowed = allowed
        #: worker GPU index -> the CPUs local to it (within `allowed`); a GPU missing here: all of `allowed`
        self.local = {g: (cpus & allowed) or allowed for g, cpus in local.items()}
        self.held: dict[int, Held] = {}
        self.lock = threading.Lock()

    def take(self, task_id: int, gpus: list[int], cpus: float) -> frozenset[int]:
        """The task's CPUs, chosen once (a service's restart or a gang's rank started again keeps them)."""
        with self.lock:
            known = self.held.get(task_id)
            if known is None:
                others = list(self.held.values())
                known = Held(choose(self.allowed, self.local, gpus, cpus, others), bool(gpus), cpus > 0)
                self.held[task_id] = known
            return known.cpus

    def release(self, task_id: int) -> None:
        with self.lock:
            self.held.pop(task_id, None)


def start(local: dict[int, frozenset[int]],
          read: Callable[[], tuple[frozenset[int] | None, str | None]] = readable_affinity
          ) -> tuple[CpuPins | None, str | None]:
    """The worker's CPU pins over its own affinity and its GPUs' `local` CPUs; None and why where the
    affinity cannot be read (the worker then runs its tasks unpinned, and says so at start)."""
    allowed, why = read()
    if not allowed:
        return None, f"--pin-cpus: {why or 'this process may run on no CPU'}: tasks run unpinned"
    return CpuPins(allowed, local), None
