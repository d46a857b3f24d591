"""Job arrays and dependencies (issue 16), transaction by transaction on a real state file."""
from __future__ import annotations

import dataclasses

import pytest

from gpulayer.protocol.fields import to_wire
from gpulayer.protocol.jobspec import After
from gpulayer.server.errors import InvalidRequest, NotFound
from gpulayer.server.scheduler import jobs, views
from gpulayer.server.scheduler.spec import MAX_ARRAY, array_indices, array_text, validate_job
from helpers import add_worker, events_of, job, state_of


def finish(sched, w, task_id, exit_code=0):
    return sched.finish(w, task_id, exit_code=exit_code, outcome="succeeded" if exit_code == 0 else "failed",
                        outputs={}, reason=None)


def run(sched, w, exit_code=0):
    """Acquire, start and finish one task on w; its assignment (None when there was nothing)."""
    a = sched.acquire(w)
    if a is not None:
        sched.start(w, a["task_id"], 100)
        finish(sched, w, a["task_id"], exit_code)
    return a


def queued_in_task_queue(sched, job_id):
    return sched.store.read(lambda c: c.execute("SELECT count(*) AS n FROM task_queue WHERE job_id = ?",
                                                (job_id,)).fetchall()[0]["n"])


# -- the spec -----------------------------------------------------------------

@pytest.mark.parametrize("text, indices", [
    ("0-3", [0, 1, 2, 3]), ("1,5,9-12", [1, 5, 9, 10, 11, 12]), ("0-15:4", [0, 4, 8, 12]), ("7", [7]),
    ([3, 1, 2], [1, 2, 3]),
])
def test_array_indices(text, indices):
    assert array_indices(text) == indices
    assert array_indices(array_text(indices)) == indices


@pytest.mark.parametrize("spec, message", [
    ({"array": "5-1"}, "goes up"), ({"array": "a-b"}, "not an index"), ({"array": "1,1"}, "appears twice"),
    ({"array": f"0-{MAX_ARRAY}"}, "at most"), ({"array": "0-9%0"}, "between 1"), ({"array": "0-9%x"}, "whole number"),
    ({"array": "0-9%4", "max_running": 5}, "give one"), ({"max_running": 4}, "give `array` too"),
    ({"array": "0-3", "nodes": 2}, "single tasks"), ({"array": 7}, "must be a string"),
    ({"after": [0]}, "between 1"), ({"after": ["4:sometimes"]}, "condition"), ({"after": ["4:ok", "4:any"]}, "twice"),
    ({"after": "4"}, "must be a list"),
    # ASCII digits only: "٣" (Arabic-Indic three) and "²" are no job id, index or cap; nor are 5,000 digits
    ({"after": ["\u0663"]}, "not a job id"), ({"after": ["\u00b2"]}, "not a job id"), ({"after": ["9" * 5000]}, "not a job id"),
    ({"array": "0-3%\u0663"}, "whole number"), ({"array": "0-3%\u00b2"}, "whole number"), ({"array": "\u0663"}, "not an index"),
    ({"array": "9" * 5000}, "not an index"), ({"after": ["9" * 19]}, "between 1"),
])
def test_bad_array_or_after_refused_by_field(spec, message):
    with pytest.raises(InvalidRequest, match=message):
        validate_job(job(**spec))


def test_array_spec_is_normalised():
    spec = validate_job(job(array="0-999%16", after=[3, "4:notok", {"job": 5, "condition": "any"}]))
    assert (spec.array, spec.max_running) == ("0-999", 16)
    assert spec.after == [After(job=3, condition="ok"), After(job=4, condition="notok"), After(job=5, condition="any")]
    assert to_wire(spec)["after"] == [{"job": 3, "condition": "ok"}, {"job": 4, "condition": "notok"},
                                      {"job": 5, "condition": "any"}]
    plain = validate_job(job())
    assert (plain.array, plain.max_running, plain.after) == (None, None, [])


# -- arrays -------------------------------------------------------------------

