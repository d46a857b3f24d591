"""Socket and WebSocket helpers the tests share."""

from __future__ import annotations

import socket
import threading


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
