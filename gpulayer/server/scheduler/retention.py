"""Retention: the artifact sweep, and pruning of old logs, jobs, events, departed workers and GPU samples.

An artifact is removed when it is older than the retention period (by its
last use) and no queued, running or retained job names it: as source, input,
service weights or output; one that no job ever named (an upload), already after
the shorter `unnamed_retention_s` (issue 36). Rows go first, in one transaction; files after the
commit, so a job submitted meanwhile is refused (unknown artifact) rather than
left pointing at nothing. A file is unlinked only if its row is still gone,
checked under the digest's lock that a PUT holds from rename to record.
"""
from __future__ import annotations

import json
import logging
import math
from typing import Callable

import apsw

from gpulayer.server.scheduler import events
from gpulayer.protocol import GPU_SAMPLE_RETENTION_S, UNNAMED_RETENTION_S
from gpulayer.server.errors import ConfigError
from gpulayer.server.store.queries import row, rows

log = logging.getLogger("gpulayer.server.scheduler.retention")
# Pruning works in small batches, each its own write: none holds the write lock for long.
PRUNE_BATCH = 200            # log lines or events per write
PRUNE_JOBS = 50              # jobs (or workers) looked at per read
PRUNE_ROUND_WRITES = 400     # writes per upkeep round at most; a backlog goes on in the next round
PRUNE_SAMPLES = 2000         # GPU samples per write (a row per GPU per heartbeat interval: 1,000 GPUs make 43M a day)


def candidates(conn: apsw.Connection, cutoff: float, unnamed_cutoff: float) -> list[dict]:
    """What a sweep with these cutoffs would remove."""
    return rows(conn, "unreferenced_artifacts", cutoff=cutoff, unnamed_cutoff=unnamed_cutoff)


def _forget(conn: apsw.Connection, cutoff: float, unnamed_cutoff: float, now: float) -> list[dict]:
    removed = []
    for artifact in candidates(conn, cutoff, unnamed_cutoff):
        if row(conn, "delete_artifact", digest=artifact["digest"]) is not None:
            row(conn, "delete_artifact_uploads", digest=artifact["digest"])
            removed.append(artifact)
    if removed:
        events.record(conn, now, "artifacts_swept", count=len(removed), bytes=sum(a["size"] for a in removed))
    return removed


def sweep(store, artifacts, *, now: float, retention_s: float, unnamed_retention_s: float | None = None,
          dry_run: bool = False) -> dict:
    """Remove (or with dry_run, list) unreferenced artifacts older than the retention period (never named by
    a job: than `unnamed_retention_s`, at most `retention_s`)."""
    cutoff = now - retention_s
    unnamed_cutoff = max(cutoff, now - (UNNAMED_RETENTION_S if unnamed_retention_s is None else unnamed_retention_s))
    if dry_run:
        found = store.read(candidates, cutoff, unnamed_cutoff)
    else:
        found = store.write(_forget, cutoff, unnamed_cutoff, now)
        for artifact in found:
            digest = artifact["digest"]
            artifacts.delete(digest, lambda digest=digest: store.read(row, "artifact_recorded", digest=digest) is None)
    total = sum(a["size"] for a in found)
    if found and not dry_run:
        log.info("artifacts_swept count=%d bytes=%d", len(found), total)
    return {"dry_run": dry_run, "removed": [a["digest"] for a in found], "bytes": total}


def run_gc(home, *, dry_run: bool = False, retention_s: float | None = None, now: float | None = None) -> list[str]:
    """`gpulayer artifacts gc` on the control plane's host: sweep the home's store now; returns the digests."""
    import time
    from pathlib import Path

    from gpulayer.server.store.artifacts import ArtifactStore
    from gpulayer.server.config import ControlPlaneConfig
    from gpulayer.server.store.db import Store

    config = ControlPlaneConfig(home=Path(home))
    # An operator's own command, not a request holding a reader from others: its reads run to the end.
    store = Store(config.layout.state, synchronous=config.synchronous, read_timeout_s=math.inf)
    try:
        result = sweep(store, ArtifactStore(config.layout.artifacts), now=time.time() if now is None else now,
                       retention_s=config.artifact_retention_s if retention_s is None else retention_s,
                       unnamed_retention_s=config.unnamed_retention_s, dry_run=dry_run)
    finally:
        store.close()
    return result["removed"]


