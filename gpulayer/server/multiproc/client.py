"""A front end's end of the writer RPC: its writes, its renewal notes each tick, and what the writer pushes.

`WriterClient.write` is what the scheduler's `_write` calls in a front-end process (Facade.remote_write): the
write goes to the writer as a name and its arguments (codec.py), and the caller waits for its answer as it
would for the in-process writer. While the writer is gone (killed, restarting) every write answers 503
`unavailable` at once, reads go on, and the client connects again every RECONNECT_S.
"""
from __future__ import annotations

import itertools
import logging
import socket
import threading
from pathlib import Path
from typing import Any, Callable

from gpulayer.server.errors import Unavailable
from gpulayer.server.multiproc import codec
from gpulayer.server.scheduler import events
from gpulayer.server.store.db import BUSY_TIMEOUT_MS, WRITE_TIMEOUT_S

log = logging.getLogger("gpulayer.server.multiproc.client")
RECONNECT_S = 0.2


class _Call:
    __slots__ = ("done", "answer")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.answer: tuple | None = None


class WriterClient:
    """One connection to the writer's socket, shared by every thread of this front end."""

    def __init__(self, path: Path, shared: dict[str, object], on_push: Callable[[frozenset], None]):
        self.path = str(path)
        self.shared = shared
        self._on_push = on_push
        self._sock: socket.socket | None = None
        self._send_lock = threading.Lock()
        self._calls: dict[int, _Call] = {}
        self._calls_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._stopping = threading.Event()
        self.connected = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpulayer-writer-link", daemon=True)

    def start(self, timeout: float = 10.0) -> None:
        """Connect (and keep connecting); returns once connected, or after `timeout` seconds."""
        self._thread.start()
        self.connected.wait(timeout)

    def stop(self) -> None:
        self._stopping.set()
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(5)

    def write(self, fn, args: tuple, kwargs: dict, **options) -> Any:
        """fn(conn, *args, **kwargs) run by the writer (its scheduler's `_write` with `options`); its result.

        Raises what the write raised, NotRegistered for a function that cannot travel, Unavailable while
        the writer is gone or when it did not answer in time (then the outcome is unknown, as in-process).
        """
        answer = self.call("write", fn, args, kwargs, options, events.ACTOR.get())
        result, outs = answer
        for index, value in outs:  # a list argument the write filled in (acquire's `ahead`)
            args[index][:] = value
        return result

    def call(self, kind: str, *body) -> Any:
        """One request and its answer: (result, outs) for a write, the result for the others."""
        rid = next(self._ids)
        frame = codec.dumps((kind, rid, *body), self.shared)
        call = _Call()
        with self._calls_lock:
            self._calls[rid] = call
        try:
            sock = self._sock
            if sock is None or not self.connected.is_set():
                raise Unavailable("the control plane's writer process is not running (restarting?): nothing was "
                                  "written; retry")
            try:
                with self._send_lock:
                    sock.sendall(frame)
            except OSError:
                raise Unavailable("the control plane's writer process went away: nothing was written; retry") from None
            if not call.done.wait(WRITE_TIMEOUT_S + BUSY_TIMEOUT_MS / 1000):
                raise Unavailable("the control plane's writer process did not answer; the write's outcome is "
                                  "unknown")
        finally:
            with self._calls_lock:
                self._calls.pop(rid, None)
        answer = call.answer
        assert answer is not None
        if answer[0] == "err":
            raise codec.error_in(answer[2])
        if answer[0] == "gone":
            raise Unavailable("the control plane's writer process went away during this write: its outcome is "
                              "unknown; retry (writes are fenced: a repeat is safe)")
        return answer[2:] if kind == "write" else answer[2]

    def send(self, kind: str) -> None:
        """A message without an answer (`forget`); dropped while the writer is gone."""
        sock = self._sock
        if sock is None:
            return
        try:
            with self._send_lock:
                sock.sendall(codec.dumps((kind, 0), self.shared))
        except OSError:
            pass

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(self.path)
            except OSError:
                sock.close()
                self._stopping.wait(RECONNECT_S)
                continue
            self._sock = sock
            self.connected.set()
            log.info("writer_connected socket=%s", self.path)
            self._on_push(frozenset({"wake", "written", "forget"}))  # what it missed while gone
            try:
                self._read(sock)
            finally:
                self.connected.clear()
                self._sock = None
                sock.close()
                self._fail_pending()
            if not self._stopping.is_set():
                log.warning("writer_disconnected socket=%s: writes answer 503 until it is back", self.path)

    def _read(self, sock: socket.socket) -> None:
        try:
            while True:
                payload = codec.read_frame(sock)
                if payload is None:
                    return
                message = codec.loads(payload, self.shared)
                if message[0] == "push":
                    self._on_push(message[1])
                    continue
                with self._calls_lock:
                    call = self._calls.get(message[1])
                if call is not None:
                    call.answer = message
                    call.done.set()
        except (OSError, ConnectionError):
            return

    def _fail_pending(self) -> None:
        with self._calls_lock:
            calls = list(self._calls.values())
        for call in calls:
            if not call.done.is_set():
                call.answer = ("gone", 0)
                call.done.set()
