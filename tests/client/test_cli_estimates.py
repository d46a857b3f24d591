"""How estimates read in the CLI (issue 38 points 2, 3): `job status`'s line, `job list --start`'s START
column and order, and `submit --test-only`'s answer and exit status, from Jobs and answers as the server
sends them (tests/integration/test_estimates.py runs them against a real control plane)."""
from __future__ import annotations

import time

import pytest

from gpulayer.cli import selection
from gpulayer.cli.common import fmt_start, start_parts
from gpulayer.cli.submit import _test_only

NOW = time.mktime((2026, 12, 7, 14, 0, 0, 0, 0, -1))  # local 14:00


@pytest.mark.parametrize("ahead,text", [(0, "now"), (20, "now"), (35 * 60, "14:35, in 35 min"),
                                        (125 * 60, "16:05, in 2 h 05 min")])
def test_a_start_reads_as_people_say_it(ahead, text):
    assert fmt_start(NOW + ahead, NOW) == text


def test_a_start_on_another_day_names_the_day():
    when, ahead = start_parts(NOW + 3 * 86400, NOW)
    assert when == time.strftime("%Y-%m-%d %H:%M", time.localtime(NOW + 3 * 86400)) and ahead == "in 3.0 days"


def test_status_and_list_lines():
    waiting = {"id": 3, "state": "queued", "estimated_start_at": NOW + 35 * 60, "estimate_reason": None}
    held = {"id": 2, "state": "waiting", "estimated_start_at": None, "estimate_reason": "held: ..."}
    running = {"id": 1, "state": "running", "estimated_start_at": None, "estimate_reason": None}
    assert selection.start_line(waiting, NOW) == "starts about 14:35, in 35 min"
    assert selection.start_line(held, NOW) == "start unknown: held: ..."
    assert selection.start_line(running, NOW) is None
    assert selection.start_line({"id": 4, "state": "queued"}, NOW) is None  # a server from before estimates
    assert selection.start_cell(held, NOW) == "N/A"
    soon = {**waiting, "id": 5, "estimated_start_at": NOW + 60}
    assert [j["id"] for j in sorted([held, waiting, soon], key=selection.start_order)] == [5, 3, 2]


def test_test_only_answers(capsys):
    answer = {"estimated_start_at": NOW + 35 * 60, "estimate_reason": None, "workers": ["gpu-03"], "runnable": True,
              "now": NOW}
    assert _test_only(answer, False) == 0
    assert capsys.readouterr().out == "would start about 14:35 (in 35 min) on gpu-03\n"
    assert _test_only({**answer, "estimated_start_at": NOW}, False) == 0
    assert capsys.readouterr().out == "would start now on gpu-03\n"
    never = {**answer, "estimated_start_at": None, "workers": [], "runnable": False,
             "estimate_reason": "no worker could ever run it: no online worker has 16 GPUs"}
    assert _test_only(never, False) == 1
    out = capsys.readouterr()
    assert out.out == "" and out.err == "Error: no worker could ever run it: no online worker has 16 GPUs\n"
    assert _test_only({**never, "runnable": True, "estimate_reason": "held: ..."}, False) == 0
    assert capsys.readouterr().out == "start unknown: held: ...\n"


def test_test_only_without_a_control_plane_is_a_usage_error():
    from typer.testing import CliRunner

    from gpulayer.cli.app import app
    result = CliRunner().invoke(app, ["submit", "--target", "local", "--test-only", "--", "true"])
    assert result.exit_code == 2 and "--test-only needs a control plane" in result.output
