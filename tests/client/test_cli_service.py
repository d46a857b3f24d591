"""`gpulayer service update`'s usage errors, found before anything is sent (exit 2, `Error:` naming the option);
the command against a real plane is tests/integration/test_rolling_updates.py's."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gpulayer.cli.app import app

runner = CliRunner()
NOWHERE = ["--url", "http://127.0.0.1:9", "--token", "glc_x"]


@pytest.mark.parametrize("args, said", [
    (["7", "--env", "A=1", "--canary", "0"], "--canary"),
    (["7", "--env", "A=1", "--canary", "100"], "--canary"),
    (["7"], "give what the new revision changes"),
    (["7", "--env", "novalue"], "--env"),
    (["7", "--env", "A=1", "--max-surge", "-1"], "--max-surge"),
])
def test_service_update_usage_errors(args, said):
    result = runner.invoke(app, [*NOWHERE, "service", "update", *args])
    assert result.exit_code == 2, result.output
    assert said in result.output
