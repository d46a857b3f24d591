"""Issue 22 item 11: a worker process caps what a task's bundle and inputs unpack to, bytes and entries.

A real server, a real worker process started with low caps (GPULAYER_UNPACK_MAX_BYTES,
GPULAYER_UNPACK_MAX_FILES), a real gzip bomb: the task fails with the cap named, once (no
retry loop), nothing of it is left on the worker, and the worker goes on serving.
"""
from __future__ import annotations

import hashlib

import pytest

from bombs import tar_gz_of_zeros
from integration_cluster import Cluster

from gpulayer.testing import task_dirs

MAX_BYTES = 1024 * 1024
MAX_FILES = 200


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("caps")).start_server()
    try:
        c.start_worker("w1", env={"GPULAYER_UNPACK_MAX_BYTES": str(MAX_BYTES), "GPULAYER_UNPACK_MAX_FILES": str(MAX_FILES)})
        yield c
    finally:
        codes = c.close()
        assert set(codes.values()) <= {0}, f"unclean stops {codes}:\n{c.logs()}"


def upload(cluster: Cluster, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    put = cluster.request("PUT", f"/v1/artifacts/{digest}", data=data, headers={"Content-Type": "application/octet-stream"})
    assert put.status_code in (200, 201), put.text
    return digest


def failed_once(cluster: Cluster, spec: dict) -> str:
    """The reason of the job's one task, which must have failed once, not retried, and said why in its log."""
    job_id = cluster.submit({"retry": {"max_attempts": 3, "retry_on": ["worker_lost"]}, **spec})
    job = cluster.wait_job(job_id, timeout=60)
    assert job["state"] == "failed" and len(job["tasks"]) == 1, job
    reason = job["tasks"][0]["reason"]
    assert f"setup failed: {reason}" in cluster.log_text(job_id)
    return reason


def assert_worker_clean_and_serving(cluster: Cluster) -> None:
    tasks = cluster.state_dir("w1") / "tasks"
    assert task_dirs(cluster.state_dir("w1")) == []  # nothing of the task is left
    assert all(path.name.startswith("box-") and not any(path.iterdir()) for path in tasks.iterdir())  # spares
    job = cluster.wait_job(cluster.submit({"command": ["sh", "-c", "echo still here"]}), timeout=60)
    assert job["state"] == "succeeded", job
    cluster.workers["w1"].check_alive()


def test_a_gzip_bomb_fails_its_task_with_the_cap_named(capped):
    bomb = tar_gz_of_zeros([("model.bin", 256 * 1024 * 1024)])  # 256 MiB of zeros, about 250 KiB on the wire
    assert len(bomb) < 400_000
    reason = failed_once(capped, {"command": ["true"], "source": upload(capped, bomb)})
    assert f"more than {MAX_BYTES} bytes" in reason and "GPULAYER_UNPACK_MAX_BYTES" in reason, reason
    assert_worker_clean_and_serving(capped)


def test_a_file_count_bomb_fails_its_task_with_the_cap_named(capped):
    bomb = tar_gz_of_zeros([(f"d{i // 100}/f{i}", 0) for i in range(MAX_FILES + 1)])
    reason = failed_once(capped, {"command": ["true"], "source": upload(capped, bomb)})
    assert f"more than {MAX_FILES} entries" in reason and "GPULAYER_UNPACK_MAX_FILES" in reason, reason
    assert_worker_clean_and_serving(capped)


def test_inputs_count_against_the_same_cap(capped):
    bundle = upload(capped, tar_gz_of_zeros([("small.bin", MAX_BYTES // 2)]))
    data = b"\1" * (MAX_BYTES // 2)
    reason = failed_once(capped, {"command": ["true"], "source": bundle, "inputs": {"data.bin": upload(capped, data)}})
    assert "GPULAYER_UNPACK_MAX_BYTES" in reason, reason
    assert_worker_clean_and_serving(capped)
    within = capped.wait_job(capped.submit({"command": ["sh", "-c", "test -s small.bin"], "source": bundle}), timeout=60)
    assert within["state"] == "succeeded", within
