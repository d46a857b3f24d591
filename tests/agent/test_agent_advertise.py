"""The address a worker advertises: `--advertise-address`, else the local address of its connection to the
control plane (never loopback unless the control plane is on loopback); `gpulayer up`'s own worker advertises
the address its join line prints."""
from __future__ import annotations

import json
import subprocess
from urllib.parse import urlsplit

import pytest

from agent.link.addresses import local_address_towards
from gpulayer.server.security.certs import local_addresses
from gpulayer.testing import CLI, clean_env, free_port, run_cli, stop_process, wait_for

pytestmark = pytest.mark.timeout(120)


def test_the_local_address_towards_the_control_plane():
    assert local_address_towards("http://127.0.0.1:8470") == "127.0.0.1"
    assert local_address_towards("https://[::1]:8470") in ("::1", None)  # None: no IPv6 here
    assert local_address_towards("https://no-such-host.invalid:8470") is None
    ours = [a for a in local_addresses() if ":" not in a]
    if ours:  # the route to one of our own addresses leaves from that address, not from loopback
        assert local_address_towards(f"https://{ours[0]}:8470") == ours[0]


def test_a_worker_without_advertise_address_sends_its_connections_address(plane, start_worker):
    start_worker()
    wait_for_registration = wait_for(lambda: plane.registrations, 15, "the registration")
    assert wait_for_registration[0]["advertise_address"] == "127.0.0.1"


def test_an_advertise_address_given_wins(plane, start_worker):
    start_worker(advertise_address="10.1.2.3")
    assert wait_for(lambda: plane.registrations, 15, "the registration")[0]["advertise_address"] == "10.1.2.3"


def test_up_on_all_addresses_advertises_its_join_address_not_loopback(tmp_path):
    if not [a for a in local_addresses() if ":" not in a]:
        pytest.skip("this machine has no non-loopback IPv4 address")
    home, port = tmp_path / "home", free_port("0.0.0.0")
    up = subprocess.Popen([*CLI, "up", "--host", "0.0.0.0", "--port", str(port), "--parallel", "1"],
                          env=clean_env(GPULAYER_HOME=str(home), PYTHONUNBUFFERED="1"),
                          stdout=open(tmp_path / "up.log", "w"), stderr=subprocess.STDOUT)
    try:
        def joined():
            assert up.poll() is None, (tmp_path / "up.log").read_text()
            lines = [ln.split() for ln in (tmp_path / "up.log").read_text().splitlines() if "gpulayer join " in ln]
            return lines[0][lines[0].index("join") + 1] if lines else None
        join_host = urlsplit(wait_for(joined, 60, "`up` to print its join line")).hostname
        assert join_host not in ("127.0.0.1", "localhost")

        def listed():
            done = run_cli("worker", "list", "--json", env={"GPULAYER_HOME": str(home)})
            return [w for w in json.loads(done.stdout or "[]") if w["state"] == "online"] if done.returncode == 0 else []
        workers = wait_for(listed, 60, "up's worker to be online")
        assert [w["advertise_address"] for w in workers] == [join_host]
    finally:
        assert stop_process(up) == 0, (tmp_path / "up.log").read_text()
