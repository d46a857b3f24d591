"""Fixtures: a real control plane process shared by the fleet tests, and one of their own."""
from __future__ import annotations

import pytest

from fleet_cluster import Fleet


@pytest.fixture(scope="session")
def fleet(tmp_path_factory):
    """The shared fleet: tests add their own workers and stop them."""
    f = Fleet(tmp_path_factory.mktemp("fleet")).start()
    yield f
    f.close()


@pytest.fixture
def own_fleet(tmp_path):
    """A fleet for a test that restarts the server or rotates its tokens."""
    f = Fleet(tmp_path).start()
    yield f
    f.close()
