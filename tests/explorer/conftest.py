"""Fixtures: a fresh copy of a known state file per test, and the explorer over it."""
from __future__ import annotations

from pathlib import Path

import falcon.testing
import pytest
from explorer_state import CLIENT_TOKEN, NOW, build_state

from explorer import create_app


@pytest.fixture(scope="session")
def state_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "state.db"
    build_state(path)
    return path


@pytest.fixture
def state(tmp_path: Path, state_template: Path) -> Path:
    """A fresh copy of the state file for one test."""
    path = tmp_path / "state.db"
    path.write_bytes(state_template.read_bytes())
    return path


@pytest.fixture
def client(state: Path) -> falcon.testing.TestClient:
    """The open explorer (no auth), its clock pinned at NOW."""
    return falcon.testing.TestClient(create_app(str(state), clock=lambda: NOW))


@pytest.fixture
def auth_client(state: Path) -> falcon.testing.TestClient:
    """The explorer behind a client token, mounted at /explorer as the control plane does."""
    app = create_app(str(state), auth=lambda token: token == CLIENT_TOKEN, secure_cookies=True,
                     base_path="/explorer", clock=lambda: NOW)
    return falcon.testing.TestClient(app)
