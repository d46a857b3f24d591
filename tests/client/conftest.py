"""Client tests run with no GPULAYER_* settings from the caller's environment."""
import pytest


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    """No inherited GPULAYER_* variables; GPULAYER_HOME is an empty temp folder."""
    import os
    for name in list(os.environ):
        if name.startswith("GPULAYER_"):
            monkeypatch.delenv(name)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("GPULAYER_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """One real server process and one real worker process (`--parallel 2`), shared by the session."""
    pytest.importorskip("gpulayer.server.process", reason="the control plane (gpulayer.server.process) is not there yet")
    from gpulayer.testing import ControlPlaneProcess
    plane = ControlPlaneProcess(tmp_path_factory.mktemp("cluster"), heartbeat_interval=0.5, lease_ttl=5)
    try:
        plane.start()
        plane.start_worker("w1", parallel=2)
        yield plane
    finally:
        codes = plane.close()
        assert set(codes.values()) <= {0}, f"unclean stops {codes}:\n{plane.logs()}"


@pytest.fixture(scope="session")
def gpulayer_path(tmp_path_factory):
    """A PATH whose `gpulayer` is this checkout's CLI under this interpreter (for shell lines run as written)."""
    import os
    import stat
    import sys
    bin_dir = tmp_path_factory.mktemp("bin")
    shim = bin_dir / "gpulayer"
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m gpulayer.cli \"$@\"\n")
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
