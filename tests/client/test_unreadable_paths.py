"""Issue 22 item 16: what `--source` and `--input` cannot read is refused, naming it; nothing is left out silently.

`submit --source DIR` packed what os.walk could list and dropped a folder it could not read without a word
(pathlib's rglob did the same to an `--input` folder); a file it could not open ended in `Error: [Errno 13]
Permission denied` (exit 1), possibly after other uploads. Now: one `Error:` line naming the path, exit 2,
no job made and nothing uploaded. The CLI runs as an unprivileged user would (tests/unprivileged.py: as root,
without the capabilities that read every file) against a real control plane.
"""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from gpulayer.testing import CLI, ControlPlaneProcess, clean_env
from unprivileged import unprivileged_prefix

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    with ControlPlaneProcess(tmp_path_factory.mktemp("unreadable")) as plane:
        plane.start_worker("w1", parallel=2)
        yield plane


@pytest.fixture
def tree(tmp_path):
    """src/ (ok.py, pkg/mod.py, and `secret/` or `key.pem` made unreadable by the test), data/ likewise."""
    for top in ("src", "data"):
        (tmp_path / top / "pkg").mkdir(parents=True)
        (tmp_path / top / "ok.py").write_text("print('ok')\n")
        (tmp_path / top / "pkg" / "mod.py").write_text("X = 1\n")
        (tmp_path / top / "secret").mkdir()
        (tmp_path / top / "secret" / "weights.bin").write_bytes(b"w" * 100)
        (tmp_path / top / "key.pem").write_text("KEY\n")
    locked: list = []
    yield tmp_path, locked
    for path in locked:
        path.chmod(0o755 if path.is_dir() else 0o644)


def lock(tree, *parts: str) -> str:
    """Make parts... unreadable to the child (mode 000; the fixture gives it back its mode); the path as the
    error names it, relative as it was given."""
    root, locked = tree
    path = root.joinpath(*parts)
    path.chmod(0)
    locked.append(path)
    return "/".join(parts)


def submit(plane, cwd, *args: str) -> subprocess.CompletedProcess:
    """`gpulayer submit --wait ARGS -- sh -c 'ls -R'` as an unprivileged user of `plane`, in `cwd`."""
    return subprocess.run([*unprivileged_prefix(), *CLI, "submit", "--wait", *args, "--", "sh", "-c", "ls -R"],
                          env=clean_env(**plane.cli_env(HOME=str(cwd))), cwd=cwd, capture_output=True, text=True,
                          timeout=90)


def counts(plane) -> tuple:
    return plane.sql("SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM artifacts)")[0]


def assert_refused(plane, before, done, path, option):
    assert done.returncode == 2, done
    assert done.stderr.startswith(f"Error: {option}: cannot read {path}: Permission denied") \
        and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout == "", done.stdout   # no job id: nothing was submitted
    assert counts(plane) == before          # no job, and no artifact uploaded (the readable ones neither)


def test_a_readable_tree_is_packed_whole(plane, tree):
    """The control: run the same way, what can be read is all sent."""
    done = submit(plane, tree[0], "--source", "src", "--input", "data")
    assert done.returncode == 0, done
    job = int(done.stdout.split()[0])
    text = "\n".join(line["text"] for line in plane.get_json(f"/v1/jobs/{job}/logs?limit=1000")["lines"])
    for name in ("ok.py", "mod.py", "weights.bin", "key.pem"):
        assert text.count(name) == 2, text  # once from the source, once under data/


@pytest.mark.parametrize("parts", [("src", "secret"), ("src", "key.pem"), ("src", "secret", "weights.bin")])
def test_an_unreadable_folder_or_file_in_the_source_is_refused_by_name(plane, tree, parts):
    before = counts(plane)
    path = lock(tree, *parts)
    assert_refused(plane, before, submit(plane, tree[0], "--source", "src", "--input", "data"), path, "--source")


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_an_unreadable_folder_of_a_git_checkout_is_refused_by_name(plane, tree):
    src = tree[0] / "src"
    git = ["git", "-C", str(src), "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "init"]):
        subprocess.run([*git, *args], check=True, capture_output=True, env={**os.environ, "HOME": str(tree[0])})
    before = counts(plane)
    path = lock(tree, "src", "secret")
    assert_refused(plane, before, submit(plane, tree[0], "--source", "src"), f"{path}/weights.bin", "--source")


@pytest.mark.parametrize("parts", [("data", "secret"), ("data", "key.pem"), ("data", "secret", "weights.bin")])
def test_an_unreadable_input_is_refused_by_name_and_the_source_is_not_sent(plane, tree, parts):
    before = counts(plane)
    path = lock(tree, *parts)
    assert_refused(plane, before, submit(plane, tree[0], "--source", "src", "--input", "data"), path, "--input")


def test_an_unreadable_input_file_given_alone_is_refused_by_name(plane, tree):
    before = counts(plane)
    path = lock(tree, "data", "key.pem")
    assert_refused(plane, before, submit(plane, tree[0], "--input", "data/key.pem"), path, "--input")
