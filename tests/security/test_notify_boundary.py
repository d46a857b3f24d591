"""Notifications at the boundary (issue 36): a real control plane process (`server start`), real HTTP
receivers on loopback (tests/receivers.py).

- A webhook delivers what its owner may read at the time of the try, not what it could when it was added:
  a demoted admin's fleet-wide webhook, a manager's project webhook and a member's job webhook go quiet
  for what their owner lost, and a removed owner's webhook is disabled with a `webhook_disabled` event.
- An IPv6 webhook address that carries an IPv4 one (6to4, Teredo, NAT64, IPv4-mapped or -compatible) is
  judged by that IPv4 address: 2002:a9fe:a9fe:: is 169.254.169.254, refused without --allow-private-webhooks.
- One owner's slow receivers (a byte every second, never done) hold neither the delivery threads nor
  another owner's deliveries: each try has a total deadline, and each owner a cap on tries at once.
"""

from __future__ import annotations

import ipaddress
import json
import sqlite3
import time

import pytest

from gpulayer.server.notify.send import embedded_ipv4
from gpulayer.testing import ControlPlaneProcess, wait_for
from receivers import Receiver, Trickle

EVENTS = ["job.submitted", "job.cancelled"]


def add_hook(cp: ControlPlaneProcess, token: str | None, url: str, **scope) -> int:
    answer = cp.request("POST", "/v1/webhooks", token=token, json={"url": url, "events": EVENTS, **scope})
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


def submit(cp: ControlPlaneProcess, token: str, project: str | None = "p1") -> int:
    answer = cp.request("POST", "/v1/jobs", token=token, json={"command": ["true"], **({"project": project} if project else {})})
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


def told(receiver: Receiver) -> set[tuple[str, int]]:
    return {(json.loads(body)["type"], json.loads(body)["data"]["job_id"]) for _, body in receiver.got}


def state(cp: ControlPlaneProcess, sql: str, params=()) -> list[tuple]:
    with sqlite3.connect(f"file:{cp.state}?mode=ro", uri=True) as conn:
        return conn.execute(sql, params).fetchall()


def handled_up_to_now(cp: ControlPlaneProcess, hooks: list[int]) -> None:
    """Wait until the outbox has looked at every event so far for each of `hooks` (its cursor past them)."""
    newest = state(cp, "SELECT max(seq) FROM events")[0][0]

    def done():
        marks = ",".join("?" * len(hooks))
        return all(c >= newest for (c,) in state(cp, f"SELECT cursor FROM webhooks WHERE id IN ({marks})", hooks))

    wait_for(done, 30, "the outbox past every event")


@pytest.fixture
def plane(tmp_path):
    cp = ControlPlaneProcess(tmp_path / "cp", args=["--allow-private-webhooks", "--webhook-retry-base", "0.2"])
    try:
        cp.start()
        yield cp
    finally:
        cp.close()


def test_a_webhook_delivers_only_what_its_owner_may_read_now(plane):
    cp = plane
    admin = cp.client()
    admin.add_project("p1", visibility="project")
    tokens = {
        "boss": admin.add_user("boss", admin=True)["token"],
        "mgr": admin.add_user("mgr", projects=[("p1", "manager")])["token"],
        "mem": admin.add_user("mem", projects=[("p1", "member")])["token"],
        "owner": admin.add_user("owner", projects=[("p1", "member")])["token"],
    }
    receivers = {name: Receiver() for name in ("boss", "mgr", "mem", "control")}
    try:
        watched = submit(cp, tokens["owner"])
        hooks = {
            "boss": add_hook(cp, tokens["boss"], receivers["boss"].url),  # an admin's: everything
            "mgr": add_hook(cp, tokens["mgr"], receivers["mgr"].url, project="p1"),
            "mem": add_hook(cp, tokens["mem"], receivers["mem"].url, job=watched),  # p1 is project-visible
            "control": add_hook(cp, None, receivers["control"].url),  # the first admin's: it keeps its rights
        }
        before = submit(cp, tokens["owner"])
        wait_for(lambda: all(("job.submitted", before) in told(receivers[n]) for n in ("boss", "mgr")), 30, "deliveries while allowed")
        wait_for(lambda: ("job.submitted", watched) in told(receivers["mem"]), 30, "the job webhook's first delivery")

        admin.set_user("boss", admin=False)  # demoted: its own jobs only
        admin.remove_member("p1", "mgr")
        admin.remove_member("p1", "mem")
        after = submit(cp, tokens["owner"])
        own = submit(cp, tokens["boss"], project=None)
        assert cp.request("POST", f"/v1/jobs/{watched}/cancel", json={}).status_code == 200
        expected = {("job.submitted", after), ("job.cancelled", watched), ("job.submitted", own)}
        wait_for(lambda: expected <= told(receivers["control"]), 30, "the control's deliveries")
        wait_for(lambda: ("job.submitted", own) in told(receivers["boss"]), 30, "the demoted admin's own job, which it may still read")
        handled_up_to_now(cp, list(hooks.values()))
        assert ("job.submitted", after) not in told(receivers["boss"])  # a demoted admin: not every user's jobs
        assert ("job.submitted", after) not in told(receivers["mgr"])  # out of the project: not its jobs
        assert ("job.cancelled", watched) not in told(receivers["mem"]) and ("job.cancelled", watched) not in told(receivers["mgr"])

        admin.remove_user("boss")
        gone = submit(cp, tokens["owner"])
        wait_for(lambda: ("job.submitted", gone) in told(receivers["control"]), 30, "the control's delivery")
        wait_for(lambda: state(cp, "SELECT disabled FROM webhooks WHERE id = ?", (hooks["boss"],))[0][0], 30, "the removed owner's webhook disabled")
        shown = cp.get_json(f"/v1/webhooks/{hooks['boss']}")
        assert shown["disabled"] == "its owner boss was removed", shown
        disabled = [json.loads(d) for (d,) in state(cp, "SELECT data FROM events WHERE kind = 'webhook_disabled'")]
        assert disabled == [{"webhook_id": hooks["boss"], "reason": "its owner boss was removed"}]
        assert ("job.submitted", gone) not in told(receivers["boss"])
        listed = {w["id"]: w for w in json.loads(cp.cli("webhook", "list", "--json").stdout)}
        assert listed[hooks["boss"]]["disabled"] and listed[hooks["control"]]["disabled"] is None
    finally:
        for receiver in receivers.values():
            receiver.close()