def test_array_elements_run_with_their_index_and_share_a_worker(sched):
    w = add_worker(sched, "w", slots=4)
    job_id = sched.submit(job(array="1,5,9-10"))
    taken = sched.acquire_many(w, 0, 4)
    assert sorted(a["index"] for a in taken) == [1, 5, 9, 10]  # one worker holds several elements of it
    assert {(a["array_index"], a["array_size"]) for a in taken} == {(i, 4) for i in (1, 5, 9, 10)}
    for a in taken:
        sched.start(w, a["task_id"], 1)
    for a in taken[:-1]:
        finish(sched, w, a["task_id"])
    view = state_of(sched, job_id)
    assert view["state"] == "running"
    assert view["array"]["counts"] == {"succeeded": 3, "running": 1} and view["array"]["done"] == 3
    finish(sched, w, taken[-1]["task_id"])
    view = state_of(sched, job_id)
    assert (view["state"], view["exit_code"], view["array"]["done"]) == ("succeeded", 0, 4)


def test_plain_job_assignment_has_no_array_fields(sched):
    w = add_worker(sched, "w")
    sched.submit(job())
    a = sched.acquire(w)
    assert (a["array_index"], a["array_size"]) == (None, None)


def test_failed_elements_fail_the_array_with_counts_and_indices(sched):
    w = add_worker(sched, "w")
    job_id = sched.submit(job(array="0-4"))
    for code in (0, 3, 0, 0, 7):
        run(sched, w, code)
    view = state_of(sched, job_id)
    assert (view["state"], view["reason"], view["exit_code"]) == ("failed", "array_elements_failed", 3)
    assert view["array"]["counts"] == {"succeeded": 3, "failed": 2}
    assert view["array"]["failed_indices"] == [1, 4]
    assert [t["index"] for t in view["tasks"]] == [1, 4]  # an array lists its active and failed tasks only
    assert [t["index"] for t in sched.store.read(views.render, job_id, 4)["tasks"]] == [4]


def test_each_element_retries_alone(sched):
    w = add_worker(sched, "w")
    job_id = sched.submit(job(array="0-1", retry={"max_attempts": 2, "retry_on": ["failed"]}))
    first = run(sched, w, 1)  # element 0 fails once: only it runs again, after element 1
    second = run(sched, w, 0)
    third = run(sched, w, 0)
    assert (first["index"], second["index"], third["index"]) == (0, 1, 0)
    assert (third["attempt"], second["attempt"]) == (2, 1)
    assert run(sched, w) is None
    view = state_of(sched, job_id)
    assert view["state"] == "succeeded" and view["attempt"] == 1
    attempts = [(t["index"], t["attempt"], t["state"]) for t in sched.store.read(views.render, job_id, 0)["tasks"]]
    assert attempts == [(0, 2, "succeeded"), (0, 1, "failed")]


def test_running_cap_holds_in_acquire(sched):
    w = add_worker(sched, "w", slots=8)
    job_id = sched.submit(job(array="0-9%3"))
    assert queued_in_task_queue(sched, job_id) == 3  # the rest are held: acquire never sees them
    taken = sched.acquire_many(w, 0, 8)
    assert [a["index"] for a in taken] == [0, 1, 2]
    for a in taken:
        sched.start(w, a["task_id"], 1)
    finish(sched, w, taken[0]["task_id"])  # one ends: the next held element is released
    more = sched.acquire_many(w, 0, 8)
    assert [a["index"] for a in more] == [3]
    sched.start(w, more[0]["task_id"], 1)
    active, done = taken[1:] + more, 1
    while active:
        finish(sched, w, active.pop(0)["task_id"])
        done += 1
        for b in sched.acquire_many(w, 0, 8):
            sched.start(w, b["task_id"], 1)
            active.append(b)
        running = sched.store.read(lambda c: c.execute(
            "SELECT count(*) AS n FROM tasks WHERE job_id = ? AND state IN ('assigned', 'running')",
            (job_id,)).fetchall()[0]["n"])
        assert running <= 3
    assert done == 10 and state_of(sched, job_id)["state"] == "succeeded"


