"""Checkpoints (issue 27 part 2): recorded only once every file is stored, restored in the next
attempt's Assignment, per element, kept to the newest K, readable by the job's readers, fenced by the
worker's tasks, and kept by the artifact sweep."""

from __future__ import annotations

import hashlib

import pytest

from gpulayer.server.scheduler import retention


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def put(api, headers, data: bytes) -> dict:
    r = api.simulate_put(f"/v1/artifacts/{digest_of(data)}", headers={**headers, "Content-Type": "application/octet-stream"}, body=data)
    assert r.status_code == 201, r.text
    return {"digest": digest_of(data), "size": len(data)}


def acquired(api, wh) -> dict:
    r = api.simulate_post("/v1/worker/acquire", headers=wh, json={})
    assert r.status_code == 200, r.text
    return r.json["task"]


def manifest(api, wh, files: dict[str, bytes]) -> list[dict]:
    return [{"path": path, **put(api, wh, data), "mode": 0o640} for path, data in files.items()]


def submit(api, client_h, **spec) -> int:
    r = api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["train"], **spec})
    assert r.status_code == 201, r.text
    return r.json["id"]


def test_a_failed_attempt_leaves_its_checkpoint_to_the_next(api, worker, client_h):
    _, wh = worker()
    job_id = submit(api, client_h, retry={"max_attempts": 3, "retry_on": ["failed"]})
    task = acquired(api, wh)
    assert task["checkpoint"] is None
    files = manifest(api, wh, {"model.pt": b"weights-1", "opt/state.pt": b"optimizer"})
    r = api.simulate_post(
        f"/v1/worker/tasks/{task['task_id']}/finish", headers=wh, json={"exit_code": 1, "outcome": "failed", "checkpoint": {"files": files}}
    )
    assert r.status_code == 200 and r.json["accepted"], r.text
    again = acquired(api, wh)
    assert again["attempt"] == 2 and again["checkpoint"]["attempt"] == 1
    assert sorted(f["path"] for f in again["checkpoint"]["files"]) == ["model.pt", "opt/state.pt"]
    assert {f["mode"] for f in again["checkpoint"]["files"]} == {0o640}
    listed = api.simulate_get(f"/v1/jobs/{job_id}/checkpoints", headers=client_h).json
    assert [(c["attempt"], c["kind"], c["files"], c["bytes"]) for c in listed["checkpoints"]] == [
        (1, "final", 2, len(b"weights-1") + len(b"optimizer"))
    ]
    assert listed["next"] is None
    one = api.simulate_get(f"/v1/jobs/{job_id}/checkpoints/{listed['checkpoints'][0]['id']}", headers=client_h).json
    assert [f["path"] for f in one["manifest"]] == ["model.pt", "opt/state.pt"]
    # The client (a reader of the job) may download the files; the worker may, while it holds the task.
    for headers in (client_h, wh):
        r = api.simulate_get(f"/v1/artifacts/{files[0]['digest']}", headers=headers)
        assert r.status_code == 200 and r.content == b"weights-1"


def test_a_partial_upload_never_replaces_the_last_complete_checkpoint(api, worker, client_h):
    _, wh = worker()
    job_id = submit(api, client_h, retry={"max_attempts": 3, "retry_on": ["failed"]})
    task = acquired(api, wh)
    complete = manifest(api, wh, {"step.txt": b"100"})
    r = api.simulate_post("/v1/worker/checkpoint", headers=wh, json={"task_id": task["task_id"], "attempt": 1, "files": complete})
    assert r.status_code == 200, r.text
    assert r.json["files"] == 1 and r.json["attempt"] == 1
    # A later checkpoint whose second file never arrived (the agent killed mid-way): 409, nothing written.
    partial = [*manifest(api, wh, {"step.txt": b"200"}), {"path": "big.bin", "digest": digest_of(b"never sent"), "size": 10, "mode": 0o644}]
    r = api.simulate_post("/v1/worker/checkpoint", headers=wh, json={"task_id": task["task_id"], "attempt": 1, "files": partial})
    assert r.status_code == 409 and r.json["error"]["code"] == "checkpoint_incomplete", r.text
    assert "big.bin" in r.json["error"]["message"]
    # The same with the finish: the finish counts, the checkpoint is left out (an event says so).
    r = api.simulate_post(
        f"/v1/worker/tasks/{task['task_id']}/finish", headers=wh, json={"exit_code": 1, "outcome": "failed", "checkpoint": {"files": partial}}
    )
    assert r.status_code == 200 and r.json["accepted"]
    kinds = [e["kind"] for e in api.simulate_get(f"/v1/jobs/{job_id}/events", headers=client_h).json["events"]]
    assert "checkpoint_incomplete" in kinds
    again = acquired(api, wh)
    assert again["checkpoint"]["files"] == [{**complete[0], "path": "step.txt"}]


