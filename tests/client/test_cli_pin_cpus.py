"""`worker start --pin-cpus` and `join --pin-cpus` (issue 40, point 3): the option (or GPULAYER_WORKER_PIN_CPUS)
reaches the agent's settings, off by default; `python -m agent --pin-cpus` the same."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

import gpulayer.cli.workers as workers
from agent.__main__ import build_parser
from gpulayer.cli.app import app

runner = CliRunner()


@pytest.fixture
def settings(monkeypatch):
    seen: list[dict] = []
    monkeypatch.setattr(workers, "_run", lambda given, _token=None: seen.append(given) or 0)
    return seen


@pytest.mark.parametrize("args, env, pinned", [
    (["worker", "start"], {}, False),
    (["worker", "start", "--pin-cpus"], {}, True),
    (["worker", "start"], {"GPULAYER_WORKER_PIN_CPUS": "1"}, True),
    (["join", "https://10.0.0.5:8470", "--pin-cpus"], {}, True),
])
def test_the_option_reaches_the_agent(settings, args, env, pinned):
    result = runner.invoke(app, ["--url", "http://127.0.0.1:9", *args], env=env)
    assert result.exit_code == 0, result.output
    assert settings[0]["pin_cpus"] is pinned


def test_the_agent_alone_takes_it():
    assert build_parser().parse_args(["--pin-cpus"]).pin_cpus is True
    assert build_parser().parse_args([]).pin_cpus is False
