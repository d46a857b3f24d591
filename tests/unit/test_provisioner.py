"""Slurm provisioning: provisioners.json validation, the demand query, and the loop's
decisions against a real state file with a pinned clock. Slurm itself is the edge
here (a fake that records calls); tests/slurm runs the real one."""
from __future__ import annotations

import copy
import json
import os
import stat

import pytest

from gpulayer.server.provisioning import config as prov_config
from gpulayer.server.provisioning import loop as prov_mod
from gpulayer.server.scheduler.core import Scheduler
from gpulayer.server.store.db import Store
from gpulayer.server.security.auth import Principal
from gpulayer.server.errors import ConfigError
from gpulayer.server.provisioning.slurm import SlurmError
from gpulayer.server.store.queries import row, rows
from helpers import add_worker, job

GOOD = [{
    "name": "hpc", "login": "", "control_plane_url": "http://10.0.0.5:8470/",
    "max_idle_s": 30, "provision_timeout_s": 60,
    "profiles": [
        {"name": "cpu", "cpus": 2, "labels": {"pool": "slurm"}},
        {"name": "gpu", "cpus": 8, "gpus": 1, "ram_mb": 64000, "labels": {"pool": "slurm", "gpu": "h100"},
         "sbatch": ["--partition=gpu"], "prerun": ["source /opt/venv/bin/activate"]},
    ],
}]


def with_change(path, value):
    data = copy.deepcopy(GOOD)
    target = data
    keys = path.replace("[", ".").replace("]", "").split(".")
    for key in keys[:-1]:
        target = target[int(key)] if key.isdigit() else target[key]
    last = keys[-1]
    if value is KeyError:
        del target[int(last) if last.isdigit() else last]
    else:
        target[int(last) if last.isdigit() else last] = value
    return data


# -- configuration ---------------------------------------------------------------

def test_good_config_parses_with_defaults():
    [p] = prov_config.parse(GOOD)
    assert p.control_plane_url == "http://10.0.0.5:8470" and p.retry_after_s == prov_config.RETRY_AFTER_S
    assert p.profiles[0].gpus == 0 and p.profiles[0].parallel == 1 and p.profiles[1].sbatch == ("--partition=gpu",)
    assert prov_config.parse({"provisioners": GOOD})[0].name == "hpc"


@pytest.mark.parametrize("path, value, message", [
    ("0.profiles.1.gpus", -1, "provisioners[0].profiles[1].gpus: must be a non-negative integer"),
    ("0.profiles.1.gpus", 1.5, "provisioners[0].profiles[1].gpus: must be a non-negative integer"),
    ("0.profiles.1.gpus", True, "provisioners[0].profiles[1].gpus: must be a non-negative integer"),
    ("0.profiles.0.cpus", "2", "provisioners[0].profiles[0].cpus: must be a non-negative number"),
    ("0.profiles.0.ram", 1, "provisioners[0].profiles[0].ram: unknown field"),
    ("0.profiles.0.labels", ["gpu"], "provisioners[0].profiles[0].labels: must be an object"),
    ("0.profiles.0.prerun", "module load cuda", "provisioners[0].profiles[0].prerun: must be a list of strings"),
    ("0.profiles.0.prerun", ["a\nb"], "provisioners[0].profiles[0].prerun[0]: must be one line"),
    ("0.profiles.0.parallel", 0, "provisioners[0].profiles[0].parallel: must be a positive integer"),
    ("0.profiles.1.name", "cpu", "provisioners[0].profiles[1].name: duplicate profile name 'cpu'"),
    ("0.profiles.0.name", "a b", "provisioners[0].profiles[0].name: must be 1-64 letters"),
    ("0.profiles", [], "provisioners[0].profiles: must be a non-empty list"),
    ("0.profiles", KeyError, "provisioners[0].profiles: is required"),
    ("0.control_plane_url", KeyError, "provisioners[0].control_plane_url: is required"),
    ("0.control_plane_url", "cp:8470", "provisioners[0].control_plane_url: must be the http:// or https:// URL"),
    # issue 22 item 8: a pattern refuses a trailing newline, and a URL anything after its host but a path
    ("0.control_plane_url", "https://cp:8470\n", "provisioners[0].control_plane_url: must be the http://"),
    ("0.control_plane_url", "https://cp:8470 --x", "provisioners[0].control_plane_url: must be the http://"),
    ("0.name", "hpc\n", "provisioners[0].name: must be 1-64 letters"),
    ("0.profiles.0.name", "cpu\n", "provisioners[0].profiles[0].name: must be 1-64 letters"),
    ("0.max_idle_s", -5, "provisioners[0].max_idle_s: must be a non-negative number of seconds"),
    ("0.provision_timeout_s", "900", "provisioners[0].provision_timeout_s: must be a non-negative number"),
    ("0.type", "pbs", 'provisioners[0].type: must be "slurm" or "kubernetes"'),
    ("0.ssh_key", "/nonexistent/key", "provisioners[0].ssh_key: is only used with login"),
    ("0.login", "-oProxyCommand=x", "provisioners[0].login: must be user@host"),
])
def test_bad_field_is_named(path, value, message):
    with pytest.raises(ConfigError) as caught:
        prov_config.parse(with_change(path, value))
    assert str(caught.value).startswith(message), str(caught.value)


