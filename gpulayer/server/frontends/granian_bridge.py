"""Run a WSGI app behind granian's RSGI worker: bodies read in asyncio, the app on a pool of threads.

granian's WSGI worker hands a request to a Python thread as soon as its head
is in, and `wsgi.input.read()` then blocks that thread until the body has
come, with no deadline: slow bodies could hold every thread. Over RSGI the
body is an awaitable on granian's asyncio loop, so here (bodies.py has the
policy, as cheroot_server.py applies it):

- a head over `max_head_bytes` is refused first (431), whatever its path:
  granian's read buffer, which would otherwise be the cap, is sized for
  bodies (granian_server.BODY_READ_BYTES);
- framing is checked next, before any dispatch, so for the prefixed handlers
  (the ingress) too (400 for an ambiguous length);
- a small body is awaited on the loop, holding no thread, within
  `head_timeout_s` (408 and a close past it); only then does a thread of
  the pool run the app, with the body in memory;
- a larger or chunked body streams into the app through `_StreamedBody`,
  each read waiting only as long as the minimum rate allows; at most
  `bodies.streamed_cap(threads)` requests do that at once (503 past it).

A 408 or 400 answer carries `Connection: close`, and dropping the body's
awaitable makes granian close the connection at once.

The pool (`_Pool`) is this module's own, not a ThreadPoolExecutor: a request
costs one asyncio future and one queue put, and the threads that finish
requests wake the loop once for all the answers that are ready (one write to
its self-pipe per batch, not one per request, nor a concurrent future with its
three conditions and a chained callback each). A file answered whole
(an artifact) goes out through granian's `response_file`, read from disk as
the socket drains: its stream transport would queue it all in memory.
"""

from __future__ import annotations

import asyncio
import collections
import io
import logging
import os
import queue
import sys
import threading
from collections.abc import Callable
from collections.abc import Awaitable
from typing import Any

from gpulayer.server.errors import BodyIncomplete, error_body
from gpulayer.server.frontends import bodies

log = logging.getLogger("gpulayer.server.http.granian")  # the name its lines have always had

_FILE_BLOCK = 1 << 20  # bytes of a streamed file response per send
_READ_AHEAD = 8 << 20  # bytes of a streamed request body read ahead of the app
_JSON = ("content-type", "application/json")
_CLOSE = ("connection", "close")


