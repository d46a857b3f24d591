"""Shared fixtures: a real state file in a temporary home, a pinned clock.

Three things keep the fast loop fast (docs/architecture.md, "Tests"); none changes what a test exercises:
- A test's state file starts as a copy of one made once per session (schema.sql run once, not per test).
- A Store opens READERS_IN_TESTS readers, not the server's 16: each connection parses the whole schema when
  it opens (about 2 ms), and a test's requests use one or two of them.
- typer builds the click tree of the gpulayer app once per process, not at every CliRunner.invoke and
  main() call (about 50 ms each): the memo below.
"""
from __future__ import annotations

import shutil
import weakref

import pytest

from gpulayer.server.security.auth import init_home
from gpulayer.server.config import ControlPlaneConfig
from gpulayer.server.store.db import Store
from gpulayer.server.scheduler.core import Scheduler

# The slow tier: marks `slow` every test that starts a process, and fails any other test that starts one.
# The order: the xdist processes take the longest files first, so that they end together.
pytest_plugins = ["tiers", "order"]

READERS_IN_TESTS = 4


def pytest_configure(config: pytest.Config) -> None:
    import gpulayer.server.store.db as db
    db.READERS = READERS_IN_TESTS
    _memoize_typer_commands()


def _memoize_typer_commands() -> None:
    """typer.main.get_command, once per Typer app: it walks every command's signature (inspect, type hints)
    to build the same click group each time; a click command keeps no state between invocations."""
    import typer.main
    import typer.testing

    build = typer.main.get_command
    if getattr(build, "memoized", False):
        return
    built: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def get_command(typer_instance):
        command = built.get(typer_instance)
        if command is None:
            command = built[typer_instance] = build(typer_instance)
        return command
    get_command.memoized = True
    typer.main.get_command = typer.testing._get_command = get_command


class Clock:
    """A clock tests move by hand."""

    def __init__(self, now: float = 1_700_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


@pytest.fixture(scope="session")
def home_template(tmp_path_factory):
    """A home as `server init` leaves it (its secret, credentials and tokens.json), made once per session: each
    test's `home` is a copy (init_home fsyncs each file it writes, ~3 ms a test on a busy disk)."""
    path = tmp_path_factory.mktemp("home-template") / "home"
    tokens = init_home(path)
    path.joinpath("tokens.json").write_text(__import__("json").dumps(tokens))
    return path


@pytest.fixture
def home(tmp_path, home_template):
    path = tmp_path / "home"
    shutil.copytree(home_template, path)  # the files' modes (0600) and the folder's (0700) with them
    return path


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture(scope="module")
def module_clock():
    """A Clock for a module's shared fixtures (tests/api/test_auth_matrix.py)."""
    return Clock()


@pytest.fixture(scope="session")
def state_template(tmp_path_factory):
    """An empty state file at the current schema, made once per session (tests copy it: `config`)."""
    path = tmp_path_factory.mktemp("state-template") / "state.db"
    Store(path, readers=0).close()
    return path


@pytest.fixture
def config(home, state_template):
    settings = ControlPlaneConfig(home=home, heartbeat_interval_s=0.5, lease_ttl_s=3.0)
    state = settings.layout.state
    if not state.exists():  # as a new Store would make it, the schema run once for the session
        shutil.copyfile(state_template, state)
        state.chmod(0o600)
    return settings


@pytest.fixture
def store(config):
    s = Store(config.layout.state)
    yield s
    s.close()


@pytest.fixture
def sched(store, config, clock):
    return Scheduler(store, config, clock)