def test_one_owners_trickling_receivers_delay_no_one_elses_deliveries(tmp_path):
    """A plain user's 16 webhooks at a receiver that sends a byte a second and never finishes; the first
    admin's webhook at a plain receiver gets its 15 events promptly (4 delivery threads; before: each of them
    held until the stuck-process watchdog, 60 s, killed every try in flight)."""
    slow, fast = Trickle(every_s=1.0), Receiver()
    cp = ControlPlaneProcess(tmp_path / "cp", args=["--allow-private-webhooks", "--webhook-concurrency", "4"])
    try:
        cp.start()
        token = cp.client().add_user("slowpoke")["token"]
        slow_hooks = [add_hook(cp, token, slow.url) for _ in range(16)]
        add_hook(cp, None, fast.url)
        submit(cp, token, project=None)  # 16 tries at the trickling receiver
        wait_for(lambda: slow.connections >= 2, 30, "the trickling receiver's first tries")
        started = time.monotonic()
        jobs = [submit(cp, cp.client_token, project=None) for _ in range(15)]
        wait_for(lambda: {("job.submitted", j) for j in jobs} <= told(fast), 25, "the admin's 15 events, while the trickles go on")
        took = time.monotonic() - started
        # Each trickling try ends at its total deadline (10 s), not when the watchdog kills the process.
        marks = ",".join("?" * len(slow_hooks))
        query = f"SELECT count(*) FROM webhook_deliveries WHERE webhook_id IN ({marks}) AND last_error LIKE 'timed out%'"
        wait_for(lambda: state(cp, query, slow_hooks)[0][0], 30, "a trickling try ended by its deadline")
        assert "webhook_courier_stuck" not in cp.logs(200_000), took
    finally:
        cp.close()
        slow.close()
        fast.close()


def teredo(server: str, client: str) -> str:
    """A Teredo address (2001::/32) for `server` and `client` (stored inverted, RFC 4380)."""
    n = (0x20010000 << 96) | (int(ipaddress.IPv4Address(server)) << 64) | (~int(ipaddress.IPv4Address(client)) & 0xFFFFFFFF)
    return str(ipaddress.IPv6Address(n))


EMBEDDED_PRIVATE = [
    "2002:a9fe:a9fe::",  # 6to4 of 169.254.169.254, the cloud's metadata address
    "2002:7f00:1::",  # 6to4 of 127.0.0.1
    "2002:a00:1:1234::1",  # 6to4 of 10.0.0.1
    teredo("93.184.215.14", "10.0.0.1"),  # a public Teredo server, a private client
    teredo("169.254.169.254", "93.184.215.14"),
    "64:ff9b::a9fe:a9fe",  # NAT64 (RFC 6052's well-known prefix)
    "64:ff9b::7f00:1",
    "64:ff9b:1:a9fe:a9:fe00::",  # local-use NAT64 (RFC 8215) with a /48 network: 169.254.169.254
    "64:ff9b:1::a9fe:a9fe",  # the same with a /96 network
    "::ffff:169.254.169.254",  # IPv4-mapped
    "::a9fe:a9fe",  # IPv4-compatible
]


@pytest.fixture(scope="module")
def strict(tmp_path_factory):
    """A control plane without --allow-private-webhooks."""
    cp = ControlPlaneProcess(tmp_path_factory.mktemp("strict"))
    try:
        cp.start()
        yield cp
    finally:
        cp.close()


@pytest.mark.parametrize("address", EMBEDDED_PRIVATE)
def test_an_ipv6_webhook_address_is_judged_by_the_ipv4_it_embeds(strict, address):
    answer = strict.request("POST", "/v1/webhooks", json={"url": f"http://[{address}]/hook", "events": ["job.failed"]})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    carried = ", ".join(map(str, embedded_ipv4(ipaddress.IPv6Address(address))))
    assert error["code"] == "private_target" and error["message"].startswith("url: "), error
    assert f"(which stands for {carried})" in error["message"], error
    assert strict.get_json("/v1/webhooks")["webhooks"] == []


@pytest.mark.parametrize("address", ["2002:5db8:d70e::", "64:ff9b::5db8:d70e", teredo("93.184.215.14", "93.184.215.15")])
def test_an_ipv6_address_that_embeds_a_public_ipv4_is_accepted(strict, address):
    added = strict.request("POST", "/v1/webhooks", json={"url": f"http://[{address}]/hook", "events": ["job.failed"]})
    assert added.status_code == 201, added.text
    assert strict.request("DELETE", f"/v1/webhooks/{added.json()['id']}").status_code in (200, 204)