class Bridge:
    """The RSGI callable granian calls on its loop for each request; `close()` stops the pool."""

    def __init__(self, app, loop: asyncio.AbstractEventLoop, threads: int, head_timeout_s: float,
                 websocket: Callable[[Any, Any], Awaitable[None]] | None = None,
                 prefixed: dict[str, Callable[[Any, Any], Awaitable[None]]] | None = None,
                 max_head_bytes: int | None = None):
        self.app, self.loop = app, loop
        # granian's read buffer is sized for bodies (granian_server.BODY_READ_BYTES): the head's cap is here.
        self.max_head_bytes = max_head_bytes
        self.websocket = websocket  # the relay (gpulayer/server/relay/hub.py): WebSockets never reach the app
        # Every request (HTTP or WebSocket) under one of these path prefixes goes to its handler on the loop,
        # never to the app's threads: the ingress (gpulayer/server/relay/ingress.py) streams both ways there.
        self.prefixed = tuple((prefix, handler) for prefix, handler in (prefixed or {}).items())
        self.head_timeout_s = head_timeout_s
        self.pool = _Pool(loop, threads, "gpulayer-granian")
        self.max_streams = bodies.streamed_cap(threads)
        self.streams = 0  # touched only on the loop's thread
        self.active: set[str] = set()  # the clients with a request here (changed on the loop's thread)

    def busy(self, client: str) -> bool:
        """Whether the connection from `client` ("host:port") has a request here (any thread may ask)."""
        return client in self.active

    async def __call__(self, scope, proto) -> None:
        # A connection with a request, a WebSocket or an ingress stream here is never one the guard may close
        # as stalled (granian_guard.py): an idle shell or agent link, or an SSE stream between two tokens,
        # receives nothing for long stretches and is alive.
        client = scope.client
        self.active.add(client)
        try:
            size = head_bytes(scope) if self.max_head_bytes is not None else 0
            if self.max_head_bytes is not None and size > self.max_head_bytes:
                log.debug("http_head_refused peer=%s bytes=%d", client, size)
                if scope.proto == "ws":
                    return proto.close(431)
                return _refuse(proto, 431, "headers_too_large",
                               f"the request's head is over {self.max_head_bytes} bytes")
            if scope.proto != "ws":  # before any dispatch: a prefixed handler (the ingress) reads bodies too
                refused = bodies.framing_error(scope.headers.items())
                if refused is not None:
                    return _refuse(proto, 400, "invalid_framing",
                                   f"the request's length is ambiguous: {refused} (RFC 9112, section 6.3)")
            for prefix, handler in self.prefixed:
                if scope.path.startswith(prefix):
                    return await handler(scope, proto)
            if scope.proto == "ws":
                if self.websocket is None:
                    return proto.close(404)
                return await self.websocket(scope, proto)
            await self._request(scope, proto)
        finally:
            self.active.discard(client)

    async def _request(self, scope, proto) -> None:
        headers = scope.headers.items()  # its framing was checked (__call__)
        named = {name: value.strip().lower() for name, value in headers}
        length = int(named.get("content-length") or 0)
        if "transfer-encoding" in named or length > bodies.BUFFERED_BODY_BYTES:
            return await self._streamed(scope, proto, headers)
        body = b""
        if length:
            try:
                body = await asyncio.wait_for(proto(), self.head_timeout_s)
            except asyncio.TimeoutError:
                return _refuse(proto, 408, "request_timeout",
                               f"the request body did not arrive within {self.head_timeout_s:g} s")
        environ = _environ(scope, headers, io.BytesIO(body))
        await self.pool.submit(self._serve, environ, proto, None)

    async def _streamed(self, scope, proto, headers) -> None:
        if self.streams >= self.max_streams:
            log.debug("http_stream_refused peer=%s streams=%d", scope.client, self.streams)
            return _refuse(proto, 503, "unavailable", bodies.STREAMS_FULL, [("retry-after", "1")])
        self.streams += 1
        stream = _StreamedBody(proto, self.loop)
        try:
            environ = _environ(scope, headers, stream)
            await self.pool.submit(self._serve, environ, proto, stream)
        finally:
            self.streams -= 1
            stream.cancel()

    def _serve(self, environ: dict, proto, stream: _StreamedBody | None) -> None:
        """Run the app on a pool thread and hand its answer to granian."""
        started: list = []

        def start_response(status, response_headers, exc_info=None):
            started[:] = [int(status.split(" ", 1)[0]), list(response_headers)]

        result = self.app(environ, start_response)
        try:
            status, response_headers = started
            if stream is not None and stream.pace.expired:
                response_headers = [*response_headers, _CLOSE]
            if isinstance(result, list):
                proto.response_bytes(status, response_headers, b"".join(result))
                return
            path = _whole_file(result)
            if path is not None:  # granian reads it as the socket drains: memory stays flat
                proto.response_file(status, response_headers, path)
                return
            transport = proto.response_stream(status, response_headers)
            for chunk in result:
                if chunk:
                    asyncio.run_coroutine_threadsafe(_send(transport, chunk), self.loop).result()
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()

    def close(self) -> None:
        self.pool.close()


