"""Serve a WSGI app with granian (Rust: hyper and tokio) inside this process, over HTTP or TLS.

granian's public entry point (`granian.Granian`) runs the app in worker
processes it spawns, or in worker threads only on a free-threaded Python. The
control plane needs the app in its own process: one writer owns the state
file, and `gpulayer up`, `--target local` and gpulayer.testing run it in
process. So this module drives granian's WSGI worker directly, as granian's
own thread-mode server does (`granian.server.mt`): a listening socket, a
`WSGIWorker`, its `serve_mtr` in a thread, a `WorkerSignal` to stop it. That
is granian's internal API, so the version is pinned (`granian>=2.8,<2.9`).

What granian does and cheroot did here (server.py):

- request heads: hyper's `header_read_timeout` closes a connection whose head
  is not complete `head_timeout_s` after it started, for ever idle keep-alive
  connections too; heads are read by tokio, never by a Python thread;
- requests run on `threads` Python threads ("blocking threads"): a parked
  long-poll holds one, as with cheroot; `backpressure` bounds the requests
  (and connections) in progress at once, past which accept waits;
- TLS: certificate and key files, TLS 1.2 at least;
- stop: the signal stops accepting and lets requests in progress finish.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any

from granian._futures import _new_cbscheduler
from granian._granian import ListenerSpec, WorkerSignal, WSGIWorker
from granian._loops import loops
from granian.http import HTTP1Settings
from granian.wsgi import _callback_wrapper

log = logging.getLogger("gpulayer.server.http.granian")

LISTEN_BACKLOG = 1024
HEAD_TIMEOUT_S = 10.0
# Tokio threads that read, parse and write; Python runs only the app.
RUNTIME_THREADS = 1
# In-progress requests and connections past the Python threads (an idle keep-alive connection holds none).
BACKPRESSURE_PER_THREAD = 16


class GranianServer:
    """granian serving `app` in this process; the same start/stop/port/scheme as HTTPServer.

    `threads` bounds the requests running in Python at once (a long-poll holds
    one); `head_timeout_s` bounds a request head from when the connection is
    ready for one. Raises ValueError for a lone certfile or keyfile.
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
        runtime_threads: int = RUNTIME_THREADS,
    ):
        if (certfile is None) != (keyfile is None):
            raise ValueError("TLS needs both certfile and keyfile")
        self._app = app
        self._host, self._port = host, port
        # granian's TLS settings: enabled, cert, key, key password, minimum protocol, client CA, CRLs, verify.
        self._tls: tuple[Any, ...] = (certfile is not None, certfile, keyfile, None, "tls1.2", None, [], False)
        self._threads = threads
        self._runtime_threads = runtime_threads
        self._http1 = HTTP1Settings(header_read_timeout=int(head_timeout_s * 1000))
        self._signal: WorkerSignal | None = None
        self._thread: threading.Thread | None = None
        self._bound_port = port

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
        holder = ListenerSpec(self._host, self._port, LISTEN_BACKLOG).build()
        probe = socket.socket(fileno=socket.dup(holder.get_fd()))
        try:
            self._bound_port = probe.getsockname()[1]
        finally:
            probe.close()
        self._signal = WorkerSignal()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(holder, ready), name="gpulayer-granian",
                                        daemon=True)
        self._thread.start()
        ready.wait(10)
        log.info("http_listening scheme=%s port=%d server=granian", self.scheme, self.port)

    def _serve(self, holder, ready: threading.Event) -> None:
        loop = loops.get("asyncio")
        backpressure = self._threads * BACKPRESSURE_PER_THREAD
        # granian's own stub lags its worker's signature (the IPC handle, the metrics pair): Any.
        worker_cls: Any = WSGIWorker
        worker = worker_cls(1, (None, holder), None, self._runtime_threads, 512, self._threads, 30,
                            backpressure, "1", self._http1, None, None, *self._tls, (None, None))
        scheduler = _new_cbscheduler(loop, _callback_wrapper(self._app, {}, None), impl_asyncio=True)
        ready.set()
        try:
            worker.serve_mtr(scheduler, loop, self._signal)
        finally:
            loop.close()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop accepting and let requests in progress finish (up to `timeout` seconds).

        Safe to call twice or before start().
        """
        if self._signal is not None:
            self._signal.set()
            self._signal = None
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        log.info("http_stopped port=%d server=granian", self.port)


__all__ = ["GranianServer"]
