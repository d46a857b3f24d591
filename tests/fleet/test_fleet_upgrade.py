"""A worker on another protocol: 426 naming both versions, listed needs_upgrade until it registers
with protocol 1 or the server restarts; the agent exits saying to upgrade."""
from __future__ import annotations

import sys


# The agent with its protocol constant patched before its transport reads it.
AGENT_V2 = ("import sys, agent; agent.PROTOCOL = 2; from agent.__main__ import main; sys.exit(main())")


def states_of(fleet, name: str) -> list[str]:
    return [w["state"] for w in fleet.get("/v1/workers").json()["workers"] if w["name"] == name]


def test_protocol_mismatch_needs_upgrade_until_registered_or_restarted(own_fleet):
    fleet = own_fleet
    refused = fleet.register(fleet.join_token, name="old-box", protocol="2")
    assert refused.status_code == 426
    assert refused.headers["X-GpuLayer-Protocol"] == "1"
    body = refused.json()
    assert body["error"]["code"] == "protocol_mismatch"
    assert body["protocol"] == 1 and body["client_protocol"] == "2"
    assert "protocol 1" in body["error"]["message"] and "2" in body["error"]["message"]
    assert states_of(fleet, "old-box") == ["needs_upgrade"]
    listed = fleet.cli("worker", "list")
    assert listed.returncode == 0 and "needs_upgrade" in listed.stdout and "old-box" in listed.stdout

    # Registering again with protocol 1 clears it.
    assert fleet.register(fleet.join_token, name="old-box").status_code == 200
    assert states_of(fleet, "old-box") == ["online"]

    # A real agent speaking protocol 2: refused, exits with a message saying to upgrade, listed.
    proc = fleet.spawn_worker("v2-agent", argv=[sys.executable, "-c", AGENT_V2, "--name", "v2-agent",
                                                "--state-dir", str(fleet.root / "v2-agent")])
    assert proc.wait(20) == 2
    log = proc.log()
    assert "upgrade" in log and "protocol 1" in log and "speaks 2" in log, log
    assert states_of(fleet, "v2-agent") == ["needs_upgrade"]

    # A server restart clears the listing.
    fleet.restart_server()
    assert states_of(fleet, "v2-agent") == []
    assert fleet.sql("SELECT count(*) FROM workers WHERE state = 'needs_upgrade'") == [(0,)]