def test_top_level_and_duplicates():
    with pytest.raises(ConfigError, match=r"^provisioners: must be a list"):
        prov_config.parse({"name": "x"})
    with pytest.raises(ConfigError, match=r"provisioners\[1\]\.name: duplicate provisioner name 'hpc'"):
        prov_config.parse(GOOD + GOOD)
    data = with_change("0.login", "me@login")
    data[0]["ssh_key"] = "/nonexistent/key"
    with pytest.raises(ConfigError, match=r"provisioners\[0\]\.ssh_key: no such file"):
        prov_config.parse(data)


def test_load_names_the_file(tmp_path):
    assert prov_config.load(tmp_path / "missing.json") == []
    path = tmp_path / "provisioners.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="provisioners.json: not readable JSON"):
        prov_config.load(path)
    path.write_text(json.dumps(with_change("0.profiles.1.gpus", -1)))
    with pytest.raises(ConfigError, match=r"provisioners.json: provisioners\[0\]\.profiles\[1\]\.gpus"):
        prov_config.load(path)


def test_server_refuses_a_bad_file(config):
    from gpulayer.server.process import ControlPlane
    config.layout.provisioners.write_text(json.dumps(with_change("0.max_idle_s", "soon")))
    with pytest.raises(ConfigError, match=r"max_idle_s: must be a non-negative number"):
        ControlPlane(config)


def test_batch_script_and_sbatch_args(tmp_path):
    [p] = prov_config.parse(GOOD)
    gpu = p.profiles[1]
    script = prov_mod.batch_script(p, gpu, 7, "glj_secret")
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash" and "set -e" in lines
    assert lines.index("source /opt/venv/bin/activate") < lines.index("export GPULAYER_JOIN_TOKEN=glj_secret")
    assert lines[-1].startswith("exec gpulayer --url http://10.0.0.5:8470 worker start --name hpc-gpu-7 "
                                "--label gpu=h100 --label pool=slurm --parallel 1 --max-idle 30 --state-dir")
    args = prov_mod.sbatch_args(p, gpu, tmp_path)
    assert "--cpus-per-task=8" in args and "--mem=64000M" in args and "--gres=gpu:1" in args
    assert args[-1] == "--partition=gpu" and "--export=NONE" in args


# -- the loop ----------------------------------------------------------------------

class FakeSlurm:
    """Records submissions; jobs are in `jobs` {id: state} until the test changes them."""

    def __init__(self):
        self.jobs, self.scripts, self.cancelled, self.fail_submit = {}, [], [], None

    def submit(self, script, path, args):
        if self.fail_submit:
            raise SlurmError(self.fail_submit)
        job_id = str(100 + len(self.scripts))
        self.scripts.append((script, path, args, oct(os.stat(path).st_mode & 0o777)))
        self.jobs[job_id] = "PENDING"
        return job_id

    def states(self, job_ids):
        return {j: self.jobs[j] for j in job_ids if j in self.jobs}

    def cancel(self, job_id):
        self.cancelled.append(job_id)
        self.jobs[job_id] = "CANCELLED"

    def tail(self, path, lines=20):
        return "prerun: venv not found"


@pytest.fixture
def plane(config, clock):
    store = Store(config.layout.state)
    sched = Scheduler(store, config, clock)
    [p] = prov_config.parse(GOOD)
    deps = prov_mod.ProvisioningDeps(config=config, store=store, scheduler=sched, auth=sched.auth, clock=clock)
    loop = prov_mod.Provisioning([p], deps)
    loop.slurm["hpc"] = FakeSlurm()
    loop.scripts.mkdir(mode=0o700, exist_ok=True)
    yield loop
    store.close()


def requests(loop):
    return loop.store.read(rows, "list_provision_requests", limit=100, before=None)


def register_with(loop, req_id, name):
    """A worker registers with the request's token (as the Slurm job's agent would)."""
    jti = loop.store.read(lambda c: c.execute("SELECT token_jti FROM provision_requests WHERE id = ?",
                                              (req_id,)).fetchall()[0]["token_jti"])
    token = loop.store.read(lambda c: c.execute("SELECT * FROM tokens WHERE jti = ?", (jti,)).fetchall()[0])
    principal = Principal(kind="join", jti=jti, name=token["name"], labels=json.loads(token["labels"]))
    return add_worker(loop.deps.scheduler, name, cpus=2, labels=json.loads(token["labels"]), token=principal)


