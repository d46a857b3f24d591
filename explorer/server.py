"""serve(): the explorer over plain HTTP on this machine (`gpulayer explore`)."""
from __future__ import annotations

import ipaddress
from collections.abc import Callable

import waitress

from .app import create_app

DEFAULT_PORT = 8471


class Exposed(ValueError):
    """Serving the explorer open on an address other machines reach: refused."""


def serve(state_path: str, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *,
          auth: Callable[[str], bool] | None = None) -> None:
    """Serve the explorer until interrupted; prints its URL. Port 0 picks a free port.

    Without `auth` the explorer is open, so only a loopback `host` is allowed
    (raises Exposed otherwise): it shows the whole state file, job env included.
    """
    if auth is None and not _is_loopback(host):
        raise Exposed(f"refusing to serve the explorer without a token on {host}, which is not a loopback "
                      "address: it shows the whole state file, job environments included. Give "
                      "--token-required (log in with the client token), or --host 127.0.0.1")
    server = waitress.create_server(create_app(state_path, auth=auth), host=host, port=port, threads=4,
                                    clear_untrusted_proxy_headers=True)
    bound_host, bound_port = server.socket.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    print(f"GPUlayer explorer: http://{shown}:{bound_port}/ (read-only view of {state_path}; Ctrl-C to stop)", flush=True)
    try:
        server.run()
    finally:
        server.close()


def _is_loopback(host: str) -> bool:
    # The control plane's is_loopback (gpulayer/server/process.py) says the same; the explorer
    # imports nothing of gpulayer but store/readonly_sql.py (tests/unit/test_import_contracts.py), so it keeps its own.
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
