"""Network namespaces for the tests that put a worker on a "second machine" (root and iproute2).

`VethNamespace`: one namespace joined to the host by a veth pair, each end with
its own address (tests/faults/test_faults_partition.py, tests/integration/
test_http_remote.py). `BridgedNamespaces`: several namespaces on one bridge
(tests/integration/test_multinode.py). Both delete what a killed earlier run
with the same names left, and everything they made when done.
"""
from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
from dataclasses import dataclass


def netns_unavailable() -> str | None:
    """Why this process cannot make network namespaces, or None when it can."""
    if os.geteuid() != 0:
        return "needs root to make network namespaces (ip netns add)"
    if shutil.which("ip") is None:
        return "needs iproute2's `ip` to make network namespaces"
    return None


def netns_exec(name: str) -> list[str]:
    """The command prefix that runs a command inside namespace `name`."""
    return ["ip", "netns", "exec", name]


def sh(*argv: str) -> None:
    """Run a command; CalledProcessError (with its stderr) when it fails."""
    subprocess.run(argv, check=True, capture_output=True, text=True, timeout=10)


def _quiet(*argv: str) -> None:
    subprocess.run(argv, capture_output=True, timeout=10)


@dataclass
class VethNamespace:
    """Namespace `name`; veth `host_if` (host side, `host_ip`) to `ns_if` (inside, `ns_ip`), /`prefix`."""

    name: str
    host_if: str
    ns_if: str
    host_ip: str
    ns_ip: str
    prefix: int = 24

    def create(self) -> "VethNamespace":
        """Make the namespace and the link; CalledProcessError when this host refuses."""
        self.delete()
        sh("ip", "netns", "add", self.name)
        sh("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        sh("ip", "link", "set", self.ns_if, "netns", self.name)
        sh("ip", "addr", "add", f"{self.host_ip}/{self.prefix}", "dev", self.host_if)
        sh("ip", "link", "set", self.host_if, "up")
        sh("ip", "-n", self.name, "addr", "add", f"{self.ns_ip}/{self.prefix}", "dev", self.ns_if)
        sh("ip", "-n", self.name, "link", "set", self.ns_if, "up")
        sh("ip", "-n", self.name, "link", "set", "lo", "up")
        return self

    def delete(self) -> None:
        _quiet("ip", "link", "del", self.host_if)
        _quiet("ip", "netns", "del", self.name)

    def link(self, up: bool) -> None:
        """Bring the host end up or down (a cut cable)."""
        sh("ip", "link", "set", self.host_if, "up" if up else "down")

    def run(self, *argv: str) -> str:
        """stdout of `argv` run inside the namespace."""
        return subprocess.run([*netns_exec(self.name), *argv], check=True, capture_output=True,
                              text=True, timeout=10).stdout


def veth_namespace(net: VethNamespace) -> VethNamespace:
    """`net` created, or pytest.skip with the reason (not root, no `ip`, refused by this host)."""
    import pytest
    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)
    try:
        return net.create()
    except (subprocess.CalledProcessError, OSError) as exc:
        net.delete()
        pytest.skip(f"cannot make a network namespace here: {getattr(exc, 'stderr', None) or exc}")


