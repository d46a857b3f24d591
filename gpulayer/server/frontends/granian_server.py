"""Serve a WSGI app with granian (Rust: hyper and tokio) inside this process, over HTTP or TLS: the default.

granian's public entry point (`granian.Granian`) runs the app in worker
processes it spawns, or in worker threads only on a free-threaded Python. The
control plane needs the app in its own process: one writer owns the state
file, and `gpulayer up`, `--target local` and gpulayer.testing run it in
process. So this module drives granian's RSGI worker directly, as granian's
own thread-mode server does (`granian.server.mt`): a listening socket, an
`RSGIWorker`, its `serve_mtr` and asyncio loop in a thread, a `WorkerSignal`
to stop it. That is granian's internal API, so the version is pinned
(`granian>=2.8,<2.9`). The WSGI app runs behind granian_bridge.Bridge: RSGI,
not granian's WSGI worker, because there a request takes a Python thread as
soon as its head is in and a slow body then holds it with no deadline.

What granian does and cheroot (`--http cheroot`, cheroot_server.py) does too:

- request heads: hyper's `header_read_timeout` closes a connection whose head
  is not complete `head_timeout_s` after it started, for ever idle keep-alive
  connections too; heads are read by tokio, never by a Python thread;
- connections: `max_connections` (16 per thread) at once. A connection that
  sends nothing never reaches granian (TCP_DEFER_ACCEPT), and at the bound
  the stalled ones (half-sent heads: a 408; stalled handshakes, idle
  keep-alive) are closed for the ones waiting (granian_guard.py), where
  cheroot refuses heads past `MAX_PENDING_HEADS`;
- request bodies: framing is checked, a small body is awaited on the loop
  before a thread takes the request, a large one streams at a minimum rate,
  a bounded share of the threads at once (granian_bridge.py, bodies.py);
- requests run on a pool of `threads` Python threads: a parked long-poll
  holds one, as with cheroot; `backpressure` bounds the requests (and
  connections) in progress at once, past which accept waits;
- TLS: certificate and key files, TLS 1.2 at least; a handshake must end
  within 10 s (granian's TLS listener; not `head_timeout_s`); plain HTTP on
  the TLS port gets a TLS alert and a close at once (rustls; cheroot sends a
  readable 400), which gpulayer's client reads as "use an https:// URL";
- out of file descriptors: granian logs each failed accept and retries it
  every 0.5 s (no spin). A filter on that log line (`_AcceptFailures`) takes
  the waiting connections with a spare descriptor and answers 503 (plain
  HTTP; over TLS a close), as server.py's `_shed` does;
- stop: the signal stops accepting; granian calls back once the requests in
  progress have finished, and stop() waits for that (the state file must
  not close under a running request).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from typing import Any

from granian._futures import _future_watcher_wrapper, _new_cbscheduler
from granian._granian import ListenerSpec, RSGIWorker, SocketHolder, WorkerSignal
from granian._loops import loops
from granian.http import HTTP1Settings

from gpulayer.server.frontends.granian_bridge import Bridge
from gpulayer.server.frontends.granian_guard import Reaper, defer_accept
from gpulayer.server.frontends.cheroot_server import _OVERLOADED  # the same 503 as cheroot's

log = logging.getLogger("gpulayer.server.http.granian")  # the name its lines have always had

LISTEN_BACKLOG = 1024
HEAD_TIMEOUT_S = 10.0
# Tokio threads that read, parse and write; Python runs only the app.
RUNTIME_THREADS = 1
MIN_HEAD_BUFFER = 8192  # hyper's minimum read buffer
# hyper's read buffer, so the most of a request body granian hands to Python at once. Each chunk costs a
# wake-up of the loop and a Python await (about 70 us): a 1 GiB upload in 32 KiB chunks spent about 2 s of
# the control plane's CPU on that alone (docs/benchmarks/issue-27.md, "Checkpoint upload: granian's body chunks").
# It is also what one connection may hold of a head in progress (10 s at most), whatever max_header_bytes says.
BODY_READ_BYTES = 256 * 1024
# In-progress requests and connections past the Python threads (an idle keep-alive connection holds none).
BACKPRESSURE_PER_THREAD = 16
# Connections refused with 503 per failed accept (granian retries every 0.5 s).
SHED_BATCH = 256
# granian logs a failed accept under this logger, the error's Debug form in the message.
_ACCEPT_LOGGER = "_granian.workers"
_FD_EXHAUSTED = ("TooManyOpenFiles", "code: 24,", "code: 23,")  # EMFILE; ENFILE (no ErrorKind of its own)


class GranianServer:
    """granian serving `app` in this process; the same start/stop/port/scheme as HTTPServer.

    `threads` bounds the requests running in Python at once (a long-poll holds
    one); `head_timeout_s` bounds a request head from when the connection is
    ready for one; a head over `max_header_bytes` is answered 431 (by the
    bridge once it is parsed; by hyper past its read buffer). Raises
    ValueError for a lone certfile or keyfile.
    """

    def __init__(
        self,
        app,
        host: str,
        port: int,
        *,
        certfile: str | None = None,
        keyfile: str | None = None,
        threads: int = 64,
        head_timeout_s: float = HEAD_TIMEOUT_S,
        max_header_bytes: int = 64 * 1024,
        runtime_threads: int = RUNTIME_THREADS,
        max_connections: int | None = None,
        websocket=None,
        prefixed: dict | None = None,
        listener: socket.socket | None = None,
    ):
        if (certfile is None) != (keyfile is None):
            raise ValueError("TLS needs both certfile and keyfile")
        self._app = app
        self._websocket = websocket  # an RSGI WebSocket handler (the relay), or None: WebSockets are refused
        self._prefixed = prefixed or {}  # RSGI handlers of every request under a path prefix (the ingress)
        self._host, self._port = host, port
        self._given = listener  # a listening socket made by the caller (a front end's SO_REUSEPORT one), or None
        # granian's TLS settings: enabled, cert, key, key password, minimum protocol, client CA, CRLs, verify.
        self._tls: tuple[Any, ...] = (certfile is not None, certfile, keyfile, None, "tls1.2", None, [], False)
        self._threads = threads
        self._max_connections = max_connections or threads * BACKPRESSURE_PER_THREAD
        self._head_timeout_s = head_timeout_s
        self._runtime_threads = runtime_threads
        # hyper's read buffer is both the most of a request body it hands over at once and the most of a
        # head it holds before answering 431. Its size is set for bodies (BODY_READ_BYTES); the head's own
        # cap, max_header_bytes, is the bridge's, checked on the parsed head (431 too). hyper aborts the
        # process on a buffer under 8 KiB.
        self._http1 = HTTP1Settings(header_read_timeout=int(head_timeout_s * 1000),
                                    max_buffer_size=max(MIN_HEAD_BUFFER, BODY_READ_BYTES, max_header_bytes))
        self._max_header_bytes = max_header_bytes
        self._signal: WorkerSignal | None = None
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._bound_port = port
        self._listener: socket.socket | None = None  # a second handle on granian's socket, to shed from
        self._spare_fd: int | None = None
        self._accept_filter = _AcceptFailures(self)
        self._fd_warned_at = 0.0
        self._bridge: Bridge | None = None
        self._reaper: Reaper | None = None

    @property
    def port(self) -> int:
        """The bound port once started (a free one when constructed with port=0)."""
        return self._bound_port

    @property
    def scheme(self) -> str:
        """"https" when serving TLS, else "http"."""
        return "https" if self._tls[0] else "http"

    def start(self) -> None:
        """Bind and serve in a background thread; return once listening.

        Raises OSError when the address cannot be bound.
        """
        if self._given is not None:  # granian's stub lags its SocketHolder(fd, uds, backlog)
            holder = SocketHolder(self._given.fileno(), False, LISTEN_BACKLOG)  # type: ignore[call-arg]
        else:
            holder = ListenerSpec(self._host, self._port, LISTEN_BACKLOG).build()
        self._listener = socket.socket(fileno=socket.dup(holder.get_fd()))
        self._listener.setblocking(False)
        self._bound_port = self._listener.getsockname()[1]
        defer_accept(self._listener, self._head_timeout_s)
        self._spare_fd = os.open(os.devnull, os.O_RDONLY)
        logging.getLogger(_ACCEPT_LOGGER).addFilter(self._accept_filter)
        self._signal = WorkerSignal()  # granian calls back once the worker has stopped and its requests finished
        self._stopped.clear()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(holder, ready), name="gpulayer-granian",
                                        daemon=True)
        self._thread.start()
        ready.wait(10)
        self._reaper = Reaper(self._listener, self._bound_port, self.scheme == "https", self._busy)
        self._reaper.start()
        log.info("http_listening scheme=%s port=%d server=granian", self.scheme, self.port)

    def _serve(self, holder, ready: threading.Event) -> None:
        loop = loops.get("asyncio")
        asyncio.set_event_loop(loop)
        backpressure = self._max_connections
        bridge = self._bridge = Bridge(self._app, loop, self._threads, self._head_timeout_s, self._websocket,
                                       self._prefixed, max_head_bytes=self._max_header_bytes)
        # granian's own stub lags its worker's signature (the IPC handle, the metrics pair): Any.
        worker_cls: Any = RSGIWorker
        worker = worker_cls(1, (None, holder), None, self._runtime_threads, 512, 1, 30, backpressure, "1",
                            self._http1, None, self._websocket is not None, None, *self._tls, (None, None))
        scheduler = _new_cbscheduler(loop, _future_watcher_wrapper(bridge), impl_asyncio=True)
        done = asyncio.Event()
        assert self._signal is not None
        self._signal.add_cb(lambda *_: loop.call_soon_threadsafe(done.set))
        ready.set()
        try:
            worker.serve_mtr(scheduler, loop, self._signal)  # granian serves on its own threads; the app on ours
            loop.run_until_complete(done.wait())
        finally:
            bridge.close()
            loop.close()
            self._stopped.set()

    def _busy(self, client: str) -> bool:
        return self._bridge is not None and self._bridge.busy(client)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop accepting; return once requests in progress have finished, or after `timeout` seconds.

        granian also waits out a request head in progress (up to its deadline).

        Safe to call twice or before start().
        """
        if self._reaper is not None:
            self._reaper.stop()
            self._reaper = None
        if self._signal is not None:
            self._signal.set()
            self._signal = None
            if not self._stopped.wait(timeout):  # a running request, or a head granian waits out (10 s)
                log.warning("http_stop_timeout: connections still busy after %.0f s", timeout)
        if self._thread is not None and self._stopped.is_set():
            self._thread.join(timeout)
        self._thread = None
        logging.getLogger(_ACCEPT_LOGGER).removeFilter(self._accept_filter)
        if self._spare_fd is not None:
            os.close(self._spare_fd)
        if self._listener is not None:
            self._listener.close()
        self._spare_fd, self._listener = None, None
        log.info("http_stopped port=%d server=granian", self.port)

    def shed(self) -> None:
        """Out of descriptors: take the waiting connections with the spare one, answer each 503, close it.

        Called from granian's failed accept (every 0.5 s while it fails); without
        it the clients wait in the backlog until their own timeout.
        """
        now = time.monotonic()
        if now - self._fd_warned_at > 10:
            self._fd_warned_at = now
            log.warning("http_fd_exhausted: refusing new connections with 503 until descriptors are free "
                        "(raise the limit: LimitNOFILE / ulimit -n) server=granian")
        for _ in range(SHED_BATCH):
            if self._spare_fd is None:  # lost to a race at the last reopen: take the next one freed
                try:
                    self._spare_fd = os.open(os.devnull, os.O_RDONLY)
                except OSError:
                    return
            if self._listener is None:
                return
            os.close(self._spare_fd)
            self._spare_fd = None
            try:
                conn, _addr = self._listener.accept()
            except OSError:
                return  # none waiting (or taken by granian): done until the next failed accept
            else:
                with conn:
                    if self.scheme == "http":
                        conn.setblocking(False)
                        try:
                            conn.send(_OVERLOADED)
                        except OSError:
                            pass
            finally:
                try:
                    self._spare_fd = os.open(os.devnull, os.O_RDONLY)
                except OSError:
                    self._spare_fd = None


class _AcceptFailures(logging.Filter):
    """On granian's "Failed to accept connection" for want of descriptors: shed, and one warning per 10 s."""

    def __init__(self, server: GranianServer):
        super().__init__()
        self._server = server

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith("Failed to accept") or not any(m in message for m in _FD_EXHAUSTED):
            return True
        self._server.shed()
        return False  # shed() logs its own line, once per 10 s


__all__ = ["GranianServer"]
