"""GPU telemetry through the real app (issue 28 part 4): a heartbeat's `gpu_samples` stored at upkeep's
flush, `GET /v1/jobs/{id}/gpus` (Slurm's sstat), old agents, and bad samples refused whole."""

from __future__ import annotations

import pytest

from apihelpers import bearer


def sample(index=0, at=None, **values):
    return {"index": index, "at": at, "utilization_pct": 50.0, "memory_used_mb": 1024, "memory_total_mb": 81559, **values}


def stored(deps) -> list[dict]:
    return deps.store.read(
        lambda c: c.execute(
            "SELECT worker_id, gpu_index, at, utilization_pct, memory_used_mb, memory_total_mb FROM gpu_samples ORDER BY at, gpu_index"
        ).fetchall()
    )


@pytest.fixture
def running(api, client_h, worker, clock, deps):
    """A job of 2 GPUs running on a worker of 3 whose agent reported their UUIDs; (job id, task id, headers)."""
    wid, wh = worker(name="g", gpus=3)
    gpus = [{"index": i, "uuid": f"GPU-{i}", "healthy": True, "reason": None} for i in range(3)]
    assert api.simulate_post("/v1/worker/heartbeat", headers=wh, json={"tasks": [], "gpus": gpus}).status_code == 200
    job = api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["train"], "gpus": 2}).json
    task = api.simulate_post("/v1/worker/acquire", headers=wh, json={}).json["task"]
    assert api.simulate_post(f"/v1/worker/tasks/{task['task_id']}/start", headers=wh, json={}).status_code == 200
    return job["id"], task, wid, wh


def test_samples_are_stored_at_the_next_flush_and_shown_per_task(api, client_h, deps, clock, running):
    job_id, task, wid, wh = running
    clock.advance(1.0)
    body = {
        "tasks": [{"task_id": task["task_id"], "state": "running", "endpoint": None, "restarts": 0}],
        "gpu_samples": [
            sample(0, clock.now - 0.5, utilization_pct=87.5, memory_used_mb=30_000),
            sample(1, clock.now + 60, utilization_pct=12.0),  # ahead of the server: now
            sample(2, clock.now, utilization_pct=None, memory_used_mb=None),
        ],
    }
    hb = api.simulate_post("/v1/worker/heartbeat", headers=wh, json=body)
    assert hb.status_code == 200 and hb.json["cancel_task_ids"] == []
    assert stored(deps) == []  # buffered: a heartbeat that changes nothing writes nothing
    deps.scheduler.expire()  # upkeep's tick
    rows = stored(deps)
    assert [(r["gpu_index"], r["at"], r["utilization_pct"], r["memory_used_mb"]) for r in rows] == [
        (0, clock.now - 0.5, 87.5, 30_000),
        (1, clock.now, 12.0, 1024),
        (2, clock.now, None, None),
    ]
    assert {r["worker_id"] for r in rows} == {wid} and rows[0]["memory_total_mb"] == 81559
    clock.advance(3.0)
    answer = api.simulate_get(f"/v1/jobs/{job_id}/gpus", headers=client_h)
    assert answer.status_code == 200, answer.text
    (only,) = answer.json["tasks"]
    assert (only["task_id"], only["worker_id"], only["worker_name"]) == (task["task_id"], wid, "g")
    assert [g["index"] for g in only["gpus"]] == task["gpus"] == [0, 1]
    first = only["gpus"][0]
    assert first == {
        "index": 0,
        "uuid": "GPU-0",
        "at": clock.now - 3.5,
        "age_s": 3.5,
        "utilization_pct": 87.5,
        "memory_used_mb": 30_000,
        "memory_total_mb": 81559,
    }
    assert answer.json["truncated"] is False
    assert api.simulate_get(f"/v1/jobs/{job_id}/gpus", headers=client_h, params={"index": 1}).json["tasks"] == []  # no such element running
    # A newer sample wins.
    api.simulate_post("/v1/worker/heartbeat", headers=wh, json={**body, "gpu_samples": [sample(0, clock.now, utilization_pct=99.0)]})
    deps.scheduler.expire()
    gpus = api.simulate_get(f"/v1/jobs/{job_id}/gpus", headers=client_h).json["tasks"][0]["gpus"]
    assert gpus[0]["utilization_pct"] == 99.0 and gpus[0]["age_s"] == 0.0


