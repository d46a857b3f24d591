"""The agent's relay link: one outbound WebSocket to the control plane, opened when it asks (`relay: true` in a
heartbeat or acquire answer), carrying any number of streams (docs/architecture.md, "The relay").

The link is `GET /v1/worker/relay` on the control plane's own URL, with the worker's session token and the
same TLS trust as every other request (the CA file or the pinned CA). It stays while streams are open and
`IDLE_S` after the last one, reconnecting with backoff if it drops meanwhile; then it closes, so an idle
worker holds no extra connection. Each stream the control plane OPENs goes to the handler of its kind
(`handlers`: exec today, agent/relay/exec.py), on its own thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from gpulayer.protocol.control import Close, StreamOpen
from gpulayer.protocol.fields import from_wire
from gpulayer.protocol.relay import COMMAND_KINDS
from gpulayer.relaylink.streams import Link, Stream, connect

from ..events import log_event
from ..link.backoff import retry_delay

#: Seconds the link stays after its last stream ended (a second `exec` soon after needs no new connection).
IDLE_S = 60.0
RELAY_VERSION = 1

Handler = Callable[[Stream, StreamOpen], None]


class Relay:
    """The relay link of one worker; `want()` (a heartbeat or acquire answer's `relay: true`) opens it."""

    def __init__(
        self,
        base_url: str,
        verify: bool | str,
        token: Callable[[], str | None],
        handlers: dict[str, Handler],
        stop: threading.Event,
        *,
        no_exec: bool = False,
        idle_s: float = IDLE_S,
    ):
        self.url = base_url + "/v1/worker/relay"
        self.verify, self.token, self.stop = verify, token, stop
        self.no_exec = no_exec
        self.handlers = {kind: h for kind, h in handlers.items() if not (no_exec and kind in COMMAND_KINDS)}
        self.idle_s = idle_s
        self.keep_until = 0.0
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.link: Link | None = None

    def register_field(self) -> dict:
        """Register's `relay`: the protocol version, the kinds this agent serves, and whether --no-exec."""
        return {"version": RELAY_VERSION, "kinds": sorted(self.handlers), "no_exec": self.no_exec}

    def want(self) -> None:
        """The control plane waits for this worker's link: open it (at once) unless it is open."""
        with self.lock:
            self.keep_until = max(self.keep_until, time.monotonic() + self.idle_s)
            if self.thread is not None and self.thread.is_alive():
                return
            self.thread = threading.Thread(target=self._run, name="relay", daemon=True)
            self.thread.start()

    def _wanted(self) -> bool:
        link = self.link
        busy = link is not None and link.active() > 0
        if busy:
            self.keep_until = max(self.keep_until, time.monotonic() + self.idle_s)
        return not self.stop.is_set() and (busy or time.monotonic() < self.keep_until)

    def _run(self) -> None:
        failures = 0
        while self._wanted():
            token = self.token()
            try:
                ws = connect(self.url, token or "", self.verify)
            except Exception as exc:
                failures += 1
                log_event("relay_connect_failed", failures=failures, error=f"{type(exc).__name__}: {exc}")
                self.stop.wait(retry_delay(failures))
                continue
            failures = 0
            link = self.link = Link(ws, self._opened, first_stream=2)
            log_event("relay_connected")
            reader = link.start()
            while reader.is_alive() and self._wanted():
                reader.join(1.0)
            if reader.is_alive():  # idle: close it
                link.close()
                reader.join(5.0)
                log_event("relay_closed", reason="idle")
            else:
                log_event("relay_lost", error=link.error)
                self.stop.wait(retry_delay(1))
            self.link = None

    def _opened(self, stream: Stream, fields: dict) -> None:
        opened: StreamOpen = from_wire(StreamOpen, fields)
        kind = opened.kind
        handler = self.handlers.get(kind) if isinstance(kind, str) else None
        with self.lock:
            self.keep_until = max(self.keep_until, time.monotonic() + self.idle_s)
        if handler is None:
            why = "this worker was started with --no-exec" if self.no_exec and kind in COMMAND_KINDS else f"this agent serves no {kind!r} streams"
            stream.close(Close(error=why))
            return
        threading.Thread(target=self._serve, args=(handler, stream, opened), name=f"relay-{kind}-{stream.id}", daemon=True).start()

    def _serve(self, handler: Handler, stream: Stream, opened: StreamOpen) -> None:
        try:
            handler(stream, opened)
        except Exception as exc:  # a handler's bug ends its stream, never the link
            log_event("relay_stream_failed", kind=opened.kind, error=repr(exc))
            stream.close(Close(error=f"the agent failed: {type(exc).__name__}: {exc}"))
