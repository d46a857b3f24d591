"""The state file's counts that /metrics reports, read at scrape time so they always match what SQL says."""
from __future__ import annotations

import json

import apsw

from gpulayer.server.store.queries import one, rows


def snapshot(conn: apsw.Connection) -> dict:
    """Jobs and workers by state, cordons by state, unhealthy GPUs, queued tasks by their job's labels, tasks lost
    to an expired lease (ever), and the artifact store's bytes and count; one read.

    `queue` is a list of (labels as a dict, queued tasks); every other count is an int or {state: int}.
    """
    artifacts = one(conn, "metrics_artifact_bytes")
    return {
        "jobs": {r["state"]: r["n"] for r in rows(conn, "metrics_jobs_by_state")},
        "workers": {r["state"]: r["n"] for r in rows(conn, "metrics_workers_by_state")},
        "cordoned": {r["state"]: r["n"] for r in rows(conn, "metrics_workers_cordoned")},
        "gpus_unhealthy": one(conn, "metrics_gpus_unhealthy")["n"],
        "queue": [(json.loads(r["labels"]), r["n"]) for r in rows(conn, "metrics_queue_by_labels")],
        "leases_expired": one(conn, "metrics_leases_expired")["n"],
        "artifact_bytes": artifacts["bytes"], "artifacts": artifacts["n"],
    }
