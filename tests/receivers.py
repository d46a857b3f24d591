"""A webhook receiver for tests: a real HTTP server on loopback (a thread of the test's process); one that
never finishes an answer (Trickle); a mailbox for aiosmtpd's SMTP server."""

from __future__ import annotations

import itertools
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """A loopback HTTP server that keeps what it is sent; `fail` > 0 answers 500 that many times.

    `idle_s`: HTTP/1.1 keep-alive, each connection closed by the receiver after that long idle."""

    def __init__(self, idle_s: float | None = None):
        self.got: list[tuple[dict, bytes]] = []
        self.fail = 0
        self.connections = 0
        self.closed = 0  # connections ended (by the receiver past idle_s, or by the sender)
        self.gate: threading.Event | None = None  # when set to an Event: each POST waits for it (60 s at most)
        self.arrived = 0  # POSTs read, held at the gate or not
        outer = self

        class Handler(BaseHTTPRequestHandler):
            if idle_s is not None:
                protocol_version = "HTTP/1.1"
                timeout = idle_s

            def setup(self):
                outer.connections += 1
                super().setup()

            def finish(self):
                super().finish()
                outer.closed += 1

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.arrived += 1
                if outer.gate is not None:
                    outer.gate.wait(60)
                if outer.fail > 0:
                    outer.fail -= 1
                    self.send_response(500)
                else:
                    outer.got.append(({k.lower(): v for k, v in self.headers.items()}, body))
                    self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def types(self) -> list[str]:
        return [json.loads(body)["type"] for _, body in self.got]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Mailbox:
    """aiosmtpd's handler: keeps each message's envelope and text."""

    def __init__(self):
        self.messages: list[tuple[list[str], str]] = []

    async def handle_DATA(self, server, session, envelope):
        self.messages.append((list(envelope.rcpt_tos), envelope.content.decode(errors="replace")))
        return "250 OK"


class Trickle:
    """A receiver that never finishes an answer: it reads the request, then sends its status line and a
    header a byte every `every_s` (each socket read of the sender's gets a byte in time, its try never
    ends on a read timeout). `connections`: how many it took."""

    def __init__(self, every_s: float = 1.0):
        self.every_s = every_s
        self.connections = 0
        self._stop = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(1 << 16)
                for byte in itertools.chain(b"HTTP/1.1 200 OK\r\nX-Slow: ", itertools.repeat(ord("a"))):
                    if self._stop.wait(self.every_s):
                        return
                    conn.sendall(bytes([byte]))
            except OSError:  # the sender gave up
                return

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
