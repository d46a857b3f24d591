"""The writer lease in a directory replica: one control plane writes to a replica at a time.

`gpulayer-writer.json` is renewed every FENCE_RENEW_S by the running control
plane. Every write of the lease takes a new generation, claimed by
hard-linking it as `.gpulayer-writer.N` (one writer per generation:
`swap_lease`); the newest claim is the lease.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import socket
from pathlib import Path
from typing import TypeGuard

from gpulayer.server.config import HomeLayout
from gpulayer.server.errors import ConfigError
from gpulayer.server.replication.home import restored_marker, writer_id
from gpulayer.server.replication.replica import Replica, check_directory, same_replica
from gpulayer.server.security.auth import write_private

log = logging.getLogger("gpulayer.server.replication")

FENCE_FILE = "gpulayer-writer.json"   # the writer lease, in a directory replica
CLAIM_PREFIX = ".gpulayer-writer."    # + a generation: made O_EXCL by each write of the lease (swap_lease)
CLAIMS_KEPT = 8                       # the newest claims kept (older ones are removed)
FENCE_TTL_S = 10.0      # a lease not renewed for this long is stale: its writer is taken to be gone
FENCE_RENEW_S = 1.0     # how often the running control plane renews it
FENCE_MARGIN_S = 3.0    # a writer that could not renew for FENCE_TTL_S minus this stops (clock skew, its own exit)


def _read_json(path: Path) -> dict | None:
    try:
        lease = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return lease if isinstance(lease, dict) and "writer" in lease else None


def read_lease(directory: Path) -> dict | None:
    """The replica's writer lease, or None when it has none (or it cannot be read as one).

    The lease is the newest generation: the highest claim file (swap_lease), or
    the lease file when that is newer (a lease written without a claim).
    """
    claims = _claims(directory) if directory.is_dir() else []
    lease = _read_json(directory / FENCE_FILE)
    if claims and (lease is None or int(lease.get("generation") or 0) < max(claims)):
        claimed = _read_json(directory / f"{CLAIM_PREFIX}{max(claims)}")
        if claimed is not None:
            return claimed
    return lease


def lease_is_live(lease: dict | None, now: float) -> TypeGuard[dict]:
    """True while the lease's writer may still be writing (renewed within FENCE_TTL_S, not released)."""
    if lease is None or lease.get("released"):
        return False
    return now - float(lease.get("renewed_at", 0)) < float(lease.get("ttl_s", FENCE_TTL_S))


def write_lease(directory: Path, writer: str, home: Path, now: float, *, released: bool = False,
                generation: int | None = None, exclusive: bool = False) -> None:
    """Write the lease as `generation` (default: the next one), unchecked; swap_lease is the checked way.

    `exclusive`: the lease is first linked as the claim file of its generation,
    which fails (FileExistsError) when another writer has that generation.
    """
    if generation is None:
        generation = max([int((read_lease(directory) or {}).get("generation") or 0), *_claims(directory)]) + 1
    text = json.dumps({
        "writer": writer, "host": socket.gethostname(), "pid": os.getpid(), "home": str(home),
        "renewed_at": now, "ttl_s": FENCE_TTL_S, "released": released, "generation": generation}) + "\n"
    if not exclusive:
        write_private(directory / FENCE_FILE, text)
        return
    tmp = directory / f".{FENCE_FILE}.{os.getpid()}.{secrets.token_hex(4)}.tmp"   # this writer's own
    try:
        write_private(tmp, text)
        os.link(tmp, directory / f"{CLAIM_PREFIX}{generation}")   # one writer per generation, complete
        try:
            os.replace(tmp, directory / FENCE_FILE)   # the readable copy; the claim is the lease
        except OSError as exc:
            log.warning("replication_lease_copy_failed error=%s", exc)
    finally:
        tmp.unlink(missing_ok=True)


class LeaseLost(Exception):
    """Another writer changed the lease between this writer's read and its write (swap_lease)."""


