"""The `tcp` kind's OPEN fields and `port-forward`'s [LOCAL:]REMOTE, as kubectl reads them (no process)."""

from __future__ import annotations

import pytest

from gpulayer.client.forward import parse_ports
from gpulayer.protocol.forward import tcp_target


@pytest.mark.parametrize(
    "spec, ports",
    [("8888", (8888, 8888)), ("9000:8888", (9000, 8888)), (":8888", (0, 8888)), ("0:8888", (0, 8888)), ("65535", (65535, 65535))],
)
def test_ports_as_kubectl_reads_them(spec, ports):
    assert parse_ports(spec) == ports


@pytest.mark.parametrize(
    "spec, words",
    [
        ("", "REMOTE"),
        ("abc", "REMOTE"),
        ("0", "REMOTE"),
        ("70000", "REMOTE"),
        ("1:2:3", "LOCAL"),
        ("x:80", "LOCAL"),
        ("-1:80", "LOCAL"),
        ("٣:80", "LOCAL"),
    ],
)
def test_bad_ports_say_which(spec, words):
    with pytest.raises(ValueError, match=words):
        parse_ports(spec)


def test_loopback_only():
    assert tcp_target({"port": 80}) == ("127.0.0.1", 80)
    assert tcp_target({"port": 80, "host": "localhost"}) == ("127.0.0.1", 80)
    assert tcp_target({"port": 80, "host": "::1"}) == ("::1", 80)
    assert tcp_target({"port": 80, "host": "127.0.0.2"}) == ("127.0.0.2", 80)
    for host in ("10.0.0.1", "0.0.0.0", "example.com", "", 7):
        with pytest.raises(ValueError, match="host"):
            tcp_target({"port": 80, "host": host})
    for port in (0, 65536, "80", True, None, 1.5):
        with pytest.raises(ValueError, match="port"):
            tcp_target({"port": port})
