"""How an array reads in `job status` and in a `job list` row (the CLI's rendering of the wire's Job)."""
from __future__ import annotations

from gpulayer.cli import selection
from gpulayer.cli.jobs import _print_array

NOW = 1_700_000_000.0


def _array(**fields):
    return {"indices": "0-2999", "size": 3000, "max_running": None, "counts": {}, "done": 0, "started_at": None,
            "failed_indices": [], "cancelled_indices": [], **fields}


def test_status_writes_indices_as_ranges_and_cancelled_apart(capsys):
    ended = [3, 4, 5, 9] + list(range(10, 1006))  # the first 1,000 not succeeded, by index
    _print_array(_array(counts={"failed": 3, "lost": 1, "cancelled": 2996}, done=3000, failed_indices=ended,
                        cancelled_indices=list(range(10, 1006))), 12)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "array 0-2999: 3000/3000 done (3 failed, 1 lost, 2996 cancelled)"
    assert lines[1] == "failed indices: 3-5,9  (their logs: gpulayer job logs 12 --index N)"
    assert lines[2] == "cancelled indices: 10-1005 ..."  # 2,996 cancelled, 996 named


def test_status_of_an_array_that_only_failed(capsys):
    _print_array(_array(indices="0-9", size=10, max_running=2, counts={"succeeded": 9, "failed": 1}, done=10,
                        failed_indices=[7]), 5)
    assert capsys.readouterr().out.splitlines()[1:] == ["failed indices: 7  (their logs: gpulayer job logs 5 --index N)"]


def _job(**fields):
    return {"id": 12, "state": "succeeded", "attempt": 1, "created_at": NOW - 100, "finished_at": NOW - 10,
            "spec": {"command": ["true"]}, "tasks": [], **fields}


def _row(job: dict, now: float) -> list:
    """A job as a `job list` row under HEADERS (the default columns)."""
    return selection.table_of([job], selection.DEFAULT_COLUMNS, now)[0][0]


def test_an_ended_array_row_has_its_elapsed_time():
    row = _row(_job(array=_array(counts={"succeeded": 3000}, done=3000, started_at=NOW - 70)), NOW)
    assert row[selection.HEADERS.index("ELAPSED")] == "0:01:00"  # from its first element's start to its end


def test_a_running_array_row_shows_its_retried_elements_workers():
    tasks = [{"task_id": 7, "index": 4, "attempt": 2, "state": "running", "worker_id": 3, "worker_name": "gpu-b",
              "started_at": NOW - 5},
             {"task_id": 2, "index": 4, "attempt": 1, "state": "failed", "worker_id": 1, "worker_name": "gpu-a",
              "started_at": NOW - 50}]
    row = _row(_job(state="running", finished_at=None, tasks=tasks,
                     array=_array(counts={"running": 1, "queued": 2999}, started_at=NOW - 90)), NOW)
    assert row[selection.HEADERS.index("WORKER")] == "gpu-b"  # a retry (attempt 2) is the element's current task
    assert row[selection.HEADERS.index("ELAPSED")] == "0:01:30"