def test_demand_submits_once_per_profile_and_attaches(plane, clock):
    sched = plane.deps.scheduler
    plane.tick()
    assert requests(plane) == []                       # nothing queued: nothing asked
    sched.submit(job(labels={"pool": "slurm"}, cpus=1))
    sched.submit(job(labels={"pool": "slurm"}, cpus=1))
    plane.tick()
    plane.tick()
    [req] = requests(plane)                            # one request for the cheapest fitting profile...
    assert (req["profile"], req["state"], req["slurm_job_id"]) == ("cpu", "pending", "100")
    fake = plane.slurm["hpc"]
    assert len(fake.scripts) == 1                      # not one for the gpu profile, which fits too
    script, path, args, mode = fake.scripts[0]
    assert mode == "0o700" and path.startswith(str(plane.scripts))
    token = plane.store.read(lambda c: c.execute("SELECT * FROM tokens WHERE source = 'provisioner' ORDER BY "
                                                 "created_at LIMIT 1").fetchall()[0])
    assert token["expires_at"] == pytest.approx(clock.now + prov_config.TOKEN_TTL_S)
    assert json.loads(token["labels"]) == {"pool": "slurm"} and token["name"] == "hpc-cpu-1"
    register_with(plane, 1, "hpc-cpu-1")
    plane.tick()
    first = [r for r in requests(plane) if r["id"] == 1][0]
    assert first["state"] == "attached" and first["worker_name"] == "hpc-cpu-1"
    assert not os.path.exists(path)                    # the script held the token


def test_a_job_no_worker_fits_asks_nothing(plane):
    sched = plane.deps.scheduler
    sched.submit(job(labels={"pool": "elsewhere"}))
    sched.submit(job(labels={"pool": "slurm"}, gpus=2))
    plane.tick()
    assert requests(plane) == []


def test_an_online_worker_with_room_means_no_request(plane):
    sched = plane.deps.scheduler
    w = add_worker(sched, "local", labels={"pool": "slurm"}, cpus=2)
    sched.submit(job(labels={"pool": "slurm"}, cpus=1))
    demand = dict(cpus=2, gpus=0, memory_mb=0, labels='{"pool": "slurm"}', covered="[]")
    assert plane.store.read(row, "provision_demand", **demand)["tasks"] == 0
    assert sched.acquire(w) is not None                          # the worker is busy now...
    sched.submit(job(labels={"pool": "slurm"}, cpus=1))          # ...so this one needs another
    assert plane.store.read(row, "provision_demand", **demand)["tasks"] == 1


def test_timeout_cancels_and_revokes_then_waits_before_asking_again(plane, clock):
    plane.deps.scheduler.submit(job(labels={"pool": "slurm", "gpu": "h100"}, gpus=1))
    plane.tick()
    [req] = requests(plane)
    assert req["profile"] == "gpu"
    clock.advance(59)
    plane.tick()
    assert requests(plane)[0]["state"] == "pending"
    clock.advance(1)
    plane.tick()
    [req] = requests(plane)
    assert req["state"] == "cancelled" and "did not attach within provision_timeout_s (60 s)" in req["last_error"]
    assert plane.slurm["hpc"].cancelled == ["100"]
    tokens = plane.store.read(lambda c: c.execute("SELECT revoked_at FROM tokens WHERE source = 'provisioner'")
                              .fetchall())
    assert tokens[0]["revoked_at"] is not None
    clock.advance(prov_config.RETRY_AFTER_S - 1)
    plane.tick()
    assert len(requests(plane)) == 1
    clock.advance(1)
    plane.tick()
    assert len(requests(plane)) == 2


def test_job_that_ends_without_attaching_fails_with_its_output(plane):
    plane.deps.scheduler.submit(job(labels={"pool": "slurm", "gpu": "h100"}, gpus=1))
    plane.tick()
    plane.slurm["hpc"].jobs["100"] = "FAILED"
    plane.tick()
    [req] = requests(plane)
    assert req["state"] == "failed"
    assert "Slurm job 100 ended (FAILED) before its worker attached" in req["last_error"]
    assert "prerun: venv not found" in req["last_error"]


def test_sbatch_refusal_is_a_failed_request(plane):
    plane.slurm["hpc"].fail_submit = "sbatch failed: invalid partition specified: gpu"
    plane.deps.scheduler.submit(job(labels={"pool": "slurm", "gpu": "h100"}, gpus=1))
    plane.tick()
    [req] = requests(plane)
    assert req["state"] == "failed" and "invalid partition" in req["last_error"]


def test_disabled_timeout_keeps_waiting_and_stop_cancels(plane, clock):
    plane.provisioners["hpc"] = p = prov_config.parse(with_change("0.provision_timeout_s", 0))[0]
    plane.deps.scheduler.submit(job(labels={"pool": "slurm", "gpu": "h100"}, gpus=1))
    plane.tick()
    clock.advance(10 * 86400)
    plane.tick()
    assert requests(plane)[0]["state"] == "pending"
    plane.stop()
    [req] = requests(plane)
    assert req["state"] == "cancelled" and req["last_error"] == "the control plane shut down"
    assert plane.slurm["hpc"].cancelled == ["100"] and p.provision_timeout_s == 0


def test_scripts_dir_is_private(plane):
    plane.start()
    plane.stop()
    assert stat.S_IMODE(os.stat(plane.scripts).st_mode) == 0o700
