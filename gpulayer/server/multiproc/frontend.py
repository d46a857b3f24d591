"""A front-end process: granian and the falcon app on the shared port, reads here, writes in the writer process.

It listens on its own socket bound with SO_REUSEPORT (the kernel spreads connections over the front ends), reads
the state file through its own pool of read-only WAL connections (`RemoteStore`: Store's reads, WriterClient's
writes), and keeps in memory what its own requests make: the renewal notes and GPU samples of the heartbeats it
answered from reads (sent to the writer once per tick, forgotten once the writer has them), its parked
acquires and log follows (woken by the writer's pushes), its principal cache (forgotten on the writer's push).

Not served here: the relay's WebSockets (exec, shell, port-forward) and the ingress (/s/). A worker's relay link
and a client's stream would land on different processes; their routes answer 501 as under `--http cheroot`.
"""
from __future__ import annotations

import logging
import math
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from gpulayer.server.config import ControlPlaneConfig
from gpulayer.server.errors import Unavailable
from gpulayer.server.http.app import Deps, create_app, with_explorer
from gpulayer.server.multiproc.client import WriterClient
from gpulayer.server.scheduler.core import Scheduler
from gpulayer.server.security.auth import Authenticator
from gpulayer.server.store.artifacts import ArtifactStore
from gpulayer.server.store.db import READERS, WRITE_TIMEOUT_S, Store, connect
from gpulayer.server.store.deadline import Deadline
from gpulayer.server.store.queries import QUERIES
from gpulayer.server.store.readers import ReaderPool

if TYPE_CHECKING:
    from gpulayer.server.frontends.granian_server import GranianServer

log = logging.getLogger("gpulayer.server.multiproc.frontend")
LISTEN_BACKLOG = 1024


