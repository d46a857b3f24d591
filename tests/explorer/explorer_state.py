"""The explorer tests' state file: schema.sql filled with INSERTs, at a pinned time."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import apsw

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "schema.sql"
NOW = 1_700_000_000.0
HOUR = 3600.0

# Values that must never reach a page, a JSON or a CSV answer.
SECRET_MARKERS = ("SECRETHASH", "SECRETSESSION", "SECRETCIPHER")
EVIL_NAME = '<b>"x",y</b>'
CLIENT_TOKEN = "glc_test-client-token"


def _workers(db: apsw.Connection) -> None:
    rows = [
        # id, name, state, labels, cpus, gpus, memory_mb, gpu_models, slots, session, gone_reason
        (1, "gpu-a", "online", {"zone": "a", "gpu": "h100"}, 64, 8, 512000, ["H100"] * 8, 4, "SECRETSESSION-1", None),
        (2, "cpu-b", "online", {"zone": "b"}, 16, 0, 64000, [], 2, "SECRETSESSION-2", None),
        (3, "old-c", "offline", {"zone": "c"}, 8, 2, 32000, ["A10", "A10"], 1, "SECRETSESSION-3", None),
        (4, "gone-d", "gone", {"zone": "a"}, 8, 1, 32000, ["A10"], 1, "SECRETSESSION-4", "revoked"),
        (5, "stale-e", "needs_upgrade", {}, 4, 0, 8000, [], 1, None, None),
    ]
    for id_, name, state, labels, cpus, gpus, mem, models, slots, session, gone in rows:
        db.execute(
            "INSERT INTO workers (id, name, state, labels, cpus, gpus, memory_mb, gpu_models, slots,"
            " advertise_address, version, protocol, session_hash, token_jti, registered_at, last_seen_at,"
            " lease_expires_at, gone_reason)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, '0.1.0', 1, ?, 'jti-join', ?, ?, ?, ?)",
            (id_, name, state, json.dumps(labels), cpus, gpus, mem, json.dumps(models), slots, f"10.0.0.{id_}",
             session, NOW - 10 * HOUR, NOW - 5, NOW + 15 if state == "online" else None, gone))


def _job(db: apsw.Connection, id_: int, name: str | None, state: str, *, gpus: int = 0, labels: dict | None = None,
         accelerator: str | None = None, kind: str = "batch", width: int = 1, created: float = NOW - HOUR,
         finished: float | None = None, priority: int = 0) -> None:
    spec = {"command": ["python", "train.py"], "name": name, "gpus": gpus, "labels": labels or {}}
    db.execute(
        "INSERT INTO jobs (id, name, state, spec, kind, priority, labels, accelerator, gpus, width, created_at,"
        " finished_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (id_, name, state, json.dumps(spec), kind, priority, json.dumps(labels or {}), accelerator, gpus, width,
         created, finished))


def _task(db: apsw.Connection, id_: int, job: int, state: str, *, worker: int | None = None, index: int = 0,
          started: float | None = None, finished: float | None = None, endpoint: str | None = None,
          reason: str | None = None) -> None:
    active = state in ("assigned", "running")
    db.execute(
        "INSERT INTO tasks (id, job_id, \"index\", state, worker_id, lease_expires_at, endpoint, address, reason,"
        " created_at, assigned_at, started_at, finished_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (id_, job, index, state, worker, NOW + 15 if active else None, endpoint,
         f"10.0.0.{worker}" if worker else None, reason, NOW - 2 * HOUR, started, started, finished))


def build_state(path: Path) -> None:
    """Write a state file: schema.sql in WAL mode, then a small, known fleet."""
    db = apsw.Connection(str(path))
    db.execute("PRAGMA journal_mode = wal")
    db.execute(SCHEMA.read_text())
    with db:
        db.execute("INSERT INTO tokens (jti, kind, name, token_hash, created_at) VALUES"
                   " ('jti-join', 'join', 'fleet', 'SECRETHASH-join', ?),"
                   " ('jti-ci', 'client', 'ci', 'SECRETHASH-client', ?)", (NOW, NOW))
        _workers(db)
        _job(db, 1, EVIL_NAME, "running", gpus=2, labels={"team": "ml"})
        _task(db, 1, 1, "running", worker=1, started=NOW - 2 * HOUR)
        _job(db, 2, "train", "succeeded", gpus=4, labels={"team": "ml", "zone": "a"},
             created=NOW - 3 * 86400, finished=NOW - 3 * 86400 + HOUR)
        _task(db, 2, 2, "succeeded", worker=1, started=NOW - 3 * 86400, finished=NOW - 3 * 86400 + HOUR)
        _job(db, 3, "needs-zone-z", "queued", labels={"zone": "z"}, priority=5)
        _task(db, 3, 3, "queued")
        _job(db, 4, "needs-cuda", "queued", gpus=1, accelerator="cuda", labels={"zone": "b"})
        _task(db, 4, 4, "queued")
        _job(db, 5, "too-big", "queued", gpus=16)
        _task(db, 5, 5, "queued")
        _job(db, 6, "waits-free", "queued", gpus=8)
        _task(db, 6, 6, "queued")
        _job(db, 7, "fits", "queued")
        _task(db, 7, 7, "queued")
        _job(db, 8, "svc", "running", kind="service", width=2)
        _task(db, 8, 8, "running", worker=1, index=0, started=NOW - HOUR, endpoint="10.0.0.1:30001")
        _task(db, 9, 8, "running", worker=2, index=1, started=NOW - HOUR, endpoint="10.0.0.2:30002")
        _job(db, 9, "lost-one", "lost", gpus=1, finished=NOW - HOUR)
        _task(db, 10, 9, "lost", worker=4, started=NOW - 3 * HOUR, finished=NOW - HOUR, reason="worker_lost")
        for seq, kind in enumerate(["job_submitted", "task_assigned", "task_started"], start=1):
            db.execute("INSERT INTO events (seq, at, kind, job_id, task_id, worker_id, data)"
                       " VALUES (?, ?, ?, 1, 1, 1, ?)",
                       (seq, NOW - 2 * HOUR + seq, kind, json.dumps({"note": EVIL_NAME})))
        for n in range(250):  # enough rows for a few pages
            db.execute("INSERT INTO events (at, kind, job_id, data) VALUES (?, 'heartbeat', 2, '{}')", (NOW - n,))
        for n, (stream, text) in enumerate([("stdout", "epoch 1 <loss> 0.5"), ("stderr", "warning: & co"),
                                            ("system", "started")]):
            db.execute("INSERT INTO logs (job_id, task_id, n, stream, at, text) VALUES (1, 1, ?, ?, ?, ?)",
                       (n, stream, NOW - HOUR + n, text))
        db.execute("INSERT INTO secrets (name, ciphertext, created_at, updated_at) VALUES ('hf', ?, ?, ?)",
                   (b"SECRETCIPHER", NOW, NOW))
        db.execute("INSERT INTO artifacts VALUES ('sha256:abc', 10, ?, ?, ?)", (NOW, NOW, NOW))
        db.execute("INSERT INTO rendezvous VALUES (8, 1, 0, 8, '10.0.0.1', 29500, ?)", (NOW,))
        db.execute("INSERT INTO provision_requests (provisioner, profile, state, created_at, updated_at)"
                   " VALUES ('slurm', 'h100', 'pending', ?, ?)", (NOW, NOW))
    db.close()


# The table migration 0018 adds (GPU telemetry, docs/sql.md): the explorer reads it when the state file has it.
GPU_SAMPLES_DDL = """
CREATE TABLE gpu_samples (worker_id INTEGER NOT NULL, gpu_index INTEGER NOT NULL, at REAL NOT NULL,
    utilization_pct REAL, memory_used_mb INTEGER, memory_total_mb INTEGER) STRICT;
CREATE INDEX gpu_samples_at ON gpu_samples (at);
CREATE INDEX gpu_samples_gpu ON gpu_samples (worker_id, gpu_index, at);
"""


def ensure_gpu_samples(db: apsw.Connection) -> None:
    """Create gpu_samples as migration 0018 does, where this schema.sql predates it."""
    if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'gpu_samples'").fetchall():
        db.execute(GPU_SAMPLES_DDL)


def file_digest(path: Path) -> str:
    """The bytes of the state file and of its WAL, as one hash."""
    digest = hashlib.sha256(path.read_bytes())
    wal = path.with_name(path.name + "-wal")
    if wal.exists():
        digest.update(wal.read_bytes())
    return digest.hexdigest()
