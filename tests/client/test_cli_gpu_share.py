"""`submit --gpu-fraction / --gpu-memory` (issue 40, point 1) into the JobSpec, a bad size a usage error (exit 2)
before anything is sent; `worker start --gpu-sharing` with an unknown mode the same; `gl.job`'s settings."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpulayer.cli.app import app
from gpulayer.client.specs import job

runner = CliRunner()


def test_the_options_make_the_share():
    result = runner.invoke(app, ["submit", "--dry-run", "--gpu-memory", "10G", "--gpu-fraction", "0.25", "--", "serve"])
    assert result.exit_code == 0, result.output
    spec = json.loads(result.output)
    assert (spec["gpu_fraction"], spec["gpu_memory_mb"]) == (0.25, 10240)


@pytest.mark.parametrize("args, words", [
    (["submit", "--dry-run", "--gpu-memory", "10X", "--", "serve"], "is not a memory size"),
    (["submit", "--dry-run", "--gpu-fraction", "half", "--", "serve"], "--gpu-fraction"),
    (["worker", "start", "--gpu-sharing", "shared"], "expected mps, time-slice or off"),
])
def test_bad_share_options_exit_2(args, words):
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and words in result.output, result.output


def test_the_python_client_takes_a_memory_size():
    assert job("serve", gpu_fraction=0.5, gpu_memory_mb="2G") == {"command": ["serve"], "gpu_fraction": 0.5,
                                                                 "gpu_memory_mb": 2048}
    with pytest.raises(ValueError, match="gpu_fraction"):
        job("serve", gpu_fraction="half")
