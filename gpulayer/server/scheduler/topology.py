"""Placement that knows the wiring (issue 40; docs/workers.md, "Topology"): which of a worker's free GPUs a
multi-GPU task gets.

A worker reports each GPU's NVLink peers, PCIe switch and NUMA node at register (agent/gpu/topology.py;
workers.gpu_topology). A task of n GPUs gets, in this order: n GPUs of one NVLink set (GPUs joined by NVLink,
directly or through one another, among those free), then n under one PCIe switch, then n on one NUMA node,
else the lowest free indices (as without a topology); a 1-GPU task takes one of the smallest NVLink set
(without NVLink: the lowest index). At each step the smallest group that holds n wins
(then the lowest index): a 2-GPU task takes the set that already has 2 free and leaves a whole free set for a
4-GPU task. Pure functions: placement.py reads the rows and writes the choice.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

from gpulayer.protocol.registration import MAX_GPU_INDEX


def reported(raw: Iterable[dict[str, Any]] | None, gpus: int) -> list[dict[str, Any]]:
    """The register's `gpu_topology` as stored: one record per device index below `gpus` (the first of each),
    peers that name no other such index left out."""
    found: dict[int, dict[str, Any]] = {}
    for record in raw or []:
        index = record["index"]
        if index >= gpus or index in found:
            continue
        peers = sorted({p for p in record.get("nvlink_peers") or [] if isinstance(p, int) and p != index
                        and 0 <= p < min(gpus, MAX_GPU_INDEX + 1)})
        found[index] = {"index": index, "nvlink_peers": peers, "pcie_switch": record.get("pcie_switch"),
                        "numa_node": record.get("numa_node")}
    return [found[i] for i in sorted(found)]


def nvlink_sets(free: list[int], wiring: dict[int, dict[str, Any]]) -> list[list[int]]:
    """The free GPUs joined by NVLink (directly or through other free ones), each set sorted."""
    left, sets = set(free), []
    for start in sorted(free):
        if start not in left:
            continue
        seen, todo = {start}, [start]
        while todo:
            gpu = todo.pop()
            for peer in (wiring.get(gpu) or {}).get("nvlink_peers") or []:
                if peer in left and peer not in seen:
                    seen.add(peer)
                    todo.append(peer)
        left -= seen
        sets.append(sorted(seen))
    return sets


def _groups(free: list[int], key: Callable[[int], Any]) -> list[list[int]]:
    found: dict[Any, list[int]] = {}
    for gpu in sorted(free):
        value = key(gpu)
        if value is not None:
            found.setdefault(value, []).append(gpu)
    return list(found.values())


def pick(free: list[int], n: int, wiring: dict[int, dict[str, Any]]) -> tuple[list[int], str]:
    """n of the `free` indices, and how they are joined: "nvlink", "pcie_switch", "numa_node" or "none"
    (the lowest free indices). `wiring`: index -> its reported record."""
    lowest = sorted(free)[:n]
    if not wiring or n < 1:
        return lowest, "none"
    if n == 1:  # best fit: from the smallest NVLink set, so that whole sets stay free for multi-GPU tasks
        return min(nvlink_sets(free, wiring), key=lambda s: (len(s), s[0]))[:1], "none"
    tiers: list[tuple[str, list[list[int]]]] = [
        ("nvlink", [s for s in nvlink_sets(free, wiring) if len(s) > 1]),
        ("pcie_switch", _groups(free, lambda g: (wiring.get(g) or {}).get("pcie_switch"))),
        ("numa_node", _groups(free, lambda g: (wiring.get(g) or {}).get("numa_node"))),
    ]
    for name, groups in tiers:
        fits = [g for g in groups if len(g) >= n]
        if fits:
            return min(fits, key=lambda g: (len(g), g[0]))[:n], name
    return lowest, "none"


def nvlink_domains(records: list[dict[str, Any]], gpus: int) -> list[int | None]:
    """Each GPU's NVLink set, by device index below `gpus` (workers.gpu_nvlink): the lowest index of the GPUs
    joined to it by NVLink, directly or through others; None for a GPU without NVLink (or unreported).
    `--gpu-link nvlink` counts a set's free GPUs (schema.sql's shape_worker_fit)."""
    wiring = {r["index"]: r for r in records}
    out: list[int | None] = [None] * gpus
    for found in nvlink_sets(list(range(gpus)), wiring):
        if len(found) > 1:
            for gpu in found:
                out[gpu] = found[0]
    return out


def pick_linked(free: list[int], n: int, wiring: dict[int, dict[str, Any]],
                domains: list[int | None]) -> list[int]:
    """n of the `free` indices, all of one NVLink set (`domains`: nvlink_domains), for a job that requires
    NVLink (`gpu_link` nvlink): the set with the fewest free that holds n (best fit, then the lowest), and
    in it as `pick` chooses; [] when no set holds n (placement checked that one does)."""
    sets = _groups(free, lambda g: domains[g] if g < len(domains) else None)
    fits = [s for s in sets if len(s) >= n]
    if not fits:
        return []
    return pick(min(fits, key=lambda s: (len(s), s[0])), n, wiring)[0]
