"""serve(): the explorer over plain HTTP on this machine (`gpulayer explore`)."""
from __future__ import annotations

import waitress

from .app import create_app

DEFAULT_PORT = 8471


def serve(state_path: str, host: str = "127.0.0.1", port: int = DEFAULT_PORT) -> None:
    """Serve the explorer, open (no token), until interrupted; prints its URL.

    Plain HTTP and no auth: meant for 127.0.0.1. Port 0 picks a free port.
    """
    server = waitress.create_server(create_app(state_path), host=host, port=port, threads=4,
                                    clear_untrusted_proxy_headers=True)
    bound_host, bound_port = server.socket.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    print(f"GPUlayer explorer: http://{shown}:{bound_port}/ (read-only view of {state_path})", flush=True)
    try:
        server.run()
    finally:
        server.close()
