"""`gpulayer policy replay` (issue 38 point 5) as an operator runs it: a real control plane and a fake-GPU worker
run a few jobs, then the CLI replays them from the live state file (read-only, while the server runs) with
changed settings; bad input is an `Error:` line and exit 2, and nothing of the state changes."""
from __future__ import annotations

import json
import time

import pytest

from gpulayer.testing import ControlPlaneProcess

pytestmark = pytest.mark.timeout(300)
COUNTED = ("jobs", "tasks", "usage", "projects", "workers", "scheduler_settings", "reservations")


def _counts(plane) -> dict[str, int]:
    return {t: plane.sql(f"SELECT count(*) FROM {t}")[0][0] for t in COUNTED}


def test_replay_from_the_live_state_file_changes_nothing(tmp_path):
    with ControlPlaneProcess(tmp_path, heartbeat_interval=0.5, lease_ttl=5) as plane:
        plane.start_worker("gpu-01", gpus=4, parallel=4)
        first = plane.submit({"command": ["sleep", "2"], "gpus": 4, "timeout_seconds": 30, "name": "first"})
        plane.wait_task_running(first)
        second = plane.submit({"command": ["sleep", "1"], "gpus": 4, "timeout_seconds": 30, "name": "second"})
        for j in (first, second):
            assert plane.wait_job(j, timeout=60)["state"] == "succeeded"
        before = _counts(plane)
        state = str(plane.state)

        text = plane.cli("policy", "replay", "--state", state, "--since", "1h", "--set", "quota.default=2")
        assert text.returncode == 0, text.stderr
        assert text.stdout.startswith("window: 2 jobs, 1 workers, 4 GPUs; changed: quota.default=2"), text.stdout
        assert "mean wait" in text.stdout and "GPU-hours default" in text.stdout

        answer = plane.cli("policy", "replay", "--state", state, "--since", "1h", "--set", "quota.default=2",
                           "--json")
        assert answer.returncode == 0, answer.stderr
        report = json.loads(answer.stdout)
        runs = report["runs"]
        # a 2-GPU quota: neither 4-GPU job could have started; as they are, both did, one after the other
        assert runs["changed"]["not_started"] == 2 and runs["changed"]["gpu_hours"] == {}
        assert runs["baseline"]["not_started"] == 0 and runs["actual"]["not_started"] == 0
        assert 1 <= runs["baseline"]["worst_wait_s"] <= 4   # the second waits for the first's run
        assert {j["name"] for j in report["changed_most"]} == {"first", "second"}

        for args, words in ((["--set", "bogus=1"], "unknown setting 'bogus'"),
                            (["--set", "quota.default=-1"], "must be at least 0"),
                            (["--since", "yesterday-ish"], "--since"),
                            (["--since", "1s"], "no recorded jobs in the window")):
            if args == ["--since", "1s"]:
                time.sleep(1.5)
            bad = plane.cli("policy", "replay", "--state", state, *args)
            assert bad.returncode == 2 and "Error:" in bad.stderr and words in bad.stderr, (args, bad.stderr)
        assert _counts(plane) == before
