"""Issue 27's options without a server: `--time` in Slurm's forms, `--signal`, `--grace`, `--begin` and
`--hold` in the JobSpec (--dry-run), and every bad value a usage error (exit 2) naming its option, sent nowhere."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from gpulayer.cli.app import app
from gpulayer.protocol import parse_begin, parse_signal, parse_time_limit

runner = CliRunner()
NOWHERE = ["--url", "http://127.0.0.1:9", "--token", "glc_x"]  # a usage error is found before anything is sent


def dry_run(*args: str) -> dict:
    result = runner.invoke(app, [*NOWHERE, "submit", "--dry-run", *args, "--", "true"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("90", 5400),
        ("5", 300),
        ("10:30", 630),
        ("1:00:00", 3600),
        ("2-3", 2 * 86400 + 3 * 3600),
        ("1-2:30", 86400 + 2 * 3600 + 1800),
        ("1-00:00:10", 86410),
        ("90m", 5400),
        ("2h", 7200),
    ],
)
def test_time_takes_slurms_forms_and_durations(text, seconds):
    assert parse_time_limit(text) == seconds
    assert dry_run("--time", text)["timeout_seconds"] == seconds


def test_signal_grace_hold_and_begin_in_the_spec():
    spec = dry_run("--time", "10", "--signal", "B:USR1@120", "--grace", "2m", "--hold", "--begin", "now+1h")
    assert spec["signal"] == "B:USR1@120" and spec["grace_seconds"] == 120 and spec["hold"] is True
    assert abs(spec["begin_at"] - (time.time() + 3600)) < 60


@pytest.mark.parametrize(
    "text, parsed",
    [
        ("USR1@120", (False, "USR1", 120)),
        ("B:USR1@120", (True, "USR1", 120)),
        ("SIGUSR2", (False, "USR2", 60)),
        ("10@5", (False, "USR1", 5)),
        ("term@0", (False, "TERM", 0)),
    ],
)
def test_signal_forms(text, parsed):
    assert parse_signal(text) == parsed


def test_begin_forms():
    now = 1_800_000_000.0
    assert parse_begin("now+90m", now) == now + 5400 and parse_begin("now", now) == now
    assert parse_begin("2027-01-15T08:00:00", now) == parse_begin("2027-01-15T09:00:00+01:00", now) == 1_800_000_000.0
    with pytest.raises(ValueError, match="in the past"):
        parse_begin("2020-01-01", now)


@pytest.mark.parametrize(
    "args, option",
    [
        (["--signal", "FOO@x"], "--signal"),
        (["--signal", "USR1@-5"], "--signal"),
        (["--signal", "KILL@5"], "--signal"),
        (["--time", "25:99"], "--time"),
        (["--time", "0"], "--time"),
        (["--time", "1:00", "--timeout", "60"], "--time"),
        (["--begin", "yesterday"], "--begin"),
        (["--begin", "2001-01-01"], "--begin"),
        (["--grace", "soon"], "--grace"),
    ],
)
def test_bad_values_are_usage_errors_naming_the_option(args, option):
    result = runner.invoke(app, [*NOWHERE, "submit", *args, "--", "true"])
    assert result.exit_code == 2 and option in result.output, result.output
    assert "Traceback" not in result.output and "cannot reach" not in result.output


@pytest.mark.parametrize(
    "args, option",
    [
        (["job", "update", "7", "--time", "25:99"], "--time"),
        (["job", "update", "7"], "--priority"),
        (["job", "requeue", "7", "8", "--index", "1"], "--index"),
        (["job", "wait", "7", "--timeout", "soon"], "--timeout"),
    ],
)
def test_job_control_usage_errors(args, option):
    result = runner.invoke(app, [*NOWHERE, *args])
    assert result.exit_code == 2 and option in result.output, result.output
