

def test_health(api):
    r = api.simulate_get("/v1/health")
    assert r.json == {"ok": True, "protocol": 1}
    assert r.headers["X-GpuLayer-Protocol"] == "1"


def test_cycle(api, client_h, worker):
    wid, wh = worker()
    r = api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["echo", "x"]})
    assert r.status_code == 201, r.text
    job_id = r.json["id"]
    a = api.simulate_post("/v1/worker/acquire", headers=wh, json={}).json["task"]
    assert a["job_id"] == job_id
    assert api.simulate_post(f"/v1/worker/tasks/{a['task_id']}/start", headers=wh, json={"pid": 1}).status_code == 200
    r = api.simulate_post(f"/v1/worker/tasks/{a['task_id']}/logs", headers=wh,
                          json={"lines": [{"n": 0, "stream": "stdout", "text": "x", "at": 1}]})
    assert r.json["accepted"] == 1
    r = api.simulate_post(f"/v1/worker/tasks/{a['task_id']}/finish", headers=wh,
                          json={"exit_code": 0, "outcome": "succeeded"})
    assert r.json == {"accepted": True}
    assert api.simulate_get(f"/v1/jobs/{job_id}", headers=client_h).json["state"] == "succeeded"
    assert api.simulate_get(f"/v1/jobs/{job_id}/logs", headers=client_h).json["lines"][0]["text"] == "x"


def test_errors(api, client_h, worker):
    assert api.simulate_get("/v1/jobs").status_code == 401
    r = api.simulate_post("/v1/jobs", headers=client_h, body="{nope")
    assert r.status_code == 400 and r.json["error"]["code"] == "invalid_json"
    r = api.simulate_post("/v1/jobs", headers={**client_h, "X-GpuLayer-Protocol": "2"}, json={"command": ["x"]})
    assert r.status_code == 426 and r.json["protocol"] == 1
    wid, wh = worker()
    assert api.simulate_get("/v1/jobs", headers=wh).status_code == 403
    assert api.simulate_get("/v1/nope", headers=client_h).status_code == 404
    assert api.simulate_get("/v1/nope", headers=client_h).json["error"]["code"]
    r = api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["x"], "bogus": 1})
    assert r.status_code == 400 and "bogus" in r.json["error"]["message"]
    assert api.simulate_get("/v1/openapi.json", headers=client_h).json["openapi"] == "3.1.0"


def test_finish_carries_last_lines(api, client_h, worker):
    wid, wh = worker()
    job_id = api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["x"]}).json["id"]
    task = api.simulate_post("/v1/worker/acquire", headers=wh, json={}).json["task"]
    api.simulate_post(f"/v1/worker/tasks/{task['task_id']}/start", headers=wh, json={})
    line = {"n": 0, "stream": "system", "text": "finished", "at": 1.0}
    r = api.simulate_post(f"/v1/worker/tasks/{task['task_id']}/finish", headers=wh,
                          json={"exit_code": 0, "outcome": "succeeded", "lines": [line]})
    assert r.json == {"accepted": True}
    texts = [entry["text"] for entry in api.simulate_get(f"/v1/jobs/{job_id}/logs", headers=client_h).json["lines"]]
    assert texts == ["finished"]
    bad = api.simulate_post(f"/v1/worker/tasks/{task['task_id']}/finish", headers=wh,
                            json={"exit_code": 0, "outcome": "succeeded", "lines": [{"n": "x"}]})
    assert bad.status_code == 400


def test_finish_with_next_hands_out_the_next_task(api, client_h, worker):
    wid, wh = worker()
    first = api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["a"]}).json["id"]
    second = api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["b"]}).json["id"]
    task = api.simulate_post("/v1/worker/acquire", headers=wh, json={}).json["task"]
    assert task["job_id"] == first
    api.simulate_post(f"/v1/worker/tasks/{task['task_id']}/start", headers=wh, json={})
    r = api.simulate_post(f"/v1/worker/tasks/{task['task_id']}/finish", headers=wh,
                          json={"exit_code": 0, "outcome": "succeeded", "next": True})
    assert r.json["accepted"] is True and r.json["task"]["job_id"] == second
    # the hand-out is an ordinary assignment: acquire repeats it until start
    assert api.simulate_post("/v1/worker/acquire", headers=wh, json={}).json["task"]["job_id"] == second
    bad = api.simulate_post(f"/v1/worker/tasks/{r.json['task']['task_id']}/finish", headers=wh,
                            json={"exit_code": 0, "outcome": "succeeded", "next": "yes"})
    assert bad.status_code == 400