class _Round:
    """One pruning round: counts what went, and stops at its budget of writes."""

    def __init__(self, store, now: float, budget: int):
        self.store, self.now, self.budget = store, now, budget
        self.removed = {"jobs": 0, "log_lines": 0, "events": 0, "workers": 0, "tasks": 0, "dependencies": 0,
                        "sessions": 0, "gpu_samples": 0}

    def write(self, kind: str, query, **params) -> int:
        """One write: the named query, or fn(conn, **params); the rows it removed are counted under `kind`."""
        self.budget -= 1
        fn = query if callable(query) else (lambda conn, **params: rows(conn, query, **params))
        count = len(self.store.write(fn, **params))
        self.removed[kind] += count
        return count

    @property
    def spent(self) -> bool:
        return self.budget <= 0

    def job_lines(self, job_id: int, cutoff: float) -> None:
        self.batches("log_lines", "prune_job_logs", job_id=job_id, cutoff=cutoff)

    def each(self, query: str, cutoff: float, handle) -> None:
        """handle(row) for each row the read `query` finds, PRUNE_JOBS at a time, until none or spent."""
        while not self.spent:
            found = self.store.read(rows, query, cutoff=cutoff, n=PRUNE_JOBS)
            for item in found:
                if self.spent:
                    return
                handle(item)
            if len(found) < PRUNE_JOBS:
                return

    def logs(self, cutoff: float) -> None:
        self.each("prune_log_jobs", cutoff, lambda job: self.job_lines(job["id"], cutoff))

    def batches(self, kind: str, query: str | Callable[..., list], **params) -> None:
        """`query` (one bounded write) again until it removes less than a batch, or the budget is spent."""
        while not self.spent and self.write(kind, query, n=PRUNE_BATCH, **params) == PRUNE_BATCH:
            pass

    def jobs(self, cutoff: float) -> None:
        def forget(job):
            # A big array's tasks and events go a batch a write too (issue 22), then the job row.
            self.job_lines(job["id"], cutoff)
            self.batches("events", "prune_job_events", job_id=job["id"], cutoff=cutoff)
            self.batches("sessions", "prune_job_sessions", job_id=job["id"], cutoff=cutoff)
            self.batches("tasks", _forget_tasks, job_id=job["id"], cutoff=cutoff)
            self.batches("dependencies", "prune_job_dependencies", job_id=job["id"], cutoff=cutoff)
            if not self.spent:
                self.write("jobs", _forget_job, job_id=job["id"], cutoff=cutoff)
        self.each("prune_old_jobs", cutoff, forget)

    def loose_events(self, cutoff: float) -> None:
        while not self.spent:
            seqs = [r["seq"] for r in self.store.read(rows, "prune_loose_events", cutoff=cutoff, n=PRUNE_BATCH)]
            if seqs:
                self.write("events", "prune_events", seqs=json.dumps(seqs), cutoff=cutoff)
            if len(seqs) < PRUNE_BATCH:
                return

    def workers(self, cutoff: float) -> None:
        self.each("prune_gone_workers", cutoff,
                  lambda worker: self.write("workers", "prune_worker", worker_id=worker["id"], cutoff=cutoff))


    def gpu_samples(self, cutoff: float) -> None:
        """GPU samples older than the cutoff, oldest first, PRUNE_SAMPLES a write (small rows, many a day)."""
        while not self.spent and self.write("gpu_samples", "prune_gpu_samples", n=PRUNE_SAMPLES,
                                            cutoff=cutoff) == PRUNE_SAMPLES:
            pass


def _forget_tasks(conn: apsw.Connection, job_id: int, cutoff: float, n: int) -> list[dict]:
    """Up to n tasks of one pruned job, with their preemptions (the usage ledger keeps who preempted whom)."""
    rows(conn, "prune_job_preemptions", job_id=job_id, cutoff=cutoff, n=n)  # of the same n tasks, first
    rows(conn, "prune_job_idle_reclaims", job_id=job_id, cutoff=cutoff, n=n)
    return rows(conn, "prune_job_tasks", job_id=job_id, cutoff=cutoff, n=n)


