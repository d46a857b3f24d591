"""The `tcp` stream kind's OPEN fields (`port`, `host`), checked alike by the control plane and the agent.

A `tcp` stream is a TCP connection to a port in a running task's network view (`gpulayer port-forward`, the
control plane's ingress): `port` 1-65535, `host` a loopback address of that view (127.0.0.1 when absent;
`localhost` means 127.0.0.1). Anything else is refused: the relay reaches the task, not the worker's network.
The fields are declared in control.py (`TcpOpen`, a client's; `StreamOpen`, the agent's); `tcp_target` checks
their values. The socket joined to such a stream, on the agent's and the client's side: gpulayer/relaylink/pipe.py.
"""

from __future__ import annotations

import ipaddress

DEFAULT_HOST = "127.0.0.1"


def tcp_target(fields: dict) -> tuple[str, int]:
    """The (host, port) an OPEN of kind `tcp` names; ValueError (its message for the caller) when they are bad."""
    port = fields.get("port")
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise ValueError("port: must be a whole number from 1 to 65535 (the port in the task)")
    return loopback_host(fields.get("host")), port


def loopback_host(value) -> str:
    """`host` checked: a loopback address (None or "localhost": 127.0.0.1); ValueError otherwise."""
    if value is None or value == "localhost":
        return DEFAULT_HOST
    if not isinstance(value, str):
        raise ValueError("host: must be a loopback address (127.0.0.1 by default, or ::1)")
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"host {value!r}: must be a loopback address (127.0.0.1 by default, or ::1)") from None
    if not address.is_loopback:
        raise ValueError(f"host {value}: only the task's loopback addresses are reachable (127.0.0.1, ::1)")
    return str(address)


__all__ = ["tcp_target", "loopback_host", "DEFAULT_HOST"]
