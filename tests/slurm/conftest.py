"""A real single-node Slurm for the provisioning tests (marker `slurm`).

The fixture installs Debian's slurmctld, slurmd and slurm-client when they are
missing and we run as root, starts both daemons on loopback without systemd
(localslurm.py), points SLURM_CONF at its slurm.conf, and stops them after the
session. When Slurm cannot be had, every test here is skipped with the reason.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from localslurm import LocalSlurm, ensure_installed  # noqa: E402


def pytest_collection_modifyitems(items):
    for item in items:
        if Path(str(item.fspath)).parent == Path(__file__).parent:
            item.add_marker(pytest.mark.slurm)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A running LocalSlurm; SLURM_CONF is set in this process's environment while it runs."""
    reason = ensure_installed()
    if reason:
        pytest.skip(f"no Slurm: {reason}")
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"), cpus=os.cpu_count() or 2)
    try:
        cluster.start()
    except (RuntimeError, OSError) as exc:
        cluster.stop()
        pytest.skip(f"Slurm did not start: {exc}")
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    yield cluster
    cluster.stop()
    if previous is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = previous
