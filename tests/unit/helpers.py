"""Small builders for scheduler tests."""
from __future__ import annotations

import itertools

from gpulayer.server.security.auth import Principal

SERVER_JOIN = Principal(kind="join", jti="server-join", name="server")
_SESSIONS = itertools.count(1)  # a session hash per registration (id() of a freed dict comes back)


def add_worker(sched, name="w", *, gpus=0, cpus=8, memory_mb=16000, slots=1, labels=None, token=SERVER_JOIN):
    """Register a worker directly through the scheduler; returns its id."""
    body = {"name": name, "labels": labels or {}, "slots": slots, "version": "test",
            "resources": {"cpus": cpus, "gpus": gpus, "memory_mb": memory_mb, "gpu_models": []}}
    return sched.register(body=body, token=token, session_hash=f"hash-{name}-{next(_SESSIONS)}",
                          peer_address="127.0.0.1")["worker_id"]


def job(command=("true",), **spec):
    return {"command": list(command), **spec}


def state_of(sched, job_id):
    from gpulayer.server.scheduler import views
    return sched.store.read(views.render, job_id)


def events_of(sched, job_id):
    """Every event of a job, oldest first (NotFound when there is no such job)."""
    from gpulayer.server.scheduler import views
    return sched.store.read(views.events_page, job_id, 0, -1)[0]
