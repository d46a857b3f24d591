"""What a waiting job is told (gpulayer.client.waiting) and job files (gpulayer.client.jobfile), without a server."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpulayer.cli.app import app
from gpulayer.client.jobfile import job_from_file, spec_from_fields
from gpulayer.client.waiting import WaitingNotice, waiting_message

runner = CliRunner()


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _queued(reason):
    return {"state": "queued", "attempt": 1, "waiting_reason": reason, "tasks": []}


def test_told_after_three_seconds_then_only_when_it_changes():
    told, clock = [], Clock()
    notice = WaitingNotice(told.append, clock=clock)
    assert notice.update(_queued("no online worker")) is None  # a job that starts at once says nothing
    clock.now += 3
    notice.update(_queued("no online worker"))
    clock.now += 1
    notice.update(_queued("no online worker"))
    notice.update(_queued("waiting for capacity: the online workers that fit are busy"))
    notice.update({"state": "running", "attempt": 1, "waiting_reason": None, "tasks": []})
    notice.update(_queued("no online worker"))  # retried, waiting again: told again
    assert told == ["no online worker", "waiting for capacity: the online workers that fit are busy",
                    "no online worker"]


def test_a_restarting_replica_is_told_with_its_index():
    job = {"state": "running", "attempt": 2, "waiting_reason": None, "tasks": [
        {"index": 0, "attempt": 2, "state": "running", "restart_message": "restart 4: exited with code 1; next run in 8 s"},
        {"index": 1, "attempt": 2, "state": "running", "restart_message": None},
        {"index": 0, "attempt": 1, "state": "failed", "restart_message": "restart 9: an older attempt"}]}
    assert waiting_message(job) == "replica 0: restart 4: exited with code 1; next run in 8 s"


def test_the_default_is_a_log_line(caplog):
    clock = Clock()
    notice = WaitingNotice(clock=clock, after=0)
    with caplog.at_level("INFO", logger="gpulayer"):
        notice.update(_queued("no online worker"))
    assert "waiting: no online worker" in caplog.text


def test_a_job_file_gives_gl_job_fields(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text('command = "python train.py --epochs 3"\ngpus = 1\nretry = 3\noutputs = ["out/"]\n'
                    '[env]\nSEED = "7"\n')
    assert job_from_file(path) == {"command": ["python", "train.py", "--epochs", "3"], "gpus": 1,
                                   "retry": {"max_attempts": 3}, "outputs": ["out/"], "env": {"SEED": "7"}}
    assert job_from_file(path, ["echo", "hi"], gpus=2, name=None)["gpus"] == 2
    assert job_from_file(path, ["echo", "hi"])["command"] == ["echo", "hi"]


def test_a_job_file_service_table():
    spec = spec_from_fields({"command": ["serve"], "service": {"replicas": 2, "health_path": "/ok"}},
                            service_overrides={"replicas": 3})
    assert spec["service"]["replicas"] == 3 and spec["service"]["health"] == {"http_path": "/ok"}
    assert spec_from_fields({"command": ["serve"], "service": False}).get("service") is None
    with pytest.raises(TypeError, match="unknown service setting"):
        spec_from_fields({"command": ["serve"], "service": {"replica": 2}})


def test_submit_dry_run_prints_the_spec_from_file_and_options(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text('command = ["python", "train.py"]\nname = "from-file"\ngpus = 1\n[labels]\npool = "a100"\n')
    result = runner.invoke(app, ["submit", "-f", str(path), "--gpus", "2", "--dry-run"])
    assert result.exit_code == 0, result.output
    spec = json.loads(result.output)
    assert spec == {"command": ["python", "train.py"], "name": "from-file", "gpus": 2, "labels": {"pool": "a100"}}
    result = runner.invoke(app, ["submit", "-f", str(path), "--dry-run", "--", "echo", "other"])
    assert json.loads(result.output)["command"] == ["echo", "other"]


@pytest.mark.parametrize("text,words", [
    ('command = ["x"]\ngpu = 1\n', "unknown job setting: gpu"),
    ('gpus = 1\n', "a job needs a command"),
    ('command = ["x"\n', "is not valid TOML"),
    ('command = ["x"]\nretry = 0\n', "retry is a number of attempts"),
])
def test_a_bad_job_file_is_a_usage_error(tmp_path, text, words):
    path = tmp_path / "job.toml"
    path.write_text(text)
    result = runner.invoke(app, ["submit", "-f", str(path), "--dry-run"])
    assert result.exit_code == 2 and words in result.output, result.output
    assert "Traceback" not in result.output


def test_a_missing_job_file_is_a_usage_error(tmp_path):
    result = runner.invoke(app, ["submit", "-f", str(tmp_path / "nope.toml")])
    assert result.exit_code == 2 and "nope.toml" in result.output
