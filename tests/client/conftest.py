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
