"""What a ControlPlane has only once started (its Deps, its HTTP front end) says so before start()."""
from __future__ import annotations

import pytest
import requests

from gpulayer.server.config import ControlPlaneConfig
from gpulayer.server.process import ControlPlane


def test_deps_http_and_url_exist_from_start_to_stop(home):
    plane = ControlPlane(ControlPlaneConfig(home=home, host="127.0.0.1", port=0))
    for name in ("deps", "http", "url"):
        with pytest.raises(RuntimeError, match="not started"):
            getattr(plane, name)
    plane.start()
    try:
        assert plane.url == f"http://127.0.0.1:{plane.http.port}"
        assert plane.deps.store.read(lambda conn: conn.execute("PRAGMA user_version").fetchall())
        assert requests.get(f"{plane.url}/v1/health", timeout=10).status_code == 200
    finally:
        plane.stop()
