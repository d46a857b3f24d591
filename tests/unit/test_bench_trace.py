"""The summarising half of issue 38's real-plane bench (scripts/bench_trace.py), on a tiny fixed run.

No process is started: the state file's rows are given as Records, and the run is measured by the same
tracesim.summary() as the offline simulation.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_trace  # noqa: E402
import tracesim  # noqa: E402
from bench_trace import Record, Submitted  # noqa: E402
from tracegen import TraceJob  # noqa: E402

T0 = 1_000.0
TRACE = [TraceJob(1, 0.0, 8, 10.0, 20.0), TraceJob(2, 1.0, 32, 5.0, 10.0), TraceJob(3, 2.0, 4, 4.0, 8.0)]


def record(job_id, assigned, ended, created, state="succeeded"):
    return Record(job_id, state, T0 + created, T0 + ended, T0 + assigned, T0 + assigned + 0.1, T0 + ended, 1)


def test_job_spec_makes_gangs_of_whole_workers_and_keeps_the_limit():
    assert bench_trace.job_spec(TRACE[0]) == {"name": "trace-1", "command": ["sleep", "10"], "gpus": 8,
                                              "timeout_seconds": 20.0}
    gang = bench_trace.job_spec(TRACE[1])
    assert (gang["gpus"], gang["nodes"], gang["command"]) == (8, 4, ["sleep", "5"])


def test_a_run_is_measured_as_tracesim_measures_a_simulation():
    sent = {1: Submitted(1, 11), 2: Submitted(2, 12, estimate=T0 + 12.0), 3: Submitted(3, 13)}
    records = {11: record(11, 0.5, 10.5, 0.0), 12: record(12, 10.5, 15.5, 1.0), 13: record(13, 2.0, 6.0, 2.0)}
    outcome, problems = bench_trace.outcome_of(TRACE, sent, records, T0)
    assert problems == []
    assert outcome.starts == {1: 0.5, 2: 10.5, 3: 2.0} and outcome.ends == {1: 10.5, 2: 15.5, 3: 6.0}
    assert outcome.estimates == {1: None, 2: 12.0, 3: None}
    assert [t["id"] for t in bench_trace.last_to_end(TRACE, outcome, 2)] == [1, 2]
    row = tracesim.summary(TRACE, outcome, workers=4)
    assert row["makespan_s"] == 15.5
    assert row["utilisation"] == pytest.approx((8 * 10 + 32 * 5 + 4 * 4) / (32 * 15.5))
    assert row["largest_worst_wait_s"] == 9.5 and row["waited"] == 1
    assert row["estimate_median_error"] == pytest.approx(1.5 / 9.5)   # |12 - 10.5| over the 9.5 s wait
    easy = {**row, "utilisation": row["utilisation"] / 0.98, "mean_jct_s": row["mean_jct_s"],
            "largest_worst_wait_s": row["largest_worst_wait_s"] / 2}
    verdict = {r["measure"]: r for r in bench_trace.against_easy(row, easy)}
    assert verdict["largest_worst_wait_s"]["ratio"] == pytest.approx(2.0)
    assert verdict["largest_worst_wait_s"]["met"] is False
    assert verdict["utilisation"]["met"] is True and verdict["mean_jct_s"]["met"] is True
    assert verdict["estimate_median_error"]["met"] is True
    assert "MISSED" in bench_trace.verdicts(list(verdict.values()))


def test_jobs_that_did_not_run_are_named_and_no_estimate_reads_n_a():
    sent = {1: Submitted(1, 11), 2: Submitted(2, error="HTTPError: 400"), 3: Submitted(3, 13)}
    records = {11: record(11, 0.5, 10.5, 0.0), 13: record(13, 2.0, 2.5, 2.0, state="failed")}
    outcome, problems = bench_trace.outcome_of(TRACE, sent, records, T0)
    assert set(outcome.starts) == {1, 3}
    assert problems == ["trace job 2: not submitted (HTTPError: 400)", "trace job 3 (job 13): failed"]
    row = tracesim.summary([TRACE[0], TRACE[2]], outcome, workers=4)
    assert row["estimate_median_error"] is None
    assert "n/a" in bench_trace.table([row])


def test_a_small_task_sent_to_an_idle_worker_while_a_busy_one_had_room_is_a_fit_miss():
    tasks = [(1, 4, 0.0, 10.0), (2, 4, 1.0, 10.0), (3, 8, 2.0, 5.0), (1, 4, 3.0, 9.0)]
    # the second goes to idle worker 2 while worker 1 has 4 free (a miss); the fourth fills worker 1 (no miss)
    assert bench_trace.fit_misses(tasks) == {"small_tasks": 3, "to_an_idle_worker_while_a_busy_one_fit": 1}


def test_a_job_whose_submit_answer_had_no_estimate_takes_the_first_one_watched():
    watcher = bench_trace.EstimateWatcher(plane=None)
    watcher.first = {11: (T0 + 12.0, T0 + 3.0), 12: (T0 + 30.0, T0 + 4.0)}
    sent = {1: Submitted(1, 11), 2: Submitted(2, 12, estimate=T0 + 20.0, estimated_at=T0 + 1.0), 3: Submitted(3, 13)}
    watcher.fill(sent)
    assert [(m.estimate, m.estimated_at) for m in sent.values()] == [
        (T0 + 12.0, T0 + 3.0), (T0 + 20.0, T0 + 1.0), (None, None)]   # the submit answer's stays
    records = {11: record(11, 0.5, 10.5, 0.0), 12: record(12, 10.5, 15.5, 1.0), 13: record(13, 2.0, 6.0, 2.0)}
    told = bench_trace.overheads(TRACE, sent, records, T0)["created_to_estimate"]
    assert (told["mean_s"], told["max_s"]) == (1.5, 3.0)
