"""GET /v1/provisioners: the configuration and the requests, for a client token only."""
from __future__ import annotations

from gpulayer.server.provisioning import config as provisioners_json
from gpulayer.server.provisioning import loop as provisioner


def test_provisioners_listing(api, deps, client_h, worker, clock):
    assert api.simulate_get("/v1/provisioners", headers=client_h).json == {"provisioners": [], "requests": [], "next": None}
    deps.provisioners = provisioners_json.parse([{"name": "hpc", "control_plane_url": "http://cp:8470",
                                            "profiles": [{"name": "cpu", "cpus": 2, "prerun": ["export X=secret"]}]}])
    [p] = deps.provisioners
    profile = p.profiles[0]
    deps.scheduler.provision_open(p.name, profile.name, lambda rid: provisioner.worker_name(p, profile, rid),
                                  profile.labels, token_hash="h", jti="j1", expires_at=clock() + 3600, now=clock())
    deps.scheduler.provision_end(1, "failed", "sbatch failed: no partition", clock())
    body = api.simulate_get("/v1/provisioners", headers=client_h, params={"limit": 5}).json
    assert body["provisioners"][0]["profiles"][0]["name"] == "cpu" and "secret" not in str(body)
    [req] = body["requests"]
    assert (req["profile"], req["state"], req["last_error"]) == ("cpu", "failed", "sbatch failed: no partition")
    _, wh = worker()
    assert api.simulate_get("/v1/provisioners", headers=wh).status_code == 403
    assert api.simulate_get("/v1/provisioners").status_code == 401
