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


class _Calls:
    def __init__(self):
        self.made: list[tuple] = []

    def call(self, method, path, json=None, params=None):
        self.made.append((method, path, json))
        return {"id": 7}


def test_job_update_sends_a_services_changes_to_its_own_route_and_refuses_both_kinds_at_once():
    from gpulayer.client.jobs import Job
    calls = _Calls()
    job = Job(calls, {"id": 7})
    job.update(priority=3)
    job.update(env={"A": "1", "B": None}, canary=10)
    job.promote()
    job.rollback()
    assert calls.made == [("PATCH", "/jobs/7", {"priority": 3}),
                          ("PATCH", "/jobs/7/service", {"env": {"A": "1", "B": None}, "canary": 10}),
                          ("POST", "/jobs/7/service/promote", None), ("POST", "/jobs/7/service/rollback", None)]
    with pytest.raises(ValueError, match="name: not with a service's rolling update"):
        job.update(name="x", env={"A": "2"})
    assert len(calls.made) == 4
