"""What a Slurm user types, read as Slurm reads it (issue 36 items 24 and 28): a bare `--time` number is
minutes with a fraction or not (`1.5` was 1.5 seconds while `90` was 90 minutes), `--time UNLIMITED`
(or `infinite`) is no limit, `--memory 10G` is Slurm's `--mem`, and a `--signal` with no time limit to
fire before is told. Each through a real `gpulayer submit --dry-run` process, and the parsers alone."""
from __future__ import annotations

import json

import pytest

from gpulayer.client.specs import memory_mb
from gpulayer.protocol import parse_time_limit
from gpulayer.testing import run_cli

NOWHERE = ["--url", "http://127.0.0.1:9", "--token", "glc_x"]  # --dry-run sends nothing


def _dry_run(*args: str):
    return run_cli(*NOWHERE, "submit", "--dry-run", *args, "--", "true")


@pytest.mark.parametrize("text, seconds", [("1.5", 90), ("90", 5400), ("0.5", 30), ("2.25", 135), ("1:30", 90)])
def test_a_bare_time_is_minutes_with_a_fraction_or_not(text, seconds):
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize("text, mb", [("512", 512), ("512M", 512), ("10G", 10240), ("10g", 10240), ("1.5G", 1536),
                                      ("2048K", 2), ("1T", 1 << 20), ("1.5", 2), ("4GB", 4096)])
def test_memory_takes_slurms_units(text, mb):
    assert memory_mb(text) == mb


@pytest.mark.parametrize("text", ["two", "10X", "-1G", "", "G"])
def test_a_bad_memory_size_is_refused(text):
    with pytest.raises(ValueError, match="not a memory size"):
        memory_mb(text)


def test_the_cli_reads_time_memory_and_unlimited_as_slurm_does():
    done = _dry_run("--time", "1.5", "--memory", "10G")
    assert done.returncode == 0, done
    spec = json.loads(done.stdout)
    assert spec["timeout_seconds"] == 90 and spec["memory_mb"] == 10240, spec
    for word in ("UNLIMITED", "infinite"):
        done = _dry_run("--time", word, "--mem", "512M")
        assert done.returncode == 0, done
        spec = json.loads(done.stdout)
        assert "timeout_seconds" not in spec and spec["memory_mb"] == 512, spec


def test_bad_or_doubled_memory_is_a_usage_error():
    for args in (["--memory", "lots"], ["--memory", "1G", "--memory-mb", "5"]):
        done = _dry_run(*args)
        assert done.returncode == 2 and "--memory" in done.stderr and not done.stdout, done


def test_a_signal_without_a_time_limit_is_told():
    done = _dry_run("--signal", "USR1@60")
    assert done.returncode == 0 and "no time limit" in done.stderr and "--time" in done.stderr, done
    quiet = _dry_run("--signal", "USR1@60", "--time", "10")
    assert quiet.returncode == 0 and "warning" not in quiet.stderr, quiet


def test_time_unlimited_wins_over_a_job_files_limit(tmp_path):
    (tmp_path / "job.toml").write_text('command = ["true"]\ntimeout_seconds = 60\n')
    done = run_cli(*NOWHERE, "submit", "--dry-run", "-f", str(tmp_path / "job.toml"), "--time", "UNLIMITED")
    assert done.returncode == 0 and "timeout_seconds" not in json.loads(done.stdout), done
