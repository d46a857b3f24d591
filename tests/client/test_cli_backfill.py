"""Backfill's and start-time estimates' settings at `server start` and `up` (issue 38): a value out of range is a usage error (exit 2) that
starts nothing and writes nothing; `submit --no-backfill` puts `backfill: false` in the spec."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpulayer.cli.app import app

runner = CliRunner()


@pytest.mark.parametrize("command", [["server", "start"], ["up"]])
@pytest.mark.parametrize("option, value, words", [
    ("--backfill", "maybe", "'on', 'off'"),
    ("--backfill-depth", "0", "must be 1 or more"),
    ("--backfill-depth", "101", "must be 100 or less"),
    ("--backfill-max-jobs", "0", "must be 1 or more"),
    ("--backfill-max-jobs", "100001", "must be 100000 or less"),
    ("--default-runtime", "0", "--default-runtime"),
    ("--default-runtime", "soon", "is not a duration"),
    ("--estimate-interval", "0", "must be more than 0 seconds"),
    ("--estimate-interval", "soon", "is not a duration"),
    ("--estimate-horizon", "forever", "is not a duration"),
    ("--estimate-max-jobs", "-1", "must be 0 or more"),
])
def test_backfill_settings_out_of_range_exit_2_and_change_nothing(tmp_path, command, option, value, words):
    home = tmp_path / "home"
    result = runner.invoke(app, [*command, "--home", str(home), option, value])
    assert result.exit_code == 2 and words in result.output, result.output
    assert not [p for p in home.rglob("*") if p.is_file()]  # no state file, no config


def test_no_backfill_is_in_the_spec():
    result = runner.invoke(app, ["submit", "--dry-run", "--json", "--no-backfill", "--gpus", "1", "--", "true"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["backfill"] is False
