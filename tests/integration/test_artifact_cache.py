"""The artifact cache cannot be squatted nor changed behind the worker's back (issue 36, item 8): real server and
worker processes, a real other local user (`nobody`).

The default cache is `gpulayer-artifacts` in the temp folder. A local user who made that folder first swapped a
cached source bundle, and the next job (another user's, with its secrets) ran that script. Now a worker whose
cache folder is someone else's stops at start with what to do; and a cached bundle changed in place after it
was verified is hashed again before it is used, and fetched again.
"""
from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest
from test_sandbox import module_cluster
from unprivileged import as_nobody, shared_temp_folder

from gpulayer.testing import wait_for

pytestmark = pytest.mark.timeout(180)

SECRET = "the-next-users-api-token-5e1f"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from module_cluster(tmp_path_factory, "cache")


@pytest.fixture
def shared_tmp():
    with shared_temp_folder() as folder:
        yield folder


def bundle(script: str) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        member = tarfile.TarInfo("run.sh")
        member.size, member.mode = len(script), 0o755
        tar.addfile(member, io.BytesIO(script.encode()))
    return out.getvalue()


BENIGN = bundle("echo benign run\n")
EVIL = bundle('echo "EVIL run, token=$API_TOKEN"\n')


def put(cluster, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    assert cluster.request("PUT", f"/v1/artifacts/{digest}", data=data).status_code in (200, 201)
    return digest


def run_bundle(cluster, pool: str, digest: str) -> str:
    """Run the bundle's run.sh on worker ``pool`` with the next user's secret in its environment: its log."""
    job_id = cluster.submit({"command": ["sh", "run.sh"], "source": digest, "labels": {"pool": pool},
                             "env": {"API_TOKEN": SECRET}})
    done = cluster.wait_job(job_id, timeout=60)
    text = cluster.log_text(job_id)
    assert done["state"] == "succeeded", text
    return text


def test_a_cache_folder_another_user_made_first_stops_the_worker(cluster, shared_tmp):
    squatted = os.path.join(shared_tmp, "gpulayer-artifacts")
    subprocess.run([*as_nobody(), "mkdir", "-m", "777", squatted], check=True)  # before the worker's first start
    worker = cluster.start_worker("squatted", labels={"pool": "squatted"}, wait=False,
                                  env={"TMPDIR": shared_tmp, "GPULAYER_ARTIFACT_CACHE": ""})  # the default cache
    state = wait_for(lambda: "exited" if not worker.running else "online" if cluster.online_worker("squatted") else None,
                     60, "the worker to stop or to come online", details=worker.log)
    if state == "online":  # the code before issue 36: the attack goes through
        digest = put(cluster, BENIGN)
        first = run_bundle(cluster, "squatted", digest)
        cached = os.path.join(squatted, digest.split(":")[1])
        subprocess.run([*as_nobody(), "sh", "-c", f"rm -f {cached} && cat > {cached}"], input=EVIL, check=True)
        second = run_bundle(cluster, "squatted", digest)
        worker.stop()
        pytest.fail(f"the worker used a cache folder `nobody` made, and ran what `nobody` put there:\n{first}\n{second}")
    assert worker.wait(10) == 2, worker.log()
    assert (f"gpulayer worker: the artifact cache {squatted} belongs to nobody (uid 65534), not to this agent's user "
            "root (uid 0)") in worker.log(), worker.log()
    assert "set GPULAYER_ARTIFACT_CACHE to a folder of the agent's own" in worker.log()
    assert os.listdir(squatted) == []


def test_a_cached_bundle_changed_after_it_was_verified_is_fetched_again(cluster):
    worker = cluster.start_worker("tampered", labels={"pool": "tampered"})
    cache = Path(worker.env["GPULAYER_ARTIFACT_CACHE"])
    digest = put(cluster, BENIGN)
    assert "benign run" in run_bundle(cluster, "tampered", digest)
    cached = cache / digest.split(":")[1]
    assert (cached.stat().st_mode & 0o777) == 0o444
    os.chmod(cached, 0o644)
    cached.write_bytes(EVIL)  # in place, as anything running as the agent's user could
    text = run_bundle(cluster, "tampered", digest)
    assert "benign run" in text and "EVIL" not in text and SECRET not in text, text
    assert cached.read_bytes() == BENIGN
    wait_for(lambda: "artifact_cache_mismatch" in worker.log(), 10, "the mismatch in the worker's log")
    assert (cache.stat().st_mode & 0o7777) == 0o700 and cache.stat().st_uid == os.geteuid()
