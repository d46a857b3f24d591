"""`--source .` in a git checkout, as the README's quick start runs it (issue 36 item 21), against a real
server and workers: an untracked, not-ignored `train.py` was left out without a word (`unpacked: 0
entries`, then `can't open file ... train.py`); now it is packed and runs. A file the command names that
git ignores is refused before anything is sent, saying why."""
from __future__ import annotations

import os
import subprocess

import pytest

pytestmark = pytest.mark.timeout(180)


def _checkout(root):
    root.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(["git", "-C", str(root), "init", "-q"], check=True, env=env)
    (root / ".gitignore").write_text("*.ckpt\n")
    subprocess.run(["git", "-C", str(root), "add", ".gitignore"], check=True, env=env)
    subprocess.run(["git", "-C", str(root), "commit", "-qm", "init"], check=True, env=env)
    (root / "train.py").write_text("print('trained from', len(open('train.py').read()) > 0)\n")
    (root / "weights.ckpt").write_text("ignored\n")
    return root


def test_an_untracked_file_of_a_checkout_is_sent_and_runs(cluster, tmp_path):
    repo = _checkout(tmp_path / "repo")
    done = cluster.cli("submit", "--source", str(repo), "--wait", "--", "python3", "train.py")
    assert done.returncode == 0, done
    job_id = int(done.stdout.split()[0])
    assert "trained from True" in cluster.log_text(job_id)


def test_a_file_the_command_names_that_git_ignores_is_refused_before_anything_is_sent(cluster, tmp_path):
    repo = _checkout(tmp_path / "repo")
    before = cluster.sql("SELECT count(*) FROM jobs")[0][0], cluster.sql("SELECT count(*) FROM artifacts")[0][0]
    done = cluster.cli("submit", "--source", str(repo), "--", "python3", "train.py", "weights.ckpt")
    assert done.returncode == 2, done
    assert "weights.ckpt" in done.stderr and "ignored by git" in done.stderr and "nothing was sent" in done.stderr
    after = cluster.sql("SELECT count(*) FROM jobs")[0][0], cluster.sql("SELECT count(*) FROM artifacts")[0][0]
    assert after == before
