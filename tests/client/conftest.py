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
    pytest.importorskip("gpulayer.server", reason="the control plane (gpulayer.server) is not there yet")
    from client_cluster import Cluster
    c = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield c.start()
    finally:
        codes = c.stop()
        assert codes == [0] * len(codes), f"unclean stops {codes}:\n{c.logs()}"