def _claims(directory: Path) -> list[int]:
    """The generations claimed in the replica (CLAIM_PREFIX files)."""
    found = []
    for name in os.listdir(directory):
        if name.startswith(CLAIM_PREFIX):
            try:
                found.append(int(name[len(CLAIM_PREFIX):]))
            except ValueError:
                continue
    return found


def swap_lease(directory: Path, writer: str, home: Path, now: float, *, expect: int | None,
               released: bool = False) -> int:
    """Write the lease as a new generation, one writer at a time; returns that generation.

    Every write of the lease takes generation N+1: its content goes to a
    temporary file of this writer's own, which is then hard-linked as the claim
    file CLAIM_PREFIX + N+1 (exactly one of two racing writers can make it, and
    it is complete when it appears); the newest claim is the lease (read_lease).
    `expect` (a holder renewing or releasing): the generation it wrote last; a
    newer one means another writer took over. After the link, a claim past its
    own also means that. Raises LeaseLost, or OSError (the replica failed:
    nothing was claimed, or the claim stands as a renewal).
    """
    claims = _claims(directory)
    lease = read_lease(directory)
    top = max([int(lease.get("generation") or 0) if lease is not None else 0, *claims])
    if expect is not None and top != expect:
        raise LeaseLost(f"the lease is at generation {top}, past this writer's {expect}")
    new = top + 1
    try:
        write_lease(directory, writer, home, now, released=released, generation=new, exclusive=True)
    except FileExistsError:
        raise LeaseLost(f"another writer claimed the lease's generation {new} at the same time") from None
    if max(_claims(directory)) != new:
        raise LeaseLost("another writer took the lease while this one wrote it")
    for old in claims:
        if old < new - CLAIMS_KEPT:  # the newest are kept: a slow claimer sees them and cannot reuse a number
            (directory / f"{CLAIM_PREFIX}{old}").unlink(missing_ok=True)
    return new


def describe_lease(lease: dict, now: float) -> str:
    return (f"held by {lease.get('host')} (pid {lease.get('pid')}, home {lease.get('home')}), "
            f"renewed {max(0.0, now - float(lease.get('renewed_at', 0))):.1f} s ago")


def claim(replica: Replica, layout: HomeLayout, now: float) -> str:
    """Take the replica's lease for this home before replicating; returns the writer id.

    Raises ConfigError when another control plane's lease is live, or when the
    replica holds another home's state (only `gpulayer server restore` hands a
    replica over: replicating an unrelated state file into it would mix two histories).
    """
    mine = writer_id(layout)
    directory = replica.directory
    if directory is None:
        return mine
    marker = restored_marker(layout)
    if marker is not None and marker.get("timestamp") and same_replica(marker.get("from"), replica):
        raise ConfigError(f"this home was restored from {replica.url} as it was at {marker['timestamp']}: "
                          "replicating it there would mix an older history into a newer one. "
                          "Replicate to a new directory")
    check_directory(replica)
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise ConfigError(f"cannot create the replica directory {directory}: {exc.strerror or exc}") from None
    lease = read_lease(directory)
    if lease is not None and lease["writer"] != mine:
        if lease_is_live(lease, now):
            raise ConfigError(f"the replica {directory} is {describe_lease(lease, now)}: a second control plane "
                              "may not write to it. Stop that one first (or wait for its lease to go stale)")
        raise ConfigError(f"the replica {directory} holds the state of another control plane (home "
                          f"{lease.get('home')} on {lease.get('host')}): restore from it with `gpulayer server "
                          f"restore --from {replica.url} --home NEW_HOME`, or replicate to another directory")
    if lease is None and (directory / "ltx").exists():
        raise ConfigError(f"the replica {directory} already holds a replicated state file with no writer lease: "
                          "restore from it, or replicate to an empty directory")
    try:
        swap_lease(directory, mine, layout.home, now, expect=None)
    except LeaseLost as exc:
        raise ConfigError(f"the replica {directory}'s lease changed while this control plane took it ({exc}): "
                          "another one is starting or restoring. Try again") from None
    return mine

