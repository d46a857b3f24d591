"""A fleet for the home page and the pictures: explorer_state's file plus an array, a week of usage,
ended jobs, restarts and preemptions, and (optionally) GPU samples, at the same pinned NOW."""

from __future__ import annotations

import json
from pathlib import Path

import apsw
from explorer_state import HOUR, NOW, build_state, ensure_gpu_samples

ARRAY_JOB = 20
ARRAY_SIZE = 2500
ENDED = 1500  # elements 0-1499 succeeded (element 7 on its second attempt)
RUNNING = 3  # 1500-1502 run on gpu-a, GPUs 2, 3 and 4
EVIL_PROJECT = "<svg onload=alert(1)>"
WEEK = 7 * 86400


def build_fleet(path: Path, *, samples: bool = True) -> None:
    build_state(path)
    db = apsw.Connection(str(path))
    with db:
        db.execute("INSERT INTO projects (id, name, created_at) VALUES (2, 'vision', 0), (3, ?, 0)", (EVIL_PROJECT,))
        db.execute("INSERT INTO users (id, name, created_at) VALUES (2, 'alice', 0)")
        spec = {"command": ["python", "sweep.py", "--seed", "{index}"], "array": {"size": ARRAY_SIZE}}
        db.execute(
            "INSERT INTO jobs (id, name, state, spec, gpus, array_size, created_at, user_id, project_id)"
            " VALUES (?, 'sweep', 'running', ?, 1, ?, ?, 2, 2)",
            (ARRAY_JOB, json.dumps(spec), ARRAY_SIZE, NOW - 10 * HOUR),
        )
        created = NOW - 10 * HOUR
        rows = []
        for index in range(ARRAY_SIZE):
            if index < ENDED:
                started = created + 60 + index
                rows.append((index, 1, "succeeded", None, None, started, started + 30, "[0]"))
            elif index < ENDED + RUNNING:
                rows.append((index, 1, "running", 1, NOW + 15, NOW - HOUR, None, json.dumps([index - ENDED + 2])))
            else:
                rows.append((index, 1, "queued", None, None, None, None, "[]"))
        rows[7] = (7, 1, "failed", None, None, created + 60, created + 70, "[0]")
        rows.append((7, 2, "succeeded", None, None, created + 100, created + 130, "[0]"))
        db.executemany(
            'INSERT INTO tasks (job_id, "index", attempt, state, worker_id, lease_expires_at, created_at,'
            " assigned_at, started_at, finished_at, gpu_indices) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(ARRAY_JOB, i, a, s, w, lease, created, st, st, fin, g) for i, a, s, w, lease, st, fin, g in rows],
        )
        task = db.execute('SELECT id FROM tasks WHERE job_id = ? AND "index" = 1500', (ARRAY_JOB,)).fetchall()[0][0]
        db.execute(
            "INSERT INTO events (at, kind, job_id, task_id, worker_id, data) VALUES"
            " (?, 'task_preempted', ?, ?, 1, '{\"reason\": \"priority\"}'),"
            " (?, 'task_reported', ?, ?, 1, '{\"restarts\": 1}'),"
            " (?, 'task_reported', ?, ?, 1, '{\"restarts\": 0}'),"
            " (?, 'job_finished', 9, NULL, NULL, '{\"state\": \"lost\"}')",
            (NOW - 3 * HOUR, ARRAY_JOB, task, NOW - 2 * HOUR, ARRAY_JOB, task, NOW - 2 * HOUR, ARRAY_JOB, task, NOW - HOUR),
        )
        # The usage ledger: this week 10 GPU-hours of `default`, last week 4 of `vision` and 2 of the evil name.
        for task_id, project, gpus, started, hours in ((2, 1, 4, NOW - 3 * HOUR, 2.5), (10, 2, 2, NOW - WEEK, 2.0), (10, 3, 1, NOW - WEEK, 2.0)):
            db.execute(
                "INSERT INTO usage (task_id, job_id, attempt, user_id, project_id, worker_id, gpus, cpus,"
                " started_at, ended_at, gpu_seconds, cpu_seconds, outcome)"
                " VALUES (?, 1, 1, 1, ?, 1, ?, 0, ?, ?, ?, 0, 'succeeded')",
                (task_id, project, gpus, started, started + hours * HOUR, gpus * hours * HOUR),
            )
        spec8 = {"command": ["vllm", "serve"], "service": {"port": 8000, "ingress": {"access": "token"}}}
        db.execute("UPDATE jobs SET spec = ? WHERE id = 8", (json.dumps(spec8),))
        db.execute("UPDATE tasks SET gpu_indices = '[0, 1]' WHERE id = 1")
        db.execute("INSERT INTO worker_gpus (worker_id, \"index\", healthy, reason, changed_at) VALUES (1, 7, 0, 'Xid 79', ?)", (NOW - HOUR,))
        if samples:
            ensure_gpu_samples(db)
            db.executemany(
                "INSERT INTO gpu_samples VALUES (1, ?, ?, ?, 40000, 81920)",
                [(gpu, at, 50.0) for gpu in range(8) for at in range(int(NOW - 2 * HOUR), int(NOW), 60)],
            )
    db.close()
