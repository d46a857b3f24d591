"""`submit --wait/--follow --json` print JSON only, one object per line, ending with the Job as it ended.

Against the session's real control plane and worker processes, and a `--target local` run.
"""
from __future__ import annotations

import json

from gpulayer.testing import run_cli


def _objects(stdout: str) -> list[dict]:
    lines = stdout.splitlines()
    assert lines, "nothing on stdout"
    return [json.loads(line) for line in lines]  # a raw log line here fails to parse


def test_wait_json_prints_the_job_as_it_ended(cluster):
    result = cluster.cli("submit", "--wait", "--json", "--", "sh", "-c", "echo hi; exit 3")
    assert result.returncode == 3, result.stderr
    [job] = _objects(result.stdout)
    assert job["state"] == "failed" and job["exit_code"] == 3 and job["finished_at"] is not None


def test_follow_json_prints_one_object_per_line_then_the_final_job(cluster):
    result = cluster.cli("submit", "--follow", "--json", "--", "sh", "-c", "echo out; echo err >&2")
    assert result.returncode == 0, result.stderr
    *lines, job = _objects(result.stdout)
    assert job["state"] == "succeeded" and job["exit_code"] == 0
    assert all({"seq", "stream", "text"} <= set(line) and "id" not in line for line in lines), lines
    said = {(line["stream"], line["text"].strip()) for line in lines}
    assert {("stdout", "out"), ("stderr", "err")} <= said, said
    assert "out" not in result.stderr.split()  # with --json no log line goes to stderr raw either


def test_local_json_prints_one_object_per_line_then_the_final_job(tmp_path):
    result = run_cli("submit", "--json", "--", "sh", "-c", "echo hi", env={"GPULAYER_HOME": str(tmp_path / "h")},
                     cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    *lines, job = _objects(result.stdout)
    assert job["state"] == "succeeded" and job["exit_code"] == 0
    assert ("stdout", "hi") in {(line["stream"], line["text"].strip()) for line in lines}