def bound_socket(host: str, port: int, *, listen: bool) -> socket.socket:
    """A TCP socket on host:port with SO_REUSEPORT (port 0: a free one), listening when `listen`.

    The supervisor holds one that does not listen (the port stays the plane's, and no connection queues on
    it); each front end listens on its own. Raises OSError when the address cannot be bound.
    """
    family, kind, proto, _, address = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        if listen:
            sock.listen(LISTEN_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


class RemoteStore(Store):
    """The state file as a front end has it: Store's pooled readers here; every write the writer process's."""

    def __init__(self, path: Path | str, client: WriterClient, *, synchronous: str = "normal",
                 read_timeout_s: float = math.inf):
        # Not Store.__init__: no write connection, no schema work (the writer's), no writer thread.
        self.path = Path(path)
        self.synchronous = synchronous
        self.write_timeout_s, self.read_timeout_s = WRITE_TIMEOUT_S, read_timeout_s
        self.client = client
        self._lock = threading.Lock()
        self._closed = False
        self.last_error: str | None = None
        self._readers = [connect(self.path, synchronous=synchronous, query_only=True) for _ in range(READERS)]
        self._pool: ReaderPool = ReaderPool([(conn, Deadline(conn)) for conn in self._readers])

    def write(self, fn, *args, **kwargs):
        """fn run by the writer process (a registered write, codec.py); raises as Store.write does."""
        if self._closed:
            raise Unavailable("the state file is closed (the control plane is stopping)")
        return self.client.write(fn, args, kwargs)

    def health(self) -> dict:
        """Store.health's shape: the writer is the writer process, alive while this front end is connected."""
        alive = self.client.connected.is_set() and not self._closed
        return {"ok": alive, "writer": {"alive": alive, "queued": 0, "last_error": None if alive else "unavailable"},
                "disk": {"free_bytes": None, "full": False}}

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for conn in self._readers:
            conn.close()


class _RemoteCascades:
    """The front end's stand-in for the scheduler's Cascades: a write's steps run in the writer process;
    waiting for a job's (a submit's) asks the writer to run them first."""

    def __init__(self, client: WriterClient):
        self._client = client

    def drive(self, steps, until_ended: int | None = None, inline: int = 0) -> None:
        if until_ended is not None:
            self._client.call("drain", until_ended)

    def add(self, steps) -> None:
        raise NotImplementedError("cascades are the writer process's")

    def resume(self) -> None:
        pass


class _Restoring:
    """A restored home's reconciliation as a front end sees it (the writer's, refreshed each tick): while it is
    here, heartbeats take the write path and the writer applies the rules (rpc.py)."""

    def __init__(self, state: dict):
        self.state = state

    def active(self) -> bool:
        return True

    def paused(self) -> bool:
        return bool(self.state["paused"])

    def describe(self) -> dict:
        return self.state["describe"]


class FrontEnd:
    """One front-end process's parts: started by start(), stopped by stop()."""

    def __init__(self, config: ControlPlaneConfig, socket_path: Path, port: int, *, clock=time.time):
        self.config, self.port, self.clock = config, port, clock
        self._stop = threading.Event()
        self.client = WriterClient(socket_path, {}, self._pushed)
        layout = config.layout
        self.store = RemoteStore(layout.state, self.client, synchronous=config.synchronous,
                                 read_timeout_s=config.read_timeout_s)
        self.auth = Authenticator(layout, self.store, QUERIES)
        artifacts = ArtifactStore(layout.artifacts)
        self.scheduler = Scheduler(self.store, config, clock, auth=self.auth, artifacts=artifacts)
        self.scheduler.remote_write = self.client.write
        self.scheduler._adopting = lambda fn: fn  # type: ignore[method-assign]  # the writer adopts (rpc.py)
        self.scheduler.cascades = _RemoteCascades(self.client)  # type: ignore[assignment]  # its calls alone
        self.client.shared.update(scheduler=self.scheduler, secret_box=self.scheduler.secret_box)
        self._forget_here = self.auth.invalidate
        self.auth.invalidate = self._forget_everywhere  # type: ignore[method-assign]  # a revocation reaches all
        ca = layout.tls / "ca.pem"
        self.deps = Deps(config=config, store=self.store, scheduler=self.scheduler, auth=self.auth,
                         artifacts=artifacts, ca_file=ca if config.tls_cert and ca.exists() else None, clock=clock)
        self.http: GranianServer | None = None
        self._ticker = threading.Thread(target=self._tick, name="gpulayer-notes", daemon=True)

    def _forget_everywhere(self) -> None:
        self._forget_here()
        self.client.send("forget")

    def _pushed(self, kinds: frozenset) -> None:
        if "forget" in kinds:
            self._forget_here()
        if "wake" in kinds:
            self.scheduler.wake()
        if "written" in kinds:
            self.scheduler.log_followers.written()

    def start(self) -> None:
        from gpulayer.server.frontends.granian_server import GranianServer  # noqa: F811 - granian is optional
        self.client.start(timeout=2.0)  # reads are served without the writer; writes 503 until it is up
        app = with_explorer(create_app(self.deps), self.deps, secure_cookies=bool(self.config.tls_cert))
        listener = bound_socket(self.config.host, self.port, listen=True)
        certfile = str(self.config.tls_cert) if self.config.tls_cert else None
        keyfile = str(self.config.tls_key) if self.config.tls_key else None
        self.http = GranianServer(app, self.config.host, self.port, certfile=certfile, keyfile=keyfile,
                                  threads=self.config.threads, listener=listener)
        self.http.start()
        self._ticker.start()

    def stop(self) -> None:
        """Stop accepting, finish the requests in progress, send the last notes, close."""
        self._stop.set()
        self.scheduler.stop_waiting()
        if self.http is not None:
            self.http.stop()
        if self._ticker.is_alive():
            self._ticker.join(5)
        self.flush()
        self.client.stop()
        self.store.close()

    def _tick(self) -> None:
        interval = min(self.config.heartbeat_interval_s, 1.0)
        while not self._stop.wait(interval):
            self.flush()

    def flush(self) -> None:
        """This tick's renewal notes and GPU samples to the writer; kept for the next tick if it is gone."""
        scheduler = self.scheduler
        notes, samples = scheduler.renewals.pending(), scheduler.gpu_samples.take()
        try:
            answer = self.client.call("notes", notes, samples)
        except Exception as exc:  # noqa: BLE001 - the writer is gone: next tick
            scheduler.gpu_samples.put_back(samples)
            log.debug("notes_not_sent error=%r", exc)
            return
        scheduler.renewals.flushed(notes)
        scheduler.cadence.fleet(answer["workers"])
        scheduler.restored = _Restoring(answer["restoring"]) if answer["restoring"] else None  # type: ignore[assignment]