def test_cancel_one_element_or_the_whole_array(sched):
    w = add_worker(sched, "w", slots=2)
    job_id = sched.submit(job(array="0-5%2"))
    a, b = sched.acquire_many(w, 0, 2)
    sched.start(w, a["task_id"], 1)
    assert sched.cancel(job_id, 4) is True          # a held element: ends now, frees no place under the cap
    assert sched.cancel(job_id, 4) is False         # already ended
    assert sched.cancel(job_id, a["index"]) is True  # a running one: stopped through its worker
    assert sched.store.read(lambda c: c.execute("SELECT cancel_requested FROM tasks WHERE id = ?",
                                                (a["task_id"],)).fetchall()[0]["cancel_requested"]) == 1
    sched.finish(w, a["task_id"], exit_code=-15, outcome="cancelled", outputs={}, reason="cancelled")
    view = state_of(sched, job_id)
    assert view["state"] == "running" and view["array"]["counts"]["cancelled"] == 2
    with pytest.raises(NotFound):
        sched.cancel(job_id, 99)
    with pytest.raises(InvalidRequest, match="no array") as refused:
        sched.cancel(sched.submit(job()), 0)
    assert "--" not in str(refused.value)  # said for the wire, not for the CLI's flags
    assert sched.cancel(job_id) is True
    assert state_of(sched, job_id)["state"] == "cancelled"


def test_ten_thousand_elements_in_one_transaction(sched):
    w = add_worker(sched, "w", slots=2)
    job_id = sched.submit(job(array="0-9999%16"))
    view = state_of(sched, job_id)
    assert view["array"]["size"] == 10_000 and view["array"]["counts"] == {"queued": 16, "held": 9984}
    assert queued_in_task_queue(sched, job_id) == 16
    assert [a["index"] for a in sched.acquire_many(w, 0, 2)] == [0, 1]


# -- dependencies ---------------------------------------------------------------

def test_waiting_job_is_released_by_the_last_dependency(sched):
    w = add_worker(sched, "w")
    first, second = sched.submit(job()), sched.submit(job())
    after = sched.submit(job(after=[first, f"{second}:any"]))
    view = state_of(sched, after)
    assert view["state"] == "waiting"
    assert view["waiting_reason"] == f"for job {first} to succeed and job {second} to end"
    assert queued_in_task_queue(sched, after) == 0  # waiting costs acquire nothing
    assert run(sched, w)["job_id"] == first
    assert state_of(sched, after)["state"] == "waiting"
    assert run(sched, w, 2)["job_id"] == second  # `any`: a failure still releases it
    assert state_of(sched, after)["state"] == "queued"
    assert run(sched, w)["job_id"] == after
    assert state_of(sched, after)["state"] == "succeeded"
    assert [d["job"] for d in state_of(sched, after)["after"]] == [first, second]


def test_failed_dependency_cancels_down_the_chain(sched):
    w = add_worker(sched, "w")
    head = sched.submit(job())
    chain = [head]
    for _ in range(50):
        chain.append(sched.submit(job(after=[chain[-1]])))
    on_failure = sched.submit(job(after=[f"{chain[10]}:notok"]))
    anyway = sched.submit(job(after=[f"{chain[20]}:any"]))
    run(sched, w, 1)
    for job_id in chain[1:]:
        view = state_of(sched, job_id)
        assert (view["state"], view["reason"]) == ("cancelled", "dependency_failed")
        assert [t["reason"] for t in view["tasks"]] == ["dependency_failed"]  # its task says so too
    assert state_of(sched, on_failure)["state"] == "queued"
    assert state_of(sched, anyway)["state"] == "queued"
    kinds = [e["kind"] for e in events_of(sched, chain[1])]
    assert "dependency_failed" in kinds and "job_finished" in kinds


def test_dependency_already_ended(sched):
    w = add_worker(sched, "w")
    done = sched.submit(job())
    run(sched, w)
    assert state_of(sched, sched.submit(job(after=[done])))["state"] == "queued"
    never = sched.submit(job(after=[f"{done}:notok"]))
    assert (state_of(sched, never)["state"], state_of(sched, never)["reason"]) == ("cancelled", "dependency_failed")
    with pytest.raises(InvalidRequest, match="no job 999"):
        sched.submit(job(after=[999]))


def test_waiting_array_released_under_its_cap_and_cancelled_while_waiting(sched):
    w = add_worker(sched, "w", slots=8)
    first = sched.submit(job())
    array = sched.submit(job(array="0-9%2", after=[first]))
    assert state_of(sched, array)["array"]["counts"] == {"held": 10}
    run(sched, w)
    assert queued_in_task_queue(sched, array) == 2
    assert len(sched.acquire_many(w, 0, 8)) == 2
    waiting = sched.submit(job(after=[array]))
    assert sched.cancel(waiting) is True
    assert state_of(sched, waiting)["state"] == "cancelled"