def test_a_task_without_samples_yet_shows_its_gpus_with_none(api, client_h, deps, clock, running):
    """None yet, or only from before the task started (another task's use of the GPU)."""
    job_id, task, _, wh = running
    api.simulate_post("/v1/worker/heartbeat", headers=wh, json={"gpu_samples": [sample(0, clock.now - 10)]})
    deps.scheduler.expire()
    assert len(stored(deps)) == 1
    gpus = api.simulate_get(f"/v1/jobs/{job_id}/gpus", headers=client_h).json["tasks"][0]["gpus"]
    assert [(g["index"], g["uuid"], g["at"], g["age_s"], g["utilization_pct"]) for g in gpus] == [
        (0, "GPU-0", None, None, None),
        (1, "GPU-1", None, None, None),
    ]


def test_an_old_agent_without_the_field_keeps_working(api, deps, worker):
    _, wh = worker(name="old", gpus=1)
    hb = api.simulate_post("/v1/worker/heartbeat", headers=wh, json={"tasks": []})
    assert hb.status_code == 200 and hb.json["lease_expires_at"] is not None
    deps.scheduler.expire()
    assert stored(deps) == []


def test_a_write_path_heartbeat_buffers_its_samples_too(api, deps, worker, clock):
    _, wh = worker(name="w", gpus=1)
    gpus = [{"index": 0, "uuid": "GPU-x", "healthy": False, "reason": "Xid 79"}]  # a new fault: the write path
    hb = api.simulate_post("/v1/worker/heartbeat", headers=wh, json={"gpus": gpus, "gpu_samples": [sample(0, clock.now)]})
    assert hb.status_code == 200
    deps.scheduler.expire()
    assert len(stored(deps)) == 1


@pytest.mark.parametrize(
    "samples, field",
    [
        ("all", "gpu_samples"),
        ([sample(0, 1.0)] * 1025, "gpu_samples"),  # a list too long
        ([sample(0, 1.0, utilization_pct="high")], "gpu_samples[0].utilization_pct"),
        ([sample(0, 1.0, utilization_pct=True)], "gpu_samples[0].utilization_pct"),
        ([sample(0, 1.0, utilization_pct=100.5)], "gpu_samples[0].utilization_pct"),
        ([sample(0, 1.0, memory_used_mb="1G")], "gpu_samples[0].memory_used_mb"),
        ([sample(0, 1.0, memory_total_mb=1.5)], "gpu_samples[0].memory_total_mb"),
        ([sample(0, 1.0, memory_used_mb=-1)], "gpu_samples[0].memory_used_mb"),
        ([sample(-1, 1.0)], "gpu_samples[0].index"),
        ([sample(0, None)], "gpu_samples[0].at"),
        ([sample(0, 1.0), 7], "gpu_samples[1]"),
    ],
)
def test_bad_samples_are_400_and_nothing_is_kept(api, deps, worker, clock, samples, field):
    _, wh = worker(name="w", gpus=1)
    r = api.simulate_post("/v1/worker/heartbeat", headers=wh, json={"tasks": [], "gpu_samples": samples})
    assert r.status_code == 400, r.text
    assert r.json["error"]["code"] == "invalid_field" and r.json["error"]["message"].startswith(field)
    assert len(deps.scheduler.gpu_samples) == 0 and len(deps.scheduler.renewals) == 0  # not even its renewal
    deps.scheduler.expire()
    assert stored(deps) == []


def test_who_may_read_a_job_may_read_its_gpus(api, running, tokens):
    job_id, _, _, wh = running
    assert api.simulate_get(f"/v1/jobs/{job_id}/gpus", headers=wh).status_code == 403  # a worker token
    assert api.simulate_get(f"/v1/jobs/{job_id}/gpus").status_code == 401
    assert api.simulate_get("/v1/jobs/999999/gpus", headers=bearer(tokens["client_token"])).status_code == 404
    bad = api.simulate_get(f"/v1/jobs/{job_id}/gpus", headers=bearer(tokens["client_token"]), params={"index": "x"})
    assert bad.status_code == 400 and bad.json["error"]["code"] == "invalid_field"
