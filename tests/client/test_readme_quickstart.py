"""The README's quick-start commands ("from a second shell"), run as written and in sequence.

The block is read from README.md, so an edit of it is tested. It runs in `sh -e` (each command must
exit 0) in a folder holding the files it names (train.py, sweep.py, report.py), against a fresh
real control plane and worker, so that the job ids it names (1, 2, 4) are the ones it made.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from gpulayer.testing import ControlPlaneProcess, clean_env, wait_for

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
FILES = {
    "train.py": "import os\nos.makedirs('out', exist_ok=True)\nopen('out/model.txt', 'w').write('trained')\n",
    "sweep.py": "import sys\nprint('trial', sys.argv[-1])\n",
    "report.py": "print('report')\n",
}


def _quick_start() -> str:
    section = README[README.index("With `gpulayer up` running, from a second shell"):]
    return re.search(r"```sh\n(.*?)```", section, re.S).group(1)


@pytest.fixture
def plane(tmp_path):
    with ControlPlaneProcess(tmp_path / "plane") as plane:
        plane.start_worker("w1", parallel=4)
        yield plane


def test_readme_quick_start_runs_as_written(plane, tmp_path, gpulayer_path):
    here = tmp_path / "project"
    here.mkdir()
    for name, text in FILES.items():
        (here / name).write_text(text)
    block = _quick_start()
    assert "--after 4" in block and block.count("--source .") == 3
    env = clean_env(**plane.cli_env(), PATH=gpulayer_path)
    done = subprocess.run(["sh", "-ec", block], cwd=here, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{plane.logs()}"
    assert (here / "out" / "model.txt").read_text() == "trained"  # `job outputs 2 --dest .`
    assert plane.job(1)["state"] == "succeeded" and plane.job(2)["state"] == "succeeded"
    assert plane.job(4)["array"] is not None
    report = wait_for(lambda: (j := plane.job(5))["state"] in ("succeeded", "failed", "cancelled") and j, 240,
                      "the report after the array")
    assert report["state"] == "succeeded", report
