"""POST /v1/workers/{worker}/cordon|drain|uncordon, .../gpus/{index}/reset, and the heartbeat's `gpus`."""
from __future__ import annotations

import pytest

from apihelpers import bearer


def test_cordon_drain_uncordon_by_name_and_id(api, client_h, worker):
    wid, wh = worker(name="n1")
    r = api.simulate_post("/v1/workers/n1/cordon", headers=client_h, json={"reason": "  fan  "})
    assert r.status_code == 200, r.text
    assert r.json["cordon"] == "cordoned" and r.json["cordon_reason"] == "fan" and r.json["id"] == wid
    listed = api.simulate_get("/v1/workers", headers=client_h).json["workers"][0]
    assert listed["cordon"] == "cordoned" and listed["cordon_reason"] == "fan" and listed["gpus"] == []
    r = api.simulate_post(f"/v1/workers/{wid}/drain", headers=client_h, json={"reason": "reboot", "timeout_s": 60})
    assert r.json["cordon"] == "drained" and r.json["drain_deadline"] is None  # nothing ran there
    r = api.simulate_post(f"/v1/workers/{wid}/uncordon", headers=client_h)
    assert r.status_code == 200 and r.json["cordon"] is None


@pytest.mark.parametrize("path, body, status, code", [
    ("/v1/workers/n1/cordon", {}, 400, "invalid_field"),
    ("/v1/workers/n1/cordon", {"reason": " "}, 400, "invalid_field"),
    ("/v1/workers/n1/cordon", {"reason": 3}, 400, "invalid_field"),
    ("/v1/workers/n1/cordon", {"reason": "x", "timeout_s": 3}, 400, "invalid_field"),
    ("/v1/workers/n1/drain", {"reason": "x", "timeout_s": -1}, 400, "invalid_field"),
    ("/v1/workers/n1/drain", {"reason": "x", "timeout_s": "soon"}, 400, "invalid_field"),
    ("/v1/workers/nobody/cordon", {"reason": "x"}, 404, "not_found"),
    ("/v1/workers/nobody/uncordon", None, 404, "not_found"),
    ("/v1/workers/n1/gpus/0/reset", None, 404, "not_found"),
])
def test_bad_requests_are_4xx_and_change_nothing(api, client_h, worker, path, body, status, code):
    worker(name="n1")
    r = api.simulate_post(path, headers=client_h, json=body)
    assert r.status_code == status, r.text
    assert r.json["error"]["code"] == code
    assert api.simulate_get("/v1/workers", headers=client_h).json["workers"][0]["cordon"] is None


def test_only_a_client_token_may_cordon(api, worker, tokens):
    _, wh = worker(name="n1")
    assert api.simulate_post("/v1/workers/n1/cordon", headers=wh, json={"reason": "x"}).status_code == 403
    join = bearer(tokens["join_token"])
    assert api.simulate_post("/v1/workers/n1/cordon", headers=join, json={"reason": "x"}).status_code == 403
    assert api.simulate_post("/v1/workers/n1/cordon", json={"reason": "x"}).status_code == 401


def test_heartbeat_gpus_and_reset(api, client_h, worker):
    wid, wh = worker(name="g", gpus=2)
    gpus = [{"index": 0, "uuid": "GPU-a", "healthy": True, "reason": None},
            {"index": 1, "uuid": "GPU-b", "healthy": False, "reason": "Xid 79"}]
    hb = api.simulate_post("/v1/worker/heartbeat", headers=wh, json={"tasks": [], "gpus": gpus})
    assert hb.status_code == 200 and "reset_gpus" not in hb.json
    listed = api.simulate_get("/v1/workers", headers=client_h).json["workers"][0]
    assert listed["free"]["gpus"] == 1 and listed["gpus"][1]["reason"] == "Xid 79"
    r = api.simulate_post("/v1/workers/g/gpus/1/reset", headers=client_h)
    assert r.status_code == 200 and all(g["healthy"] for g in r.json["gpus"])
    hb = api.simulate_post("/v1/worker/heartbeat", headers=wh, json={"tasks": [], "gpus": gpus})
    assert hb.json["reset_gpus"] == [1]


@pytest.mark.parametrize("gpus", [
    "all", [{"index": -1}], [{"index": 0, "healthy": "no"}], [{"index": 0}, {"index": 0}],
    [{"index": 0, "uuid": 5}], [3],
])
def test_bad_gpus_field_is_400(api, worker, gpus):
    _, wh = worker(name="g", gpus=2)
    r = api.simulate_post("/v1/worker/heartbeat", headers=wh, json={"tasks": [], "gpus": gpus})
    assert r.status_code == 400 and r.json["error"]["code"] == "invalid_field"


def test_metrics_show_cordons_and_bad_gpus(api, client_h, worker):
    _, wh = worker(name="g", gpus=2)
    api.simulate_post("/v1/worker/heartbeat", headers=wh,
                      json={"gpus": [{"index": 0, "uuid": "GPU-a", "healthy": False, "reason": "ECC"}]})
    api.simulate_post("/v1/workers/g/drain", headers=client_h, json={"reason": "swap GPU 0"})
    text = api.simulate_get("/metrics", headers=client_h).text
    assert 'gpulayer_workers_cordoned{state="drained"} 1.0' in text
    assert 'gpulayer_workers_cordoned{state="cordoned"} 0.0' in text
    assert "gpulayer_gpus_unhealthy 1.0" in text
