"""The order the test files go out in to the pytest processes, so that they end together.

`scripts/test` runs four processes, each taking a whole file at a time (`--dist loadfile`: a file's module
fixtures, its cluster, start once). xdist would hand the files out largest first by their number of tests
(a 408-case fuzz file first, a one-test file that waits a minute on leases last), so a long file with few
tests was often the last one started: one process ran it alone while the other had ended. With
`--no-loadscope-reorder` the files go out in the order collected, and this plugin (loaded by
`tests/conftest.py`) sorts them longest first, the longest-processing-time-first rule: what is left when a
process frees up is short, and the processes end within a short file of each other.

How long a file takes is SECONDS for the files that take longest (measured: see the table), else an estimate
from its tests (SLOW_TEST_S a `slow` test, by folder; FAST_TEST_S any other). Only the xdist processes sort (a plain
pytest run keeps the files in the order collected); a file's own tests keep their order, so module fixtures
still start once.
"""
from __future__ import annotations

import pytest

#: Seconds a whole file took (pytest's "passed in", the file alone on one process, the 2-core machine beside
#: other work, 2026-12-07), for the files whose tests take longest and for a few that the estimate below
#: overrates (many quick requests). A file missing here is estimated from its tests.
SECONDS: dict[str, float] = {
    "tests/security/test_security_fuzz_api.py": 75,    # 136 before its schema was read once a file
    "tests/reliability/test_replication.py": 105,
    "tests/security/test_security_slow_clients.py": 97,
    "tests/client/test_cli_wording.py": 45,           # 71 before the duration options ran in-process
    "tests/integration/test_job_control.py": 58,
    "tests/integration/test_front_ends.py": 15,       # 7.7 to 19.4 s at load 8-12 (--front-ends 2, six tests)
    "tests/integration/test_checkpoint_resume.py": 49,
    "tests/security/test_relay_bounds.py": 47,
    "tests/faults/test_faults_heartbeat_cadence.py": 27,
    "tests/faults/test_faults_heartbeats.py": 37,
    "tests/integration/test_relay_kills.py": 31,
    "tests/integration/test_array_chunks.py": 29,
    "tests/integration/test_service_autoscale.py": 31,
    "tests/faults/test_faults_chaos.py": 29,
    "tests/faults/test_faults_crash.py": 24,
    "tests/security/test_security_framing.py": 19,
    "tests/security/test_teams_matrix.py": 12,
    "tests/security/test_security_server.py": 5,
}
#: Seconds a `slow` test takes, by its top folder: real clusters and waits in these, ...
SLOW_TEST_S = {"integration": 8.0, "faults": 15.0, "reliability": 8.0, "fleet": 8.0, "slurm": 10.0, "packaging": 8.0}
#: ... a request or a CLI run or two elsewhere.
OTHER_SLOW_TEST_S = 2.0
FAST_TEST_S = 0.02


def _path(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def estimate(path: str, items: list[pytest.Item]) -> float:
    """How long file `path`'s selected tests take: its measured time when its slow tests run, else by test."""
    slow = sum(1 for item in items if item.get_closest_marker("slow") is not None)
    if slow and path in SECONDS:
        return SECONDS[path]
    folder = path.split("/")[1] if path.count("/") > 1 else ""
    return slow * SLOW_TEST_S.get(folder, OTHER_SLOW_TEST_S) + (len(items) - slow) * FAST_TEST_S


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if getattr(config, "workerinput", None) is None:
        return  # not an xdist process: the order collected
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(_path(item), []).append(item)
    longest_first = sorted(files.items(), key=lambda file: -estimate(*file))  # stable: ties keep their order
    items[:] = [item for _, file_items in longest_first for item in file_items]
