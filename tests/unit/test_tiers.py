"""tests/tiers.py on a small suite of its own, run by a real pytest process: what it marks slow, and the guard.

These tests start pytest, so tiers.py marks them slow itself.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

SUPPORT = '''
import subprocess


def start_server():
    return subprocess.Popen(["sleep", "30"])


class Plane:
    """A helper class: followed whole, as the test code's helpers are."""

    def start(self):
        self.proc = start_server()
'''

SUITE = '''
import os
import subprocess
import threading

import pytest
from hypothesis import given, strategies
from support import Plane

from gpulayer.testing import run_cli


@pytest.fixture
def plane():
    yield Plane()


@pytest.fixture
def by_name(request):
    return request.getfixturevalue("plane")


def test_pure():
    assert sum([1, 2]) == 3


def test_runs_true():
    subprocess.run(["true"], check=True)


def test_plane_fixture(plane):
    assert plane


def test_fixture_by_name(by_name):
    assert by_name


def test_harness():
    run_cli("--help")


@given(strategies.integers())
def test_property(n):
    assert n == n


@pytest.mark.slow
def test_by_hand():
    getattr(subprocess, "run")(["true"], check=True)


def test_hidden():
    getattr(subprocess, "run")(["true"], check=True)


def test_hidden_in_a_thread():
    thread = threading.Thread(target=lambda: getattr(os, "system")("true"))
    thread.start()
    thread.join()


def test_hidden_and_swallowed():
    try:
        getattr(subprocess, "run")(["true"], check=True)
    except BaseException:
        pass
'''


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider --strict-markers\n"
                                         "markers =\n    slow: starts a process\n")
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tiers"]\n')
    (tmp_path / "support.py").write_text(textwrap.dedent(SUPPORT))
    (tmp_path / "test_suite.py").write_text(textwrap.dedent(SUITE))
    return tmp_path


def pytest_run(suite: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPULAYER_", "PYTEST_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(TESTS.parent)])
    return subprocess.run([sys.executable, "-m", "pytest", *args], cwd=suite, env=env, capture_output=True, text=True,
                          timeout=120)


def selected(done: subprocess.CompletedProcess) -> list[str]:
    return sorted(line.split("::")[1] for line in done.stdout.splitlines() if line.startswith("test_suite.py::"))


def test_what_starts_a_process_is_marked_slow_and_says_how(suite):
    fast = pytest_run(suite, "--collect-only", "-q", "-m", "not slow")
    assert fast.returncode == 0, fast.stdout + fast.stderr
    assert selected(fast) == ["test_hidden", "test_hidden_and_swallowed", "test_hidden_in_a_thread", "test_pure"]

    why = pytest_run(suite, "--collect-only", "-q", "-m", "slow", "--why-slow")
    lines = dict(line.split(": ", 1) for line in why.stdout.splitlines() if line.startswith("test_suite.py::") and ": " in line)
    assert lines == {
        "test_suite.py::test_runs_true": "test_runs_true -> subprocess.run",
        "test_suite.py::test_plane_fixture": "fixture plane -> Plane.start -> start_server -> subprocess.Popen",
        "test_suite.py::test_fixture_by_name": "fixture plane -> Plane.start -> start_server -> subprocess.Popen",
        "test_suite.py::test_harness": "test_harness -> run_cli -> subprocess.run",
        "test_suite.py::test_property": "test_property -> hypothesis.given",
        "test_suite.py::test_by_hand": "marked by hand",
    }


def test_a_test_that_starts_a_process_unmarked_fails_saying_so(suite):
    done = pytest_run(suite, "-q", "-m", "not slow")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "3 failed, 1 passed, 6 deselected" in done.stdout
    for name, command in [("test_hidden", "true"), ("test_hidden_in_a_thread", "true"),
                          ("test_hidden_and_swallowed", "true")]:
        assert (f"test_suite.py::{name} starts a process ({command}) but is not marked slow, so it would run in the "
                "fast loop") in done.stdout, done.stdout


def test_a_slow_test_may_start_processes(suite):
    done = pytest_run(suite, "-q", "-k", "runs_true or by_hand or plane_fixture")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout
