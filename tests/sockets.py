"""Socket helpers the tests share."""

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