class _Pool:
    """Up to `threads` threads (started as requests need them) that run calls for the loop.

    `submit` (on the loop) returns an asyncio future. A thread that finishes a call appends it to
    `finished` and, unless a wake-up is pending already, schedules one `_drain` on the loop, which
    resolves every finished call: under load one wake-up serves many answers.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, threads: int, name: str):
        self.loop, self.max_threads, self.name = loop, threads, name
        self.calls: queue.SimpleQueue = queue.SimpleQueue()
        self.finished: collections.deque = collections.deque()
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.idle = 0               # threads waiting for a call that no submit has claimed yet
        self.wake_pending = False   # a _drain is scheduled on the loop and has not started
        self.closed = False

    def submit(self, fn: Callable[..., Any], *args) -> asyncio.Future:
        """Run fn(*args) on a pool thread; the future (of this loop) gets its result or exception."""
        future = self.loop.create_future()
        with self.lock:
            if self.closed:
                raise RuntimeError("the bridge's pool is closed")
            if self.idle:
                self.idle -= 1
            elif len(self.threads) < self.max_threads:
                thread = threading.Thread(target=self._work, name=f"{self.name}_{len(self.threads)}", daemon=True)
                self.threads.append(thread)
                thread.start()
            self.calls.put((future, fn, args))
        return future

    def _work(self) -> None:
        while True:
            call = self.calls.get()
            if call is None:
                return
            future, fn, args = call
            if future.cancelled():   # its request was given up before it ran (as a cancelled executor job)
                with self.lock:
                    self.idle += 1
                continue
            try:
                result, error = fn(*args), None
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine, as an executor does
                result, error = None, exc
            self._finished(future, result, error)
            del call, future, fn, args, result, error

    def _finished(self, future: asyncio.Future, result: Any, error: BaseException | None) -> None:
        """Hand the answer to the loop; this thread is idle from now (a submit may claim it at once)."""
        self.finished.append((future, result, error))
        with self.lock:
            self.idle += 1
            if self.wake_pending:
                return
            self.wake_pending = True
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:   # the loop is closed: nobody awaits the answer any more
            pass

    def _drain(self) -> None:
        with self.lock:
            self.wake_pending = False   # a call finished from now on schedules the next _drain
        while self.finished:
            future, result, error = self.finished.popleft()
            if future.cancelled():
                continue
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)

    def close(self) -> None:
        """Stop the threads once their calls are done; calls not started yet are cancelled."""
        with self.lock:
            self.closed = True
            threads = len(self.threads)
        while True:
            try:
                call = self.calls.get_nowait()
            except queue.Empty:
                break
            if call is not None:
                call[0].cancel()
        for _ in range(threads):
            self.calls.put(None)


async def _send(transport, chunk: bytes) -> None:
    await transport.send_bytes(chunk)


class _StreamedBody(io.RawIOBase):
    """`wsgi.input` of a streamed body: a pump on the loop reads granian's chunks ahead of the app (up to
    `_READ_AHEAD` bytes), and read() on a pool thread takes them, each wait bounded by the body's minimum
    rate (bodies.Pace; BodyTooSlow past it).

    The thread is woken once the bytes it asked for are in (or the body ended), not once per chunk, and
    the loop once per `_READ_AHEAD / 2` bytes taken while the pump waits for room: a 1 GiB upload costs a
    few hundred wake-ups, not one cross-thread call per TLS record. Chunks are kept as granian gave them
    and joined once per read (no buffer grown by concatenation)."""

    def __init__(self, proto, loop: asyncio.AbstractEventLoop):
        super().__init__()
        self._loop = loop
        self._chunks: collections.deque[bytes] = collections.deque()
        self._offset = 0        # bytes of _chunks[0] already read
        self._buffered = 0      # bytes in _chunks not read yet
        self._want = 0          # bytes a waiting reader needs before it is woken (0: none waits)
        self._ended = False
        self._error: BaseException | None = None
        self._paused = False    # the pump waits for room (set under the lock, cleared by the reader)
        self._cond = threading.Condition(threading.Lock())
        self._room = asyncio.Event()
        self.pace = bodies.Pace()
        self._task: asyncio.Task | None = loop.create_task(self._pump(proto))  # made on the loop's thread

    async def _pump(self, proto) -> None:
        error: BaseException | None = None
        try:
            async for chunk in proto:
                if not chunk:
                    continue
                with self._cond:
                    self._chunks.append(chunk)
                    self._buffered += len(chunk)
                    self.pace.received += len(chunk)
                    full = self._buffered >= _READ_AHEAD
                    if full:
                        self._paused = True
                        self._room.clear()
                    if self._want and (full or self._buffered >= self._want):
                        self._cond.notify()
                if full:
                    await self._room.wait()
        except asyncio.CancelledError:
            error = BodyIncomplete("the request was given up before its body ended")
            raise
        except Exception as exc:  # noqa: BLE001 - the reader raises it, as it would have read it
            error = exc
        finally:
            with self._cond:
                self._ended, self._error = True, error
                self._cond.notify()

    def readable(self) -> bool:
        return True

    def _wait_for(self, want: int) -> None:
        """Wait (holding the lock) until `want` bytes are buffered, or as many as the read-ahead holds, or the
        body ended; BodyTooSlow past the pace."""
        while self._buffered < want and not self._ended and not self._paused:
            left = self.pace.seconds_left()
            if left <= 0:
                raise self.pace.too_slow()
            self._want = want
            try:
                self._cond.wait(left)
            finally:
                self._want = 0

    def read(self, size: int | None = -1) -> bytes:
        want = sys.maxsize if size is None or size < 0 else size
        with self._cond:
            self._wait_for(want)
            if not self._buffered and self._error is not None:
                raise self._error
            return self._take(min(want, self._buffered))

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def readline(self, size: int | None = -1) -> bytes:
        limit = sys.maxsize if size is None or size < 0 else size
        with self._cond:
            while True:
                end = self._newline_end()
                if end is not None or self._buffered >= limit or self._ended or self._paused:
                    break  # a line longer than the read-ahead comes in parts
                self._wait_for(self._buffered + 1)
            if not self._buffered and self._error is not None:
                raise self._error
            return self._take(min(end if end is not None else self._buffered, limit))

    def _newline_end(self) -> int | None:
        """Bytes up to and including the first buffered newline; None when none is buffered."""
        seen, offset = 0, self._offset
        for chunk in self._chunks:
            at = chunk.find(b"\n", offset)
            if at >= 0:
                return seen + at - offset + 1
            seen += len(chunk) - offset
            offset = 0
        return None

    def _take(self, n: int) -> bytes:
        """The next `n` buffered bytes (the lock held); the pump is let go on once half its room is free."""
        parts: list = []
        left = n
        while left:
            chunk = self._chunks[0]
            avail = len(chunk) - self._offset
            if avail <= left:
                parts.append(chunk if not self._offset else memoryview(chunk)[self._offset:])
                self._chunks.popleft()
                self._offset = 0
                left -= avail
            else:
                parts.append(memoryview(chunk)[self._offset:self._offset + left])
                self._offset += left
                left = 0
        self._buffered -= n
        if self._paused and self._buffered <= _READ_AHEAD // 2:
            self._paused = False
            self._loop.call_soon_threadsafe(self._room.set)
        if len(parts) == 1 and isinstance(parts[0], bytes):
            return parts[0]
        return b"".join(parts)

    def cancel(self) -> None:
        """Stop reading the body (on the loop: granian then closes a connection whose body was not read)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = None