def _forget_job(conn: apsw.Connection, job_id: int, cutoff: float) -> list[dict]:
    """The row of a pruned job whose lines, events, tasks and dependencies went in batches, with its
    rendezvous (a few rows a rank), its checkpoints (at most --checkpoint-keep an element) and, once the row
    is gone, its webhooks and mailboxes; nothing while any of those is left."""
    rows(conn, "prune_job_rendezvous", job_id=job_id, cutoff=cutoff)
    rows(conn, "prune_job_checkpoint_files", job_id=job_id, cutoff=cutoff)
    rows(conn, "prune_job_checkpoints", job_id=job_id, cutoff=cutoff)
    gone = rows(conn, "prune_job", job_id=job_id, cutoff=cutoff)
    if gone:
        rows(conn, "prune_job_webhook_deliveries", job_id=job_id)
        rows(conn, "prune_job_webhooks", job_id=job_id)
    return gone


def prune(store, *, now: float, log_retention_s: float, job_retention_s: float,
          gpu_sample_retention_s: float = GPU_SAMPLE_RETENTION_S, dry_run: bool = False,
          budget: int = PRUNE_ROUND_WRITES) -> dict:
    """Remove (or with dry_run, count) what is past retention: log lines of jobs ended more than
    log_retention_s ago; jobs ended more than job_retention_s ago with their tasks, events and relay
    sessions;
    events of no job and departed workers older than that; GPU samples older than
    gpu_sample_retention_s. At most `budget` writes of a few
    milliseconds each; returns the counts by kind, and `done` (False: more is left for next time).
    """
    log_cutoff, job_cutoff = now - log_retention_s, now - job_retention_s
    gpu_cutoff = now - gpu_sample_retention_s
    if dry_run:
        found = store.read(row, "prune_preview", job_cutoff=job_cutoff, lines_cutoff=max(log_cutoff, job_cutoff),
                           gpu_cutoff=gpu_cutoff)
        return {"dry_run": True, "done": True, **found}
    work = _Round(store, now, budget)
    work.logs(log_cutoff)
    work.jobs(job_cutoff)
    work.loose_events(job_cutoff)
    work.workers(job_cutoff)
    work.gpu_samples(gpu_cutoff)
    if any(work.removed.values()):
        store.write(lambda conn: events.record(conn, now, "state_pruned", **work.removed))
        log.info("state_pruned %s", " ".join(f"{k}={v}" for k, v in work.removed.items()))
    return {"dry_run": False, "done": not work.spent, **work.removed}


def run_prune(home, *, dry_run: bool = False, log_retention_s: float | None = None,
              job_retention_s: float | None = None, gpu_sample_retention_s: float | None = None,
              now: float | None = None) -> dict:
    """`gpulayer server prune` on the control plane's host: apply retention to the home's state file now."""
    import time
    from pathlib import Path

    from gpulayer.server.config import ControlPlaneConfig
    from gpulayer.server.store.db import Store

    config = ControlPlaneConfig(home=Path(home))
    if not config.layout.state.exists():
        raise ConfigError(f"no state file at {config.layout.state}")
    store = Store(config.layout.state, synchronous=config.synchronous, readers=1, read_timeout_s=math.inf)  # as gc's
    try:
        result = {"done": False}
        while not result["done"]:
            result_now = prune(store, now=time.time() if now is None else now, dry_run=dry_run,
                               log_retention_s=config.log_retention_s if log_retention_s is None else log_retention_s,
                               job_retention_s=config.job_retention_s if job_retention_s is None else job_retention_s,
                               gpu_sample_retention_s=(config.gpu_sample_retention_s if gpu_sample_retention_s is None
                                                       else gpu_sample_retention_s))
            result = _add(result, result_now) if "jobs" in result else result_now
    finally:
        store.close()
    return result


def _add(total: dict, more: dict) -> dict:
    return {k: (total[k] + v if isinstance(v, int) and not isinstance(v, bool) else v) for k, v in more.items()}