class BridgedNamespaces:
    """A bridge with an address on the host, and one namespace per worker on it."""

    def __init__(self, count: int):
        tag = f"{os.getpid() % 10000}"
        self.subnet = f"10.{random.randrange(200, 250)}.{random.randrange(1, 250)}"
        self.bridge = f"glbr{tag}"
        self.host = f"{self.subnet}.1"
        self.names = [f"gl{tag}n{i}" for i in range(count)]
        self.addresses = [f"{self.subnet}.{i + 2}" for i in range(count)]

    def create(self) -> "BridgedNamespaces":
        self.delete()  # leftovers of a killed run with the same pid
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.host}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for i, (name, address) in enumerate(zip(self.names, self.addresses)):
            outside, inside = f"{self.bridge}v{i}", f"{self.bridge}p{i}"
            sh("ip", "netns", "add", name)
            sh("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
            sh("ip", "link", "set", outside, "master", self.bridge)
            sh("ip", "link", "set", outside, "up")
            sh("ip", "link", "set", inside, "netns", name)
            sh("ip", "-n", name, "addr", "add", f"{address}/24", "dev", inside)
            sh("ip", "-n", name, "link", "set", inside, "up")
            sh("ip", "-n", name, "link", "set", "lo", "up")
        return self

    def delete(self) -> None:
        for name in self.names:
            _quiet("ip", "netns", "del", name)
        _quiet("ip", "link", "del", self.bridge)


#: A NAT box's inbound rules, inside the namespace: its own loopback and the answers to connections it
#: opened pass; every NEW connection from outside is dropped (no RST, as NAT gives none: a connect times out).
NAT_RULES = (
    ("-A", "INPUT", "-i", "lo", "-j", "ACCEPT"),
    ("-A", "INPUT", "-m", "conntrack", "--ctstate", "NEW", "-j", "DROP"),
)


class NatNamespace(VethNamespace):
    """A VethNamespace behind a NAT box: what runs in it dials out (to `host_ip`), nothing reaches it.

    Start the worker in it (`plane.start_worker(name, prefix=netns_exec(net.name))`) with the control plane on
    `host_ip` (`ControlPlaneProcess(root, host=net.host_ip, tls=True)`): the worker joins and works, and a
    service its task runs on 0.0.0.0 cannot be reached at `ns_ip` (`reachable()` says so).
    """

    def create(self) -> "NatNamespace":
        super().create()
        for tool in ("iptables", "ip6tables"):
            for rule in NAT_RULES:
                sh(*netns_exec(self.name), tool, *rule)
        return self

    def reachable(self, port: int, timeout: float = 2.0) -> bool:
        """Whether a connect from the host to `ns_ip`:`port` gets through (behind the NAT it never does)."""
        try:
            socket.create_connection((self.ns_ip, port), timeout).close()
            return True
        except OSError:
            return False


def nat_namespace(label: str = "nat"):
    """A pytest fixture's body (`yield from nat_namespace("fw")`): a NatNamespace with names and a /30 of its
    own (`label`, up to 4 letters, tells fixtures of one run apart), deleted after; pytest.skip when this host
    cannot make one (not root, no `ip` or `iptables`)."""
    import pytest
    if shutil.which("iptables") is None or shutil.which("ip6tables") is None:
        pytest.skip("needs iptables and ip6tables to put a namespace behind a NAT")
    tag = f"{label[:4]}{os.getpid() % 100000}"
    subnet = f"10.{random.randrange(214, 250)}.{random.randrange(0, 256)}.{4 * random.randrange(0, 64)}"
    base = subnet.rsplit(".", 1)
    host_ip, ns_ip = f"{base[0]}.{int(base[1]) + 1}", f"{base[0]}.{int(base[1]) + 2}"
    net = veth_namespace(NatNamespace(f"gl{tag}", f"gl{tag}h", f"gl{tag}n", host_ip, ns_ip, prefix=30))
    try:
        yield net
    finally:
        net.delete()


@contextlib.contextmanager
def plane_behind_nat(net: NatNamespace, root, worker: str = "w1", *, parallel: int = 4, **options):
    """A control plane (TLS, heartbeat 0.5 s, on `net.host_ip`) with one worker `worker` inside `net`, behind its
    NAT: the relay test files' cluster. `options` go to ControlPlaneProcess (lease_ttl, args)."""
    from gpulayer.testing import ControlPlaneProcess

    plane = ControlPlaneProcess(root, host=net.host_ip, tls=True, heartbeat_interval=0.5, **options)
    try:
        plane.start(timeout=120)  # a loaded machine takes more than the default 30 s to answer /v1/health
        plane.start_worker(worker, parallel=parallel, prefix=netns_exec(net.name), timeout=120)
        yield plane
    finally:
        plane.close()
