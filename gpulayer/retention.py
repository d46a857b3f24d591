"""Artifact retention: the sweep that keeps the store's disk in check.

An artifact is removed when it is older than the retention period (by its
last use) and no queued, running or retained job names it: as source, input,
service weights or output. Rows go first, in one transaction; files after the
commit, so a job submitted meanwhile is refused (unknown artifact) rather than
left pointing at nothing. A file is unlinked only if its row is still gone,
checked under the digest's lock that a PUT holds from rename to record.
"""
from __future__ import annotations

import logging

from . import events
from .sql import row, rows

log = logging.getLogger("gpulayer.retention")


def candidates(conn, cutoff: float) -> list[dict]:
    """What a sweep with this cutoff would remove."""
    return rows(conn, "unreferenced_artifacts", cutoff=cutoff)


def _forget(conn, cutoff: float, now: float) -> list[dict]:
    removed = []
    for artifact in rows(conn, "unreferenced_artifacts", cutoff=cutoff):
        if row(conn, "delete_artifact", digest=artifact["digest"]) is not None:
            removed.append(artifact)
    if removed:
        events.record(conn, now, "artifacts_swept", count=len(removed), bytes=sum(a["size"] for a in removed))
    return removed


def sweep(store, artifacts, *, now: float, retention_s: float, dry_run: bool = False) -> dict:
    """Remove (or with dry_run, list) unreferenced artifacts older than the retention period."""
    cutoff = now - retention_s
    if dry_run:
        found = store.read(candidates, cutoff)
    else:
        found = store.write(_forget, cutoff, now)
        for artifact in found:
            digest = artifact["digest"]
            artifacts.delete(digest, lambda: store.read(row, "artifact_recorded", digest=digest) is None)
    total = sum(a["size"] for a in found)
    if found and not dry_run:
        log.info("artifacts_swept count=%d bytes=%d", len(found), total)
    return {"dry_run": dry_run, "removed": [a["digest"] for a in found], "bytes": total}


def run_gc(home, *, dry_run: bool = False, retention_s: float | None = None, now: float | None = None) -> list[str]:
    """`gpulayer artifacts gc` on the control plane's host: sweep the home's store now; returns the digests."""
    import time
    from pathlib import Path

    from .artifacts import ArtifactStore
    from .config import ControlPlaneConfig
    from .db import Store

    config = ControlPlaneConfig(home=Path(home))
    store = Store(config.layout.state, synchronous=config.synchronous)
    try:
        result = sweep(store, ArtifactStore(config.layout.artifacts), now=time.time() if now is None else now,
                       retention_s=config.artifact_retention_s if retention_s is None else retention_s,
                       dry_run=dry_run)
    finally:
        store.close()
    return result["removed"]