def test_retention_prunes_jobs_with_dependencies(sched, clock):
    from gpulayer.server.scheduler import retention
    w = add_worker(sched, "w")
    first = sched.submit(job())
    after = sched.submit(job(after=[first]))
    never = sched.submit(job(after=[f"{first}:notok"]))
    run(sched, w)
    run(sched, w)
    assert {state_of(sched, j)["state"] for j in (first, after, never)} == {"succeeded", "cancelled"}
    clock.advance(100)
    result = retention.prune(sched.store, now=clock(), log_retention_s=10, job_retention_s=10)
    assert result["jobs"] == 3
    assert sched.store.read(lambda c: c.execute("SELECT count(*) AS n FROM job_dependencies").fetchall()[0]["n"]) == 0


def _chain(sched, n: int) -> tuple[int, int]:
    head = sched.submit(job())
    spec = validate_job(job(after=[head]))

    def chain(conn, n):
        last = head
        for _ in range(n):
            last = jobs.submit(conn, dataclasses.replace(spec, after=[After(job=last)]), 1.0)
        return last

    return head, sched.store.write(chain, n)


def _waiting(sched) -> int:
    return sched.store.read(lambda c: c.execute("SELECT count(*) AS n FROM jobs WHERE state = 'waiting'")
                            .fetchall())[0]["n"]


def test_a_long_chain_cascades_link_by_link(sched):
    """Deeper than Python's recursion limit and longer than the steps the finish runs itself: each link
    is a write of its own (issue 22), the cascade thread runs the rest, and the whole chain ends."""
    w = add_worker(sched, "w")
    head, last = _chain(sched, 1500)
    assert state_of(sched, last)["state"] == "waiting"
    run(sched, w, 1)
    sched.cascades.join(60)
    assert state_of(sched, last)["reason"] == "dependency_failed"
    assert _waiting(sched) == 0 and sched.cascades.steps_run >= 1500


def test_with_nothing_to_run_its_steps_a_cascade_is_a_loop_in_one_transaction(sched, clock):
    """A direct store.write (tools, tests) has no cascade driver: the chain ends in that transaction."""
    head, last = _chain(sched, 1500)
    sched.store.write(jobs.cancel, head, clock())
    assert state_of(sched, last)["reason"] == "dependency_failed"
    assert _waiting(sched) == 0 and sched.cascades.steps_run == 0


def test_counts_and_indices_follow_each_element_s_latest_attempt(sched):
    w = add_worker(sched, "w", slots=2)
    job_id = sched.submit(job(array="0-5", retry={"max_attempts": 2, "retry_on": ["failed"]}))
    assert state_of(sched, job_id)["array"]["started_at"] is None
    assert run(sched, w, 1)["index"] == 0        # element 0 fails once: its retry is queued
    view = state_of(sched, job_id)
    assert view["array"]["counts"] == {"queued": 6} and view["array"]["failed_indices"] == []
    assert [(t["index"], t["attempt"], t["state"]) for t in view["tasks"]] == [(0, 1, "failed")]  # still listed
    assert view["array"]["started_at"] == sched.clock()
    for code in (0, 0, 2, 0, 0):                 # elements 1-5: element 3 fails once, then again
        run(sched, w, code)
    run(sched, w, 0)                             # element 0's retry succeeds
    run(sched, w, 5)                             # element 3's retry fails: no third attempt
    view = state_of(sched, job_id)
    assert view["state"] == "failed"
    assert view["array"]["counts"] == {"succeeded": 5, "failed": 1} and view["array"]["done"] == 6
    assert view["array"]["failed_indices"] == [3] and view["array"]["cancelled_indices"] == []


def test_cancelled_elements_are_named_apart_from_failed_ones(sched):
    w = add_worker(sched, "w")
    job_id = sched.submit(job(array="0-2999%1"))
    run(sched, w, 4)                              # element 0 fails
    assert sched.cancel(job_id) is True           # the rest, held or queued, are cancelled
    view = state_of(sched, job_id)
    assert view["array"]["counts"] == {"failed": 1, "cancelled": 2999}
    assert len(view["array"]["failed_indices"]) == views.ARRAY_FAILED_SHOWN
    assert view["array"]["failed_indices"][:2] == [0, 1]
    assert view["array"]["cancelled_indices"] == list(range(1, views.ARRAY_FAILED_SHOWN))
