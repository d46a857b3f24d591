"""The principal cache cannot keep a removed or demoted caller's rights (issue 22 item 4, docs/security.md).

A lookup that read the state file before a change committed must not store what it read after the
change cleared the cache. Each race here is made deterministic: the lookup is held (threading.Event)
between its reads and its store while the change commits and invalidates, on a real SQLite file.
"""
from __future__ import annotations

import math
import threading

import pytest

from gpulayer.server.errors import Unauthorized
from gpulayer.server.scheduler import teams
from gpulayer.server.scheduler.core import Scheduler
from gpulayer.server.security import auth
from gpulayer.server.store.queries import QUERIES
from helpers import SERVER_JOIN

JOIN_S = 30


class HeldLookup(auth.Authenticator):
    """An Authenticator whose next lookup, once `hold()` is called, waits after its reads until released."""

    def __init__(self, *args):
        super().__init__(*args)
        self._held = False
        self.read_done, self.release = threading.Event(), threading.Event()

    def hold(self) -> None:
        self._held = True

    def _lookup(self, kind, digest, now):
        found = super()._lookup(kind, digest, now)
        if self._held:
            self._held = False
            self.read_done.set()
            assert self.release.wait(JOIN_S)
        return found


@pytest.fixture
def held(store, config, clock):
    authn = HeldLookup(config.layout, store, QUERIES)
    return Scheduler(store, config, clock, auth=authn), authn


def race(authn: HeldLookup, token: str, now: float, change) -> None:
    """Authenticate `token` in a thread held after its reads; run `change` (commit and invalidate) meanwhile."""
    authn.hold()
    worker = threading.Thread(target=lambda: authn.authenticate(token, now), daemon=True)
    worker.start()
    assert authn.read_done.wait(JOIN_S)
    change()
    authn.release.set()
    worker.join(JOIN_S)
    assert not worker.is_alive()


def add_user(sched, name: str, admin: bool = False) -> str:
    sched.change_teams(teams.add_user, name, admin, [], None)
    return sched.mint_token(name=name, labels={}, expires_in_s=None, kind="client", user=name)["token"]


def test_a_removed_users_token_is_refused_after_a_lookup_raced_the_removal(held, clock):
    sched, authn = held
    token = add_user(sched, "bob")
    race(authn, token, clock(), lambda: sched.change_teams(teams.remove_user, "bob"))
    with pytest.raises(Unauthorized):
        authn.authenticate(token, clock())


def test_a_demoted_admin_is_no_admin_after_a_lookup_raced_the_change(held, clock):
    sched, authn = held
    token = add_user(sched, "root2", admin=True)
    race(authn, token, clock(), lambda: sched.change_teams(teams.set_user, "root2", {"admin": False}))
    assert authn.authenticate(token, clock()).admin is False


def test_a_deregistered_workers_session_is_gone_after_a_lookup_raced_it(held, clock):
    sched, authn = held
    session = "glw_" + "s" * 43
    worker_id = sched.register(body={"name": "w", "labels": {}, "slots": 1, "version": "t",
                                     "resources": {"cpus": 1, "gpus": 0, "memory_mb": 100, "gpu_models": []}},
                               token=SERVER_JOIN, session_hash=authn.hash(session), peer_address="127.0.0.1")
    worker_id = worker_id["worker_id"]
    race(authn, session, clock(), lambda: sched.deregister(worker_id))
    assert authn.authenticate(session, clock()).worker_state == "gone"


def test_a_revoked_join_token_is_refused_after_a_lookup_raced_the_revocation(held, clock):
    sched, authn = held
    minted = sched.mint_token(name="j", labels={}, expires_in_s=None)
    race(authn, minted["token"], clock(), lambda: sched.revoke_token(minted["jti"]))
    with pytest.raises(Unauthorized):
        authn.authenticate(minted["token"], clock())


