"""Refusals in the words of what the user typed (issue 36 item 26): `--gpus two` answered in pydantic's
words ("Input should be a valid integer, unable to parse string as an integer"), `gl.job(gpu=1)` suggested
nothing, and a job file's `comand = [...]` was reported as "a job needs a command". Through real `gpulayer
submit` processes, and the Python API."""
from __future__ import annotations

import pytest

import gpulayer as gl
from gpulayer.testing import run_cli

NOWHERE = ["--url", "http://127.0.0.1:9", "--token", "glc_x"]  # refused before anything is sent


@pytest.mark.parametrize("args, told", [
    (["--gpus", "two"], "'--gpus': 'two' is not a whole number"),
    (["--cpus", "lots"], "'--cpus': 'lots' is not a number"),
    (["--gpus", "-1"], "'--gpus': -1: must be 0 or more"),
    (["--retry", "0"], "'--retry': 0: must be 1 or more"),
])
def test_a_bad_typed_option_is_told_in_the_options_words(args, told):
    done = run_cli(*NOWHERE, "submit", *args, "--", "true")
    assert done.returncode == 2 and told in done.stderr, done
    assert "Input should be" not in done.stderr, done


def test_a_misspelt_setting_names_the_one_meant():
    with pytest.raises(TypeError, match=r"unknown job setting: gpu \(did you mean gpus\?\)"):
        gl.job("python train.py", gpu=1)
    with pytest.raises(TypeError, match=r"unknown service setting: replica \(did you mean replicas\?\)"):
        gl.service("python serve.py", replica=2)
    with pytest.raises(TypeError, match=r"unknown job setting: zzz; known: name"):
        gl.job("true", zzz=1)


def test_a_job_files_unknown_key_is_named_not_taken_for_a_missing_command(tmp_path):
    job_file = tmp_path / "job.toml"
    job_file.write_text('comand = ["python", "train.py"]\ngpus = 1\n')
    done = run_cli(*NOWHERE, "submit", "--dry-run", "-f", str(job_file))
    assert done.returncode == 2 and "comand (did you mean command?)" in done.stderr, done
    assert "needs a command" not in done.stderr
    with pytest.raises(TypeError, match="comand"):
        gl.job_from_file(job_file)
