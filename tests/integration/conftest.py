"""Integration tier: a real server process and real worker processes."""
from __future__ import annotations

import pytest

from integration_cluster import Cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A server and two workers (w1, w2; --parallel 2), shared by a test module."""
    c = Cluster(tmp_path_factory.mktemp("cluster")).start_server()
    try:
        c.start_worker("w1", parallel=2)
        c.start_worker("w2", parallel=2)
        yield c
    finally:
        codes = c.close()
        assert set(codes.values()) <= {0}, f"unclean stops {codes}:\n{c.logs()}"
