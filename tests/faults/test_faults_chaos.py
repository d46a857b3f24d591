"""Load with chaos, the CI size: scripts/chaos.py with 50 simulated workers for 15 s.

The full run (200 workers, 10 submitters, 60 s) and its figures are in
docs/reliability.md; this one checks the same invariants on every change.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from faultlib import REPO

from gpulayer.testing import clean_env

pytestmark = pytest.mark.timeout(150)


def test_chaos_keeps_every_invariant(tmp_path):
    report_file = tmp_path / "chaos.json"
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "chaos.py"), "--workers", "50", "--processes", "2",
                          "--submitters", "5", "--seconds", "15", "--kill-rate", "0.03", "--home", str(tmp_path),
                          "--json", str(report_file)],
                         env=clean_env(), capture_output=True, text=True, timeout=140)
    print(run.stdout)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(report_file.read_text())
    assert report["violations"] == [] and report["server_errors"] == 0
    assert report["acknowledged_jobs"] > 100 and report["tasks_finished"] > 100
    assert report["workers_killed"] > 0 and report["cancels"] > 0, "the chaos did not happen"