def test_checkpoints_are_per_element_and_the_newest_k_are_kept(api, worker, client_h):
    _, wh = worker(slots=2)
    job_id = submit(api, client_h, array="0-1")
    first = acquired(api, wh)
    for step in range(5):
        files = manifest(api, wh, {"step.txt": str(step).encode()})
        r = api.simulate_post("/v1/worker/checkpoint", headers=wh, json={"task_id": first["task_id"], "files": files})
        assert r.status_code == 200, r.text
    listed = api.simulate_get(f"/v1/jobs/{job_id}/checkpoints", headers=client_h, params={"index": first["index"]}).json["checkpoints"]
    assert len(listed) == 3  # the default --checkpoint-keep
    assert all(c["index"] == first["index"] for c in listed)
    other = 1 - first["index"]
    assert api.simulate_get(f"/v1/jobs/{job_id}/checkpoints", headers=client_h, params={"index": other}).json["checkpoints"] == []
    assert [f["digest"] for c in listed for f in api.simulate_get(f"/v1/jobs/{job_id}/checkpoints/{c['id']}", headers=client_h).json["manifest"]] == [
        digest_of(str(step).encode()) for step in (2, 3, 4)
    ]


def test_a_worker_records_only_for_a_task_it_holds(api, worker, client_h):
    _, wh = worker()
    _, other = worker()
    submit(api, client_h)
    task = acquired(api, wh)
    files = manifest(api, wh, {"a": b"a"})
    for headers, body, status in [
        (other, {"task_id": task["task_id"], "files": files}, 409),  # not its task
        (wh, {"task_id": task["task_id"], "attempt": 2, "files": files}, 409),  # another attempt
        (wh, {"task_id": 10**9, "files": files}, 409),  # no such task
        (client_h, {"task_id": task["task_id"], "files": files}, 403),  # not a worker
    ]:
        r = api.simulate_post("/v1/worker/checkpoint", headers=headers, json=body)
        assert r.status_code == status, (body, r.text)


@pytest.mark.parametrize(
    "files",
    [
        None,
        "x",
        [{"path": "/abs", "digest": digest_of(b"a"), "size": 1}],
        [{"path": "../up", "digest": digest_of(b"a"), "size": 1}],
        [{"path": "a", "digest": "md5:1", "size": 1}],
        [{"path": "a", "digest": digest_of(b"a"), "size": -1}],
        [{"path": "a", "digest": digest_of(b"a"), "size": 1, "mode": 0o10000}],
        [{"path": "a", "digest": digest_of(b"a"), "size": 1, "owner": "root"}],
        [{"path": "a", "digest": digest_of(b"a"), "size": 1}, {"path": "./a", "digest": digest_of(b"a"), "size": 1}],
    ],
)
def test_a_bad_manifest_is_400_and_changes_nothing(api, worker, client_h, files):
    _, wh = worker()
    job_id = submit(api, client_h)
    task = acquired(api, wh)
    r = api.simulate_post("/v1/worker/checkpoint", headers=wh, json={"task_id": task["task_id"], "files": files})
    assert r.status_code == 400 and r.json["error"]["code"] == "invalid_field", r.text
    r = api.simulate_post(
        f"/v1/worker/tasks/{task['task_id']}/finish", headers=wh, json={"exit_code": 1, "outcome": "failed", "checkpoint": {"files": files}}
    )
    assert r.status_code == 400, r.text
    assert api.simulate_get(f"/v1/jobs/{job_id}/checkpoints", headers=client_h).json["checkpoints"] == []


def test_a_job_without_checkpoints_answers_an_empty_list_and_404_for_one(api, client_h):
    job_id = submit(api, client_h)
    assert api.simulate_get(f"/v1/jobs/{job_id}/checkpoints", headers=client_h).json == {"checkpoints": [], "next": None}
    r = api.simulate_get(f"/v1/jobs/{job_id}/checkpoints/1", headers=client_h)
    assert r.status_code == 404 and r.json["error"]["code"] == "no_checkpoint"


def test_the_sweep_keeps_what_a_live_job_checkpoint_names(api, deps, worker, client_h, clock):
    _, wh = worker()
    submit(api, client_h)
    task = acquired(api, wh)
    files = manifest(api, wh, {"kept": b"kept bytes"})
    assert api.simulate_post("/v1/worker/checkpoint", headers=wh, json={"task_id": task["task_id"], "files": files}).status_code == 200
    stray = put(api, wh, b"named by nothing")
    found = retention.sweep(deps.store, deps.artifacts, now=clock() + 10**7, retention_s=60, dry_run=True)
    assert stray["digest"] in found["removed"] and files[0]["digest"] not in found["removed"]
