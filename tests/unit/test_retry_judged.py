"""How the retry policy judges a finish: by its outcome, never by the agent's words (issue 36 item 18).

The agent's finish carries a reason in words ("exit code 1", "timeout: ran longer than ...",
"rendezvous did not complete within 300 s: ..."); the job keeps them for people, and `retry_on`
reads `failed`, `timed_out` or `start_timeout`. A real state file and a pinned clock; the
real-process tests are in tests/integration/test_retry_reasons.py. `start_timeout` is tested here
only: the agent's rendezvous timeout (300 s) is no setting a real-process test can shorten.
"""
from __future__ import annotations

import pytest

from helpers import add_worker, job, state_of

RENDEZVOUS_WORDS = "rendezvous did not complete within 300 s: not every rank arrived"


def _take(sched, w):
    a = sched.acquire(w)
    sched.start(w, a["task_id"], 100)
    return a


def _finish(sched, w, task_id, outcome, reason, exit_code=None):
    return sched.finish(w, task_id, exit_code=exit_code, outcome=outcome, outputs={}, reason=reason)


@pytest.mark.parametrize("outcome, words, named", [
    ("failed", "exit code 1", "failed"),
    ("timed_out", "timeout: ran longer than timeout_seconds=2", "timed_out"),
    ("timed_out", "silence timeout: no output for silence_timeout_seconds=5", "timed_out"),
])
def test_an_outcome_named_in_retry_on_retries_whatever_the_agent_wrote(sched, outcome, words, named):
    w = add_worker(sched, "w")
    j = sched.submit(job(retry={"max_attempts": 2, "retry_on": [named]}))
    a = _take(sched, w)
    assert _finish(sched, w, a["task_id"], outcome, words, 1)
    info = state_of(sched, j)
    assert info["state"] == "queued" and info["attempt"] == 2, info
    last = _take(sched, w)
    assert _finish(sched, w, last["task_id"], outcome, words, 1)
    info = state_of(sched, j)
    assert info["state"] == "failed" and info["reason"] == words, info  # the words kept for people


def test_the_default_does_not_retry_a_failure(sched):
    w = add_worker(sched, "w")
    j = sched.submit(job(retry={"max_attempts": 3}))
    assert _finish(sched, w, _take(sched, w)["task_id"], "failed", "exit code 1", 1)
    assert state_of(sched, j)["state"] == "failed" and state_of(sched, j)["attempt"] == 1


def _gang_rank_times_out(sched, retry_on):
    ws = [add_worker(sched, f"w{i}") for i in range(2)]
    g = sched.submit(job(nodes=2, retry={"max_attempts": 2, "retry_on": retry_on}))
    held = [_take(sched, w) | {"w": w} for w in ws]
    first = held[0]
    sched.rendezvous(first["w"], first["task_id"], "10.0.0.1", 29500)  # the other rank never arrives
    assert _finish(sched, first["w"], first["task_id"], "failed", RENDEZVOUS_WORDS)
    return state_of(sched, g)


def test_a_gang_rank_whose_rendezvous_timed_out_is_judged_start_timeout(sched):
    info = _gang_rank_times_out(sched, ["start_timeout"])
    assert info["state"] == "queued" and info["attempt"] == 2, info


def test_a_start_timeout_is_not_a_failure(sched):
    info = _gang_rank_times_out(sched, ["failed"])
    assert info["state"] == "failed" and info["attempt"] == 1, info


def test_a_rank_failing_after_its_rendezvous_completed_is_a_failure(sched):
    ws = [add_worker(sched, f"w{i}") for i in range(2)]
    g = sched.submit(job(nodes=2, retry={"max_attempts": 2, "retry_on": ["start_timeout"]}))
    held = [_take(sched, w) | {"w": w} for w in ws]
    for i, a in enumerate(held):
        sched.rendezvous(a["w"], a["task_id"], f"10.0.0.{i + 1}", 29500)
    assert _finish(sched, held[0]["w"], held[0]["task_id"], "failed", "exit code 1", 1)
    assert state_of(sched, g)["state"] == "failed"