def head_bytes(scope) -> int:
    """The size of a request's head as HTTP/1.1 writes it (request line, header lines, blank line)."""
    line = len(scope.method) + len(scope.path.encode("utf-8", "surrogateescape")) + len("  HTTP/1.1\r\n")
    if scope.query_string:
        line += 1 + len(scope.query_string)
    return line + sum(len(name) + len(value) + 4 for name, value in scope.headers.items()) + 2


def _refuse(proto, status: int, code: str, message: str, extra: list | None = None) -> None:
    proto.response_bytes(status, [_JSON, _CLOSE, *(extra or [])], error_body(code, message))


def _whole_file(result) -> str | None:
    """The path of a file response sent whole (an artifact): granian streams it from disk.

    granian's stream transport queues every chunk it is given without waiting for the
    socket, so a file sent through it would sit in memory when the client reads slower
    than the disk; `response_file` reads it only as fast as the socket takes it. An
    artifact's bytes never change under its name (content-addressed).
    """
    if not isinstance(result, _FileWrapper):
        return None
    fh = result.fh
    name = getattr(fh, "name", None)
    if not isinstance(name, str) or not os.path.isabs(name):
        return None
    try:
        return name if fh.tell() == 0 and os.path.isfile(name) else None
    except (OSError, ValueError):
        return None


class _FileWrapper:
    """`wsgi.file_wrapper`: a file's bytes in large blocks (falcon's default block is small)."""

    def __init__(self, fh, block: int = _FILE_BLOCK):
        self.fh, self.block = fh, max(block, _FILE_BLOCK)

    def __iter__(self):
        return iter(lambda: self.fh.read(self.block), b"")

    def close(self) -> None:
        self.fh.close()


def _environ(scope, headers, body) -> dict:
    """The WSGI environ (PEP 3333) of an RSGI scope."""
    server_host, _, server_port = scope.server.rpartition(":")
    client_host, _, client_port = scope.client.rpartition(":")
    environ: dict = {
        "REQUEST_METHOD": scope.method,
        "SCRIPT_NAME": "",
        # RSGI gives the path percent-decoded as text; WSGI wants its bytes as latin-1.
        "PATH_INFO": scope.path.encode("utf-8", "surrogateescape").decode("latin-1"),
        "QUERY_STRING": scope.query_string,
        "SERVER_NAME": server_host.strip("[]"),
        "SERVER_PORT": server_port,
        "SERVER_PROTOCOL": f"HTTP/{scope.http_version}",
        "REMOTE_ADDR": client_host.strip("[]"),
        "REMOTE_PORT": client_port,
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scope.scheme,
        "wsgi.input": body,
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
        "wsgi.input_terminated": True,
        "wsgi.file_wrapper": _FileWrapper,
    }
    if scope.scheme == "https":
        environ["HTTPS"] = "on"
    for name, value in headers:
        key = name.upper().replace("-", "_")
        if key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            environ[key] = value
            continue
        key = "HTTP_" + key
        environ[key] = f"{environ[key]},{value}" if key in environ else value
    return environ


__all__ = ["Bridge"]
