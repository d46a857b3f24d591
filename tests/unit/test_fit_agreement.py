"""What a queued job says it waits for agrees with what acquire does.

For each case a fresh state file (pinned clock) holds the workers, secrets and
load described; the job is submitted; its waiting reason is read; then the
first worker acquires. The reason is None exactly when that acquire hands out a
task of the job (both read the view job_worker_fit).
"""
from __future__ import annotations

import pytest

from gpulayer.server.security.auth import Principal

from helpers import SERVER_JOIN, add_worker, job, state_of

TEAM_A = {"team": "a"}
TEAM_B = {"team": "b"}

# name, job spec, workers (the first one acquires), secrets {name: labels, or None: deleted after
# submit}, busy (a running task holds the first worker's first slot), runs there now
CASES = [
    ("no labels asked", {}, [{}], {}, False, True),
    ("labels match", {"labels": TEAM_A}, [{"token_labels": TEAM_A}], {}, False, True),
    ("label missing", {"labels": TEAM_A}, [{}], {}, False, False),
    ("label value differs", {"labels": {"team": "b"}}, [{"token_labels": TEAM_A}], {}, False, False),
    ("secret labels on token", {"secrets": ["KEY"]}, [{"token_labels": TEAM_A}], {"KEY": TEAM_A}, False, True),
    ("secret labels not on token", {"secrets": ["KEY"]}, [{}], {"KEY": TEAM_A}, False, False),
    ("secret without labels", {"secrets": ["KEY"]}, [{}], {"KEY": {}}, False, True),
    ("secret deleted since submit", {"secrets": ["KEY"]}, [{}], {"KEY": None}, False, False),
    ("gpus too many", {"gpus": 2}, [{"gpus": 1}], {}, False, False),
    ("gpus enough", {"gpus": 2}, [{"gpus": 2}], {}, False, True),
    ("cpus too many", {"cpus": 16}, [{"cpus": 8}], {}, False, False),
    ("memory too big", {"memory_mb": 32000}, [{"memory_mb": 16000}], {}, False, False),
    ("accelerator, no GPU", {"accelerator": "cuda"}, [{}], {}, False, False),
    ("accelerator, a GPU", {"accelerator": "cuda"}, [{"gpus": 1}], {}, False, True),
    ("busy worker", {}, [{}], {}, True, False),
    ("busy, a second slot", {}, [{"slots": 2}], {}, True, True),
    ("gang, two workers fit", {"nodes": 2}, [{}, {}], {}, False, True),
    ("gang, one worker fits", {"nodes": 2, "gpus": 1}, [{"gpus": 1}, {}], {}, False, False),
    ("gang, one worker busy", {"nodes": 2}, [{}, {}], {}, True, False),
    ("gang, the second worker may not have its secret", {"nodes": 2, "secrets": ["KEY"]},
     [{"token_labels": TEAM_A}, {}], {"KEY": TEAM_A}, False, False),
    ("gang, both may have its secret", {"nodes": 2, "secrets": ["KEY"]},
     [{"token_labels": TEAM_A}, {"token_labels": TEAM_A}], {"KEY": TEAM_A}, False, True),
    ("two secrets, each on another worker", {"secrets": ["A", "B"]},
     [{"token_labels": TEAM_A}, {"token_labels": TEAM_B}], {"A": TEAM_A, "B": TEAM_B}, False, False),
]


def _add(sched, n: int, spec: dict) -> int:
    token_labels = spec.pop("token_labels", None)
    token = (Principal(kind="join", jti=f"minted-{n}", name=f"w{n}", labels=token_labels)
             if token_labels is not None else SERVER_JOIN)
    return add_worker(sched, f"w{n}", token=token, **spec)


@pytest.mark.parametrize("name, spec, workers, secrets, busy, runs", CASES, ids=[c[0] for c in CASES])
def test_waiting_reason_agrees_with_acquire(sched, name, spec, workers, secrets, busy, runs):
    ids = [_add(sched, n, dict(w)) for n, w in enumerate(workers)]
    for secret, labels in secrets.items():
        sched.set_secret(secret, "value", labels or {})
    if busy:
        filler = sched.submit(job(name="filler"))
        taken = sched.acquire(ids[0])
        assert taken["job_id"] == filler
        sched.start(ids[0], taken["task_id"], 1)
    job_id = sched.submit(job(**spec))
    for secret in [s for s, labels in secrets.items() if labels is None]:
        sched.delete_secret(secret)
    reason = state_of(sched, job_id)["waiting_reason"]
    got = sched.acquire(ids[0])
    acquired = got is not None and got["job_id"] == job_id
    assert (reason is None) == acquired, f"{name}: waiting reason {reason!r}, acquire gave {got and got['job_id']}"
    assert acquired == runs, f"{name}: {reason!r}"