class CountedLookups(auth.Authenticator):
    """An Authenticator that counts the lookups it makes in the state file."""

    lookups = 0

    def _lookup(self, kind, digest, now):
        self.lookups += 1
        return super()._lookup(kind, digest, now)


@pytest.fixture
def counted(store, config, clock):
    ticks = type(clock)(100.0)   # the conftest's hand-moved clock, for the cache's monotonic ticks
    authn = CountedLookups(config.layout, store, QUERIES, ticks=ticks)
    return Scheduler(store, config, clock, auth=authn), authn, ticks


def test_a_principal_in_use_is_renewed_by_each_use_and_read_again_after_its_max_age(counted, clock):
    """A worker beating every 2 s makes no read for its token; CACHE_MAX_AGE_S still bounds a missed change."""
    sched, authn, ticks = counted
    token = add_user(sched, "erin", admin=True)
    assert authn.authenticate(token, clock()).admin is True
    sched.store.write(lambda conn: conn.execute("UPDATE users SET admin = 0 WHERE name = 'erin'"))  # no invalidate()
    step = auth.CACHE_TTL_S - 0.5
    for _ in range(math.ceil(auth.CACHE_MAX_AGE_S / step) - 1):   # the last of these uses comes before the max age
        ticks.advance(step)
        assert authn.authenticate(token, clock()).admin is True   # renewed: still the cached answer
    assert authn.lookups == 1
    ticks.advance(step)
    assert authn.authenticate(token, clock()).admin is False   # past CACHE_MAX_AGE_S: read again
    assert authn.lookups == 2


def test_a_principal_unused_for_its_ttl_is_read_again_and_swept(counted, clock):
    sched, authn, ticks = counted
    used, idle, late = add_user(sched, "frank"), add_user(sched, "gina"), add_user(sched, "hank")
    authn.authenticate(used, clock())
    authn.authenticate(idle, clock())
    lookups = authn.lookups
    ticks.advance(auth.CACHE_TTL_S - 0.5)
    authn.authenticate(used, clock())
    ticks.advance(1.0)   # idle's entry is CACHE_TTL_S + 0.5 unused, used's 1 s
    authn.authenticate(used, clock())
    assert authn.lookups == lookups
    authn.authenticate(idle, clock())
    assert authn.lookups == lookups + 1
    ticks.advance(auth.CACHE_TTL_S + 1)   # both unused past the TTL: the next store sweeps them
    authn.authenticate(late, clock())
    assert list(authn._cache) == [authn.hash(late)]


def test_a_renewed_principal_is_forgotten_at_once_by_a_revocation(counted, clock):
    sched, authn, ticks = counted
    minted = sched.mint_token(name="j2", labels={}, expires_in_s=None)
    for _ in range(3):
        authn.authenticate(minted["token"], clock())
        ticks.advance(1.0)
    sched.revoke_token(minted["jti"])
    with pytest.raises(Unauthorized):
        authn.authenticate(minted["token"], clock())


def test_a_cached_principal_is_read_again_after_its_ttl(store, config, clock):
    """A change no invalidate() reached (another process wrote the file) is seen once the principal was
    unused for CACHE_TTL_S."""
    ticks = type(clock)(100.0)   # the conftest's hand-moved clock, for the cache's monotonic ticks
    authn = auth.Authenticator(config.layout, store, QUERIES, ticks=ticks)
    token = add_user(Scheduler(store, config, clock, auth=authn), "carol", admin=True)
    assert authn.authenticate(token, clock()).admin is True
    store.write(lambda conn: conn.execute("UPDATE users SET admin = 0 WHERE name = 'carol'"))
    ticks.advance(auth.CACHE_TTL_S - 0.5)
    assert authn.authenticate(token, clock()).admin is True   # cached: nothing invalidated (and renewed)
    ticks.advance(auth.CACHE_TTL_S + 0.5)
    assert authn.authenticate(token, clock()).admin is False
