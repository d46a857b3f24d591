"""Slurm provisioning end to end: a real control plane, a real Slurm, a real worker started by sbatch."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from gpulayer.client import api as gl
from gpulayer.server.security.auth import init_home
from gpulayer.server.config import ControlPlaneConfig
from gpulayer.server.process import ControlPlane
from gpulayer.testing import free_port, run_cli, wait_for

# Slurm runs the batch job with --export=NONE: the prerun line is what puts `gpulayer` on its PATH,
# as `source venv/bin/activate` would on a real cluster.
BIN = str(Path(sys.executable).parent)


def wait(predicate, timeout: float, what: str, logs=None):
    """wait_for at Slurm's pace (every 0.2 s: each try may run squeue), failing with `logs()`."""
    return wait_for(predicate, timeout, what, interval=0.2, details=logs)


@pytest.fixture
def plane(tmp_path, slurm):
    """A control plane whose provisioners.json is written by the test (`plane(profiles, **settings)`)."""
    started = []

    def make(profiles, **settings):
        home = tmp_path / "home"
        tokens = init_home(home)
        port = free_port()
        spec = {"name": "local", "login": "", "control_plane_url": f"http://127.0.0.1:{port}",
                "max_idle_s": 3, "provision_timeout_s": 60, "profiles": profiles, **settings}
        (home / "provisioners.json").write_text(json.dumps([spec]))
        cp = ControlPlane(ControlPlaneConfig(home=home, port=port, heartbeat_interval_s=0.5, lease_ttl_s=5))
        cp.start()
        started.append(cp)
        return cp, gl.Client(cp.url, tokens["client_token"]), tokens

    yield make
    for cp in started:
        cp.stop()


def request_of(client, profile):
    return next((r for r in client.provisioners()["requests"] if r["profile"] == profile), None)


def slurm_state(slurm, job_id: str) -> str:
    out = slurm.run("squeue", "-h", "--states=all", "-o", "%T", "-j", job_id, check=False).stdout.strip()
    return out or "GONE"


def output_of(cp, job_id) -> str:
    path = cp.config.layout.home / "provisioner" / f"slurm-{job_id}.out"
    return path.read_text(errors="replace") if path.exists() else "(no output file)"


def test_a_label_only_slurm_offers_gets_a_worker_that_runs_the_job_and_leaves(plane, slurm):
    cp, client, tokens = plane([{"name": "cpu", "cpus": 1, "labels": {"pool": "slurm-only"},
                                 "prerun": [f"export PATH={BIN}:$PATH"]}])
    job = client.submit({"command": ["sh", "-c", "echo hello from $SLURM_JOB_ID"],
                         "labels": {"pool": "slurm-only"}})
    req = wait(lambda: (r := request_of(client, "cpu")) and r["slurm_job_id"] and r, 20,
                   "a Slurm job to be submitted", slurm.logs)
    job_id = req["slurm_job_id"]
    logs = lambda: f"{output_of(cp, job_id)}\n{slurm.logs()}"  # noqa: E731
    attached = wait(lambda: (r := request_of(client, "cpu"))["state"] == "attached" and r, 60,
                        "the worker to attach", logs)
    assert attached["worker_name"] == f"local-cpu-{attached['id']}"
    done = wait(lambda: (j := client.call("GET", f"/jobs/{job.id}"))["state"] in
                    ("succeeded", "failed", "lost") and j, 60, "the job to finish", logs)
    assert done["state"] == "succeeded", done
    lines = [line["text"] for line in client.call("GET", f"/jobs/{job.id}/logs")["lines"]]
    assert f"hello from {job_id}" in lines            # it ran inside the Slurm allocation

    worker = next(w for w in client.call("GET", "/workers", params={"all": "true"})["workers"]
                  if w["id"] == attached["worker_id"])
    assert worker["labels"] == {"pool": "slurm-only"} and worker["resources"]["cpus"] == 1   # the allocation's
    # Idle for max_idle_s (3 s), the worker leaves and its Slurm job ends.
    wait(lambda: slurm_state(slurm, job_id) in ("COMPLETED", "GONE"), 60, "the Slurm job to complete", logs)
    assert slurm_state(slurm, job_id) == "COMPLETED", logs()
    gone = next(w for w in client.call("GET", "/workers", params={"all": "true"})["workers"]
                if w["id"] == attached["worker_id"])
    assert gone["state"] == "gone"

    minted = [t for t in client.tokens() if t["name"] == attached["worker_name"]]
    assert len(minted) == 1 and minted[0]["source"] == "provisioner"
    assert minted[0]["expires_at"] - minted[0]["created_at"] == pytest.approx(24 * 3600)
    assert not list((cp.config.layout.home / "provisioner").glob("*.sh"))   # the token left with the script
    assert stat_mode(cp.config.layout.home / "provisioner") == 0o700

    cli = run_cli("--url", cp.url, "--token", tokens["client_token"], "worker", "list", timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert "Provisioning (Slurm): local [cpu]" in cli.stdout
    [line] = [ln for ln in cli.stdout.splitlines() if ln.startswith(str(attached["id"]) + " ") and "local" in ln]
    assert line.split()[3:6] == ["attached", job_id, attached["worker_name"]], cli.stdout


def stat_mode(path: Path) -> int:
    return os.stat(path).st_mode & 0o777


def test_a_job_that_cannot_attach_is_failed_or_cancelled_with_the_error_visible(plane, slurm):
    cp, client, _ = plane([
        {"name": "broken", "cpus": 1, "labels": {"pool": "broken"}, "prerun": ["false"]},
        {"name": "stuck", "cpus": 1, "labels": {"pool": "stuck"}, "prerun": ["sleep 300"]},
    ], provision_timeout_s=4)
    client.submit({"command": ["true"], "labels": {"pool": "broken"}})
    client.submit({"command": ["true"], "labels": {"pool": "stuck"}})

    # A prerun that fails ends the Slurm job: the request fails at once, with the job's own words.
    broken = wait(lambda: (r := request_of(client, "broken")) and r["state"] == "failed" and r, 30,
                      "the broken request to fail", slurm.logs)
    assert f"Slurm job {broken['slurm_job_id']} ended (FAILED) before its worker attached" in broken["last_error"]
    assert "exited with status 1: false" in broken["last_error"]

    # A job that runs but never attaches is scancel'd after provision_timeout_s.
    stuck = wait(lambda: (r := request_of(client, "stuck")) and r["state"] == "cancelled" and r, 30,
                     "the stuck request to be cancelled", slurm.logs)
    assert "did not attach within provision_timeout_s (4 s)" in stuck["last_error"]
    assert stuck["updated_at"] - stuck["created_at"] >= 4
    wait(lambda: slurm_state(slurm, stuck["slurm_job_id"]) in ("CANCELLED", "GONE"), 30,
             "scancel to take effect", slurm.logs)

    # The same is in the state file, and neither token can join any more.
    db = cp.deps.store.read(lambda c: c.execute(
        "SELECT p.state, p.last_error, t.revoked_at FROM provision_requests p JOIN tokens t ON t.jti = p.token_jti "
        "ORDER BY p.id").fetchall())
    assert sorted(r["state"] for r in db) == ["cancelled", "failed"]
    assert all(r["last_error"] and r["revoked_at"] for r in db)
    # Backing off: no new request within retry_after_s although both jobs are still queued.
    time.sleep(2)
    assert len(client.provisioners()["requests"]) == 2
