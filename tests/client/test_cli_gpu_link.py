"""`submit --gpu-link nvlink` and `--same LABEL[=VALUE]` (issue 40, point 3) into the JobSpec; bad input a usage
error (exit 2) before anything is sent; `job status` shows both (docs/workers.md, "Topology")."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpulayer.cli.app import app

runner = CliRunner()


def test_the_options_make_the_spec():
    result = runner.invoke(app, ["submit", "--dry-run", "--nodes", "2", "--gpus", "4", "--gpu-link", "nvlink",
                                 "--same", "rack", "--same", "ib-switch=s1", "--label", "pool=a", "--", "train"])
    assert result.exit_code == 0, result.output
    spec = json.loads(result.output)
    assert (spec["gpu_link"], spec["same"], spec["labels"]) == ("nvlink", ["rack", "ib-switch"],
                                                                {"pool": "a", "ib-switch": "s1"})


@pytest.mark.parametrize("args, words", [
    (["--gpus", "2", "--gpu-link", "pcie"], "'pcie' is not one of 'nvlink'"),
    (["--gpus", "1", "--gpu-link", "nvlink"], "give gpus 2 or more, not 1"),
    (["--same", "rack"], "give nodes 2 or more"),
    (["--nodes", "2", "--same", ""], "not empty"),
    (["--nodes", "2", "--same", "rack=r1", "--same", "rack=r2"], "two values"),
])
def test_bad_wiring_options_exit_2(args, words):
    result = runner.invoke(app, ["submit", "--dry-run", *args, "--", "train"])
    assert result.exit_code == 2 and words in result.output, result.output


class _Job:
    def __init__(self, data):
        self.data = data


def test_job_status_shows_the_wiring(monkeypatch):
    info = {"id": 7, "state": "queued", "spec": {"gpu_link": "nvlink", "same": ["rack", "ib-switch"]},
            "tasks": [], "waiting_reason": "no online worker has 8 GPUs joined by NVLink (...)"}
    monkeypatch.setattr("gpulayer.cli.jobs.client_of", lambda ctx: type("C", (), {"get_job": lambda self, j: _Job(info)})())
    result = runner.invoke(app, ["job", "status", "7"])
    assert result.exit_code == 0, result.output
    assert "gpu_link=nvlink same=rack,ib-switch\n" in result.output, result.output
    info["spec"] = {}
    assert "gpu_link" not in runner.invoke(app, ["job", "status", "7"]).output
