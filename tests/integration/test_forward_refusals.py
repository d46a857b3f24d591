"""`gpulayer port-forward` to a job with nothing running refuses at once, as `exec` does (issue 36 item 25),
against a real server and workers: it listened anyway, every connection failing, and exited 0 on Ctrl-C.
Now it exits 1 before listening, naming the job and its state, for a held job, a finished one and an
element that is not running."""
from __future__ import annotations

import pytest

from gpulayer.testing import free_port, wait_for

pytestmark = pytest.mark.timeout(180)


def _refused(cluster, job_id: int, *extra: str) -> str:
    port = free_port()
    done = cluster.cli("port-forward", str(job_id), f"{port}:8888", *extra, timeout=30)
    assert done.returncode == 1 and "Forwarding from" not in done.stdout, done
    assert f"job {job_id} has no" in done.stderr and "task " + str(job_id) not in done.stderr, done
    return done.stderr


def test_port_forward_to_a_held_job_is_refused_as_exec_is(cluster):
    job_id = cluster.submit({"command": ["sleep", "60"], "hold": True})
    try:
        told = _refused(cluster, job_id)
        assert "(job waiting" in told or "(job queued" in told, told
        execd = cluster.cli("exec", str(job_id), "--", "true", timeout=30)
        assert execd.returncode != 0 and f"job {job_id} has no task running" in execd.stderr, execd
    finally:
        cluster.request("POST", f"/v1/jobs/{job_id}/cancel", json={})


def test_port_forward_to_a_finished_job_or_an_element_not_running_is_refused(cluster):
    done = cluster.submit({"command": ["true"]})
    cluster.wait_job(done, timeout=60)
    assert "(job succeeded, tasks: succeeded)" in _refused(cluster, done)
    array = cluster.submit({"command": ["sh", "-c", '[ "$GPULAYER_ARRAY_INDEX" = 0 ] && sleep 60 || true'],
                            "array": "0-1"})
    try:
        wait_for(lambda: any(t["state"] == "running" for t in cluster.job(array)["tasks"]), 60, "element 0 to run")
        wait_for(lambda: cluster.get_json(f"/v1/jobs/{array}?index=1")["tasks"][0]["state"] == "succeeded", 60,
                 "element 1 to end")
        assert f"job {array} has no element 1 running" in _refused(cluster, array, "--index", "1")
    finally:
        cluster.request("POST", f"/v1/jobs/{array}/cancel", json={})
