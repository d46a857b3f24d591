"""Shared fixtures: a real state file in a temporary home, a pinned clock."""
from __future__ import annotations

import pytest

from gpulayer.server.security.auth import init_home
from gpulayer.server.config import ControlPlaneConfig
from gpulayer.server.store.db import Store
from gpulayer.server.scheduler.core import Scheduler

# The slow tier: marks `slow` every test that starts a process, and fails any other test that starts one.
pytest_plugins = ["tiers"]


class Clock:
    """A clock tests move by hand."""

    def __init__(self, now: float = 1_700_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


@pytest.fixture
def home(tmp_path):
    path = tmp_path / "home"
    tokens = init_home(path)
    path.joinpath("tokens.json").write_text(__import__("json").dumps(tokens))
    return path


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def config(home):
    return ControlPlaneConfig(home=home, heartbeat_interval_s=0.5, lease_ttl_s=3.0)


@pytest.fixture
def store(config):
    s = Store(config.layout.state)
    yield s
    s.close()


@pytest.fixture
def sched(store, config, clock):
    return Scheduler(store, config, clock)
