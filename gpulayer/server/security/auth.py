"""Tokens: minting, keyed BLAKE2b hashes, lookup and scopes.

Only hashes are stored: `server init`'s two tokens in server-credentials.json,
minted join tokens in the `tokens` table, worker session tokens on their
`workers` row. The hash is keyed with the server secret (a 0600 file), so a
copy of the state file alone cannot be used to test guesses. Comparison of
hashes is constant-time; no token is ever written to a log.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpulayer.server.config import HomeLayout
from gpulayer.server.errors import AlreadyInitialised, ConfigError, Unauthorized

PREFIXES = {"join": "glj_", "worker": "glw_", "client": "glc_", "metrics": "glm_"}
KIND_OF_PREFIX = {v: k for k, v in PREFIXES.items()}
SERVER_JOIN_JTI = "server-join"
SERVER_CLIENT_JTI = "server-client"
# A cached principal unused for this long is dropped; each use renews it (a worker's heartbeats keep its own).
CACHE_TTL_S = 5.0
# However often it is used, a cached principal is read again after this long: the bound on what a
# change that reached no invalidate() could cost (every known one calls it).
CACHE_MAX_AGE_S = 60.0
# At most this many principals are cached (one per token in use; past it the cache starts again).
CACHE_MAX_ENTRIES = 100_000


def new_token(kind: str) -> str:
    """A fresh token: its kind's prefix and 43 URL-safe characters (256 bits)."""
    return PREFIXES[kind] + secrets.token_urlsafe(32)


def new_jti() -> str:
    return secrets.token_hex(8)


def write_private(path: Path, data: str | bytes) -> None:
    """Write a file readable by its owner only (0600), atomically (text as UTF-8, bytes as they are).

    The temporary file's name is this writer's own: two processes writing the same
    file (a replica's lease, renewed by one control plane, taken by a restore) never
    write into one temporary file.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load_secret(layout: HomeLayout) -> bytes:
    """The server secret (raises ConfigError when `server init` has not run)."""
    try:
        return bytes.fromhex(layout.secret.read_text().strip())
    except FileNotFoundError:
        raise ConfigError(f"{layout.home} is not initialised: run `gpulayer server init --home {layout.home}`") from None


def hash_token(secret: bytes, token: str) -> str:
    """BLAKE2b-256 of the token keyed with the server secret, as hex."""
    return hashlib.blake2b(token.encode("utf-8"), key=secret, digest_size=32).hexdigest()


def init_home(home: Path, *, force: bool = False) -> dict:
    """Create the server secret and the two first tokens; returns them in clear, once.

    Raises AlreadyInitialised unless `force` (which rotates both tokens and keeps the secret).
    """
    layout = HomeLayout(Path(home).expanduser())
    layout.home.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(layout.home, 0o700)  # an existing home too: it holds the secret and the state file
    from gpulayer.server.store.db import make_private
    make_private(layout.state)
    if layout.credentials.exists() and not force:
        raise AlreadyInitialised(f"{layout.home} is already initialised (use --force to rotate its tokens)")
    if not layout.secret.exists():
        write_private(layout.secret, secrets.token_hex(32) + "\n")
    secret = load_secret(layout)
    tokens = {"join_token": new_token("join"), "client_token": new_token("client")}
    creds = {"join": {"jti": SERVER_JOIN_JTI, "hash": hash_token(secret, tokens["join_token"]), "created_at": time.time()},
             "client": {"jti": SERVER_CLIENT_JTI, "hash": hash_token(secret, tokens["client_token"]), "created_at": time.time()}}
    write_private(layout.credentials, json.dumps(creds, indent=2) + "\n")
    return tokens


def rotate_join_token(home: Path) -> str:
    """Replace server init's join token; the old one stops working at once (the server re-reads the file)."""
    layout = HomeLayout(Path(home).expanduser())
    secret = load_secret(layout)
    creds = json.loads(layout.credentials.read_text())
    token = new_token("join")
    creds["join"] = {"jti": SERVER_JOIN_JTI, "hash": hash_token(secret, token), "created_at": time.time()}
    write_private(layout.credentials, json.dumps(creds, indent=2) + "\n")
    return token


