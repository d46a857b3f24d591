"""Socket and WebSocket helpers the tests share."""

from __future__ import annotations

import socket
import threading

#: Source to put before a replica's (a `python -c` program's): `ws_accept(handler)` answers the WebSocket upgrade
#: an http.server BaseHTTPRequestHandler has read (101 and Sec-WebSocket-Accept, RFC 6455).
WS_ACCEPT = r"""
def ws_accept(handler):
    import base64, hashlib
    key = handler.headers["Sec-WebSocket-Key"].encode()
    accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    handler.send_response(101)
    handler.send_header("Upgrade", "websocket")
    handler.send_header("Connection", "Upgrade")
    handler.send_header("Sec-WebSocket-Accept", accept.decode())
    handler.end_headers()
"""


def pipe(a: socket.socket, b: socket.socket) -> None:
    """Copy a's bytes to b until a ends or either fails; then shut both."""
    try:
        while data := a.recv(65536):
            b.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def join(a: socket.socket, b: socket.socket) -> None:
    """Pipe both ways, each on a thread of its own."""
    for x, y in ((a, b), (b, a)):
        threading.Thread(target=pipe, args=(x, y), daemon=True).start()


async def ws_echo(scope, proto) -> None:
    """An RSGI WebSocket handler for GranianServer: refuses a path ending in "refuse" with 403, else sends
    each message back (binary), until the client closes."""
    if scope.path.endswith("refuse"):
        proto.close(403)
        return
    transport = await proto.accept()
    while True:
        message = await transport.receive()
        if message.kind == 0:
            break
        await transport.send_bytes(message.data if isinstance(message.data, bytes) else message.data.encode())
    proto.close(1000)