@dataclass(frozen=True)
class Principal:
    """Who is calling: a token's kind and what it is bound to."""

    kind: str                     # join | worker | client | metrics
    jti: str | None = None
    name: str | None = None
    labels: dict = field(default_factory=dict)
    worker_id: int | None = None
    worker_state: str | None = None
    advertise_address: str | None = None
    expires_at: float | None = None   # a minted token's expiry (a cached principal must not outlive it)
    user_id: int | None = None        # a client token's user (server init's: 1, `admin`)
    user: str | None = None
    admin: bool = False

    @property
    def actor(self) -> str:
        """How events name this caller: user:NAME, worker:ID, or join:NAME (a worker registering)."""
        if self.kind == "worker":
            return f"worker:{self.worker_id}"
        if self.user is not None:
            return f"user:{self.user}"
        return f"{self.kind}:{self.name}"


class Authenticator:
    """Maps bearer tokens to principals; caches good answers until something is revoked.

    Every change that can make a cached answer wrong (a token revoked, a worker
    deregistered or revoked, a user removed or changed, credentials rotated)
    calls `invalidate()` after its commit, in this process, which is the only one
    that serves tokens. A lookup that read the state file before that commit
    must not store its answer after the clear: `invalidate()` bumps a generation,
    and a lookup stores only when the generation it saw before its reads is still
    the current one. A cached answer is renewed by each use and dropped after
    CACHE_TTL_S unused (so a worker beating every 2 s never reads for its token);
    CACHE_MAX_AGE_S bounds what a missed invalidation could cost, and the cache
    holds at most CACHE_MAX_ENTRIES (unused ones are swept every CACHE_TTL_S).
    """

    def __init__(self, layout: HomeLayout, store, queries: dict, *, ticks: Callable[[], float] = time.monotonic):
        self.layout = layout
        self.ticks = ticks   # the TTL's clock: wall time in this process, not the scheduler's (pinnable) one
        self.secret = load_secret(layout)
        self.store = store
        self.q = queries
        self._creds: dict = {}
        self._creds_mtime = 0.0
        self._creds_checked = 0.0
        # digest: [principal, unused-until, read-again-at] (monotonic seconds; the first renewed on each use)
        self._cache: dict[str, list] = {}
        self._next_sweep = 0.0
        self._generation = 0   # bumped by every invalidate(), under _lock
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []
        self._reload_credentials(force=True)

    def hash(self, token: str) -> str:
        return hash_token(self.secret, token)

    def on_invalidate(self, listener: Callable[[], None]) -> None:
        """Call `listener` after every invalidate(): parked requests re-check their caller (follow.py, acquire)."""
        self._listeners.append(listener)

    def invalidate(self) -> None:
        """Forget cached principals (after a revocation, a worker leaving, a user removed or changed) and keep
        lookups that read before now from storing theirs; then wake what waits on a caller's rights."""
        with self._lock:
            self._generation += 1
            self._cache.clear()
        for listener in list(self._listeners):
            listener()

    def authenticate(self, token: str | None, now: float) -> Principal:
        """The caller behind `token`; raises Unauthorized for none, unknown, revoked or expired."""
        if not token:
            raise Unauthorized("missing bearer token: send Authorization: Bearer <token>")
        kind = KIND_OF_PREFIX.get(token[:4])
        if kind is None or len(token) > 256:
            raise Unauthorized("unknown token")
        digest = self.hash(token)
        self._reload_credentials()
        mono = self.ticks()
        with self._lock:
            cached, generation = self._cache.get(digest), self._generation
            if cached is not None and cached[1] > mono and cached[2] > mono \
                    and (cached[0].expires_at is None or cached[0].expires_at > now):
                cached[1] = mono + CACHE_TTL_S   # renewed on use
                return cached[0]
        principal = self._lookup(kind, digest, now)
        if principal is None:
            raise Unauthorized("unknown, revoked or expired token")
        with self._lock:
            if self._generation == generation:   # else a change committed during the reads: they may be stale
                self._store(digest, principal, mono)
        return principal

    def _store(self, digest: str, principal: Principal, mono: float) -> None:
        """Cache `principal` (under _lock), first dropping the entries unused for CACHE_TTL_S (at most once per
        CACHE_TTL_S) and starting again past CACHE_MAX_ENTRIES."""
        if mono >= self._next_sweep:
            self._next_sweep = mono + CACHE_TTL_S
            for key in [k for k, entry in self._cache.items() if entry[1] <= mono]:
                del self._cache[key]
        if len(self._cache) >= CACHE_MAX_ENTRIES:
            self._cache.clear()
        self._cache[digest] = [principal, mono + CACHE_TTL_S, mono + CACHE_MAX_AGE_S]

    def _lookup(self, kind: str, digest: str, now: float) -> Principal | None:
        server = self._creds.get(kind)
        if server and hmac.compare_digest(server["hash"], digest):
            if kind == "client":  # server init's client token belongs to the first admin, `admin`
                return self._user(Principal(kind=kind, jti=server["jti"], name="server"), 1)
            return Principal(kind=kind, jti=server["jti"], name="server")
        if kind == "worker":
            return self._worker(digest)
        rows = self.store.read(lambda c: c.execute(self.q["token_by_hash"], {"token_hash": digest}).fetchall())
        if not rows or not hmac.compare_digest(rows[0]["token_hash"], digest) or rows[0]["kind"] != kind:
            return None
        row = rows[0]
        if row["revoked_at"] is not None or (row["expires_at"] is not None and row["expires_at"] <= now):
            return None
        principal = Principal(kind=kind, jti=row["jti"], name=row["name"], labels=json.loads(row["labels"]),
                              expires_at=row["expires_at"])
        return self._user(principal, row["user_id"] or 1) if kind == "client" else principal

    def _user(self, principal: Principal, user_id: int) -> Principal | None:
        """A client principal with its user; None (unauthorized) once the user was removed."""
        rows = self.store.read(lambda c: c.execute(self.q["user_by_id"], {"user_id": user_id}).fetchall())
        if not rows or rows[0]["removed_at"] is not None:
            return None
        return replace(principal, user_id=user_id, user=rows[0]["name"], admin=bool(rows[0]["admin"]))

    def _worker(self, digest: str) -> Principal | None:
        rows = self.store.read(lambda c: c.execute(self.q["worker_by_session"], {"session_hash": digest}).fetchall())
        if not rows or not hmac.compare_digest(rows[0]["session_hash"], digest):
            return None
        row = rows[0]
        return Principal(kind="worker", jti=row["token_jti"], name=row["name"], labels=json.loads(row["labels"]),
                         worker_id=row["id"], worker_state=row["state"], advertise_address=row["advertise_address"])

    def _reload_credentials(self, force: bool = False) -> None:
        """Re-read server-credentials.json when it changed (join token rotation), at most once a second."""
        mono = time.monotonic()
        if not force and mono - self._creds_checked < 1.0:
            return
        self._creds_checked = mono
        try:
            mtime = self.layout.credentials.stat().st_mtime
        except FileNotFoundError:
            raise ConfigError(f"{self.layout.credentials} is missing: run `gpulayer server init`") from None
        if force or mtime != self._creds_mtime:
            self._creds = json.loads(self.layout.credentials.read_text())
            self._creds_mtime = mtime
            self.invalidate()


def client_token_check(home: Path) -> Callable[[str], bool]:
    """A check for the explorer's login (`gpulayer explore --token-required`): accepts the client token of `gpulayer server init` in `home`.

    The credentials file is read at every check, so `server init --force` takes
    effect at once. Raises ConfigError when the home is not initialised.
    """
    layout = HomeLayout(Path(home))
    secret = load_secret(layout)
    if not layout.credentials.exists():
        raise ConfigError(f"{layout.home} is not initialised: run `gpulayer server init --home {layout.home}`")

    def is_client(token: str) -> bool:
        try:
            expected = json.loads(layout.credentials.read_text())["client"]["hash"]
        except (OSError, ValueError, KeyError, TypeError):
            return False
        return hmac.compare_digest(expected, hash_token(secret, token))

    return is_client
