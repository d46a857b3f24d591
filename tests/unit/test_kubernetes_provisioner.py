"""The Kubernetes provisioner: provisioners.json's `kubernetes` type, and the loop's Pods against a Kubernetes API
double that speaks the real API's JSON over real HTTP (tests/kubeapi.py), through lightkube, with a real state
file and a pinned clock: the exact Pod and Secret it creates, their deletion once the worker left, and what a
refusal (401, 403 forbidden, quota exceeded, 409, 422, no answer, a bad kubeconfig) leaves: a failed request
with the API's message and its event, no Pod, no Secret, the token revoked, and no retry before retry_after_s."""
from __future__ import annotations

import base64
import copy
import json

import pytest
from typer.testing import CliRunner

from gpulayer.server.errors import ConfigError
from gpulayer.server.provisioning import config as prov_config
from gpulayer.server.provisioning import kubernetes
from gpulayer.server.provisioning import loop as prov_mod
from gpulayer.server.scheduler.core import Scheduler
from gpulayer.server.security.auth import Principal
from gpulayer.server.store.db import Store
from gpulayer.server.store.queries import rows
from helpers import add_worker, job
from kubeapi import KubeAPI

IMAGE = "registry.example.com/gpulayer:0.1.0"
GOOD = [{
    "type": "kubernetes", "name": "k8s", "control_plane_url": "http://gpulayer.gpulayer.svc:8470",
    "namespace": "gpulayer", "image": IMAGE, "max_idle_s": 120, "provision_timeout_s": 600,
    "profiles": [{
        "name": "a100", "gpus": 1, "cpus": 8, "ram_mb": 65536, "labels": {"pool": "k8s", "gpu": "a100"},
        "node_selector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "pod_labels": {"team": "vision"},
    }],
}]
POD = "gpulayer-k8s-a100-1"


def changed(path, value):
    data = copy.deepcopy(GOOD)
    target = data
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if key.isdigit() else target[key]
    if value is KeyError:
        del target[keys[-1]]
    else:
        target[keys[-1]] = value
    return data


# -- configuration ---------------------------------------------------------------

def test_kubernetes_config_parses_with_defaults():
    [p] = prov_config.parse(changed("0.namespace", KeyError))
    assert (p.type, p.namespace, p.kubeconfig, p.image) == ("kubernetes", "gpulayer", "", IMAGE)
    profile = p.profiles[0]
    assert profile.tolerations == ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},)
    [described] = prov_config.describe([p])
    assert described["type"] == "kubernetes" and described["profiles"][0]["image"] == IMAGE
    assert described["profiles"][0]["node_selector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}


@pytest.mark.parametrize("path, value, message", [
    ("0.profiles.0.sbatch", ["--partition=gpu"], "provisioners[0].profiles[0].sbatch: unknown field"),
    ("0.login", "me@login", "provisioners[0].login: unknown field"),
    ("0.profiles.0.name", "A100", "provisioners[0].profiles[0].name: must be 1-20 lowercase letters"),
    ("0.name", "k8s_prod", "provisioners[0].name: must be 1-20 lowercase letters"),
    ("0.profiles.0.tolerations", [{"key": "x", "operator": "Maybe"}],
     'provisioners[0].profiles[0].tolerations[0].operator: must be "Equal" or "Exists"'),
    ("0.profiles.0.tolerations", [{"key": "x", "effect": "NoSchedule", "seconds": 5}],
     "provisioners[0].profiles[0].tolerations[0].seconds: unknown field"),
    ("0.profiles.0.node_selector", {"bad key!": "x"}, "provisioners[0].profiles[0].node_selector.bad key!: is not a valid"),
    ("0.profiles.0.pod_labels", {"team": "a b"}, "provisioners[0].profiles[0].pod_labels.team: must be a valid"),
    ("0.profiles.0.gpus", -1, "provisioners[0].profiles[0].gpus: must be a non-negative integer"),
    ("0.image", KeyError, "provisioners[0].profiles[0].image: is required when the provisioner has no image"),
    ("0.kubeconfig", "/nonexistent/kubeconfig", "provisioners[0].kubeconfig: no such file"),
    ("0.namespace", "GPU", "provisioners[0].namespace: must be a Kubernetes name"),
    ("0.image_pull_secrets", "regcred", "provisioners[0].image_pull_secrets: must be a list of Secret names"),
    ("0.type", "nomad", 'provisioners[0].type: must be "slurm" or "kubernetes"'),
])
def test_bad_field_is_named(path, value, message):
    with pytest.raises(ConfigError) as caught:
        prov_config.parse(changed(path, value))
    assert str(caught.value).startswith(message), str(caught.value)


def test_server_start_refuses_a_bad_file_with_exit_2_naming_the_field(config):
    from gpulayer.cli.app import app
    config.layout.provisioners.write_text(json.dumps(changed("0.profiles.0.tolerations", [{"operator": "Maybe"}])))
    result = CliRunner().invoke(app, ["server", "start", "--home", str(config.layout.home), "--port", "0"])
    assert result.exit_code == 2, result.output
    assert "provisioners[0].profiles[0].tolerations[0].operator" in result.output
    config.layout.provisioners.write_text("[{")
    result = CliRunner().invoke(app, ["server", "start", "--home", str(config.layout.home), "--port", "0"])
    assert result.exit_code == 2 and "provisioners.json: not readable JSON" in result.output, result.output


# -- the loop against the API double ----------------------------------------------

@pytest.fixture
def kube():
    with KubeAPI() as api:
        yield api


@pytest.fixture
def plane(config, clock, kube, tmp_path):
    store = Store(config.layout.state)
    sched = Scheduler(store, config, clock)
    data = changed("0.kubeconfig", str(kube.kubeconfig(tmp_path / "kubeconfig")))
    deps = prov_mod.ProvisioningDeps(config=config, store=store, scheduler=sched, auth=sched.auth, clock=clock)
    loop = prov_mod.Provisioning(prov_config.parse(data), deps)
    loop.scripts.mkdir(mode=0o700, exist_ok=True)
    yield loop
    store.close()


def requests(loop):
    return loop.store.read(rows, "list_provision_requests", limit=100, before=None)


def events(loop, kind):
    return loop.store.read(lambda c: [json.loads(r["data"]) for r in c.execute(
        "SELECT data FROM events WHERE kind = ? ORDER BY seq", (kind,)).fetchall()])


def tokens(loop):
    return loop.store.read(lambda c: c.execute("SELECT * FROM tokens WHERE source = 'provisioner' ORDER BY created_at")
                           .fetchall())


def gpu_job(loop):
    loop.deps.scheduler.submit(job(labels={"pool": "k8s"}, gpus=1))


EXPECTED_POD = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": POD, "namespace": "gpulayer", "labels": {
        "team": "vision", "app.kubernetes.io/name": "gpulayer-worker", "app.kubernetes.io/managed-by": "gpulayer",
        "gpulayer.dev/provisioner": "k8s", "gpulayer.dev/profile": "a100", "gpulayer.dev/request": "1"}},
    "spec": {
        "restartPolicy": "Never", "automountServiceAccountToken": False, "shareProcessNamespace": True,
        "terminationGracePeriodSeconds": 60,
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "volumes": [{"name": "state", "emptyDir": {}}],
        "containers": [{
            "name": "worker", "image": IMAGE, "command": ["gpulayer"],
            "args": ["--url", "http://gpulayer.gpulayer.svc:8470", "worker", "start", "--name", "k8s-a100-1",
                     "--advertise-address", "$(POD_IP)", "--insecure", "--label", "gpu=a100", "--label", "pool=k8s",
                     "--cpus", "8", "--ram-mb", "65536", "--parallel", "1", "--max-idle", "120",
                     "--state-dir", "/var/lib/gpulayer-worker", "--sandbox", "none"],
            "env": [{"name": "GPULAYER_JOIN_TOKEN", "valueFrom": {"secretKeyRef": {"name": POD, "key": "token"}}},
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "HOME", "value": "/var/lib/gpulayer-worker"}],
            "resources": {"requests": {"cpu": "8", "memory": "65536Mi", "nvidia.com/gpu": "1"},
                          "limits": {"memory": "65536Mi", "nvidia.com/gpu": "1"}},
            "volumeMounts": [{"name": "state", "mountPath": "/var/lib/gpulayer-worker"}],
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        }],
    },
}


def as_sent(obj):
    """An object as the client sent it: without what the API server added."""
    out = copy.deepcopy(obj)
    for key in ("uid", "resourceVersion", "creationTimestamp"):
        out["metadata"].pop(key, None)
    out.pop("status", None)
    return out


def test_creates_the_exact_pod_and_its_token_secret_then_deletes_them_once_idle(plane, kube, clock):
    plane.tick()
    assert kube.pods() == {}                           # nothing queued: nothing asked
    gpu_job(plane)
    plane.tick()
    plane.tick()                                       # one request per profile outstanding
    [req] = requests(plane)
    assert (req["state"], req["slurm_job_id"]) == ("pending", POD)
    assert list(kube.pods()) == [POD] and as_sent(kube.pods()[POD]) == EXPECTED_POD
    secret = kube.secrets()[POD]
    assert secret["metadata"]["labels"] == EXPECTED_POD["metadata"]["labels"] and secret["type"] == "Opaque"
    token = base64.b64decode(secret["data"]["token"]).decode()
    [row] = tokens(plane)
    assert token.startswith("glj_") and plane.deps.auth.hash(token) == row["token_hash"]
    assert row["name"] == "k8s-a100-1" and json.loads(row["labels"]) == {"pool": "k8s", "gpu": "a100"}
    assert row["expires_at"] == pytest.approx(clock.now + prov_config.TOKEN_TTL_S)
    assert token not in json.dumps(requests(plane)) + json.dumps(events(plane, "provision_submitted"))
    # the Pod's worker registers with the token: attached; it runs until idle, then exits (Succeeded)
    principal = Principal(kind="join", jti=row["jti"], name=row["name"], labels=json.loads(row["labels"]))
    add_worker(plane.deps.scheduler, "k8s-a100-1", gpus=1, labels=json.loads(row["labels"]), token=principal)
    clock.advance(prov_mod.REAP_EVERY_S)
    plane.tick()                                       # attached, though the API still says Pending: left alone
    assert requests(plane)[0]["state"] == "attached" and POD in kube.pods()
    kube.set_phase(POD, "Running", podIP="10.244.1.7")
    plane.tick()
    assert POD in kube.pods()                          # a running worker is left running
    kube.set_phase(POD, "Succeeded")
    plane.tick()
    assert POD in kube.pods()                          # looked for every REAP_EVERY_S, not every round
    clock.advance(prov_mod.REAP_EVERY_S)
    plane.tick()
    assert kube.pods() == {} and kube.secrets() == {}
    assert ("DELETE", f"/api/v1/namespaces/gpulayer/pods/{POD}") in kube.requests


REFUSALS = [
    (403, "Forbidden", f'pods "{POD}" is forbidden: exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=1, '
                       "used: requests.nvidia.com/gpu=8, limited: requests.nvidia.com/gpu=8"),
    (403, "Forbidden", f'pods is forbidden: User "system:serviceaccount:gpulayer:gpulayer-server" cannot create '
                       'resource "pods" in API group "" in the namespace "gpulayer"'),
    (409, "AlreadyExists", f'pods "{POD}" already exists'),
    (422, "Invalid", f'Pod "{POD}" is invalid: spec.containers[0].resources.requests: Invalid value: "1": '
                     "must be less than or equal to nvidia.com/gpu limit"),
]


@pytest.mark.parametrize("code, reason, message", REFUSALS, ids=["quota", "rbac", "conflict", "invalid"])
def test_a_refused_pod_fails_the_request_and_leaves_nothing(plane, kube, clock, code, reason, message):
    kube.refuse("POST", "Pod", code, reason, message)
    gpu_job(plane)
    plane.tick()
    [req] = requests(plane)
    assert req["state"] == "failed"
    assert req["last_error"] == f"create Pod {POD}: {code} {reason}: {message}"
    [event] = events(plane, "provision_failed")
    assert event["error"] == req["last_error"]
    assert kube.pods() == {} and kube.secrets() == {}             # its Secret went with it
    assert tokens(plane)[0]["revoked_at"] is not None
    plane.tick()                                                  # no crash loop: it waits retry_after_s
    assert len(requests(plane)) == 1
    clock.advance(prov_config.RETRY_AFTER_S)
    plane.tick()
    assert [r["state"] for r in requests(plane)] == ["failed", "failed"]   # the refusal lasts: asked again, once


def test_unauthorized_bad_kubeconfig_and_no_answer_are_failed_requests(plane, kube, clock, tmp_path):
    plane.kube["k8s"] = kubernetes.Kube(prov_config.parse(changed(
        "0.kubeconfig", str(kube.kubeconfig(tmp_path / "stale", token="expired"))))[0])
    gpu_job(plane)
    plane.tick()
    assert requests(plane)[0]["last_error"] == f"create Secret {POD}: 401 Unauthorized: Unauthorized"
    assert kube.secrets() == {}
    bad = tmp_path / "garbage"
    bad.write_text("users: [{name: x, user: {token: sekret-token-value}}\nclusters: [oops")
    plane.kube["k8s"] = kubernetes.Kube(prov_config.parse(changed("0.kubeconfig", str(bad)))[0])
    clock.advance(prov_config.RETRY_AFTER_S)
    plane.tick()
    assert requests(plane)[0]["last_error"].startswith(f"kubeconfig {bad} is not usable: ParserError: ")
    assert "line 2" in requests(plane)[0]["last_error"] and "sekret" not in requests(plane)[0]["last_error"]
    kube.__exit__()
    plane.kube["k8s"] = kubernetes.Kube(prov_config.parse(changed(
        "0.kubeconfig", str(kube.kubeconfig(tmp_path / "gone"))))[0])
    clock.advance(prov_config.RETRY_AFTER_S)
    plane.tick()
    assert "the Kubernetes API did not answer" in requests(plane)[0]["last_error"]
    assert [r["state"] for r in requests(plane)] == ["failed"] * 3 and len(events(plane, "provision_failed")) == 3


def test_a_stuck_pod_says_why_then_times_out_and_is_deleted(plane, kube, clock):
    gpu_job(plane)
    plane.tick()
    kube.set_phase(POD, "Pending", containerStatuses=[{
        "name": "worker", "image": IMAGE, "imageID": "", "ready": False, "restartCount": 0, "started": False,
        "state": {"waiting": {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{IMAGE}"'}}}])
    plane.tick()
    [req] = requests(plane)
    assert req["state"] == "pending"
    assert req["last_error"] == f'Pod {POD}: container worker: ImagePullBackOff: Back-off pulling image "{IMAGE}"'
    clock.advance(600)
    plane.tick()
    [req] = requests(plane)
    assert req["state"] == "cancelled" and "did not attach within provision_timeout_s (600 s)" in req["last_error"]
    assert f"Pod {POD} was Pending" in req["last_error"] and kube.pods() == {} and kube.secrets() == {}


def test_a_pod_that_ends_before_attaching_fails_with_its_log(plane, kube):
    gpu_job(plane)
    plane.tick()
    kube.logs[POD] = "gpulayer worker: cannot reach http://gpulayer.gpulayer.svc:8470: connection refused\n"
    kube.set_phase(POD, "Failed")
    plane.tick()
    [req] = requests(plane)
    assert req["state"] == "failed" and req["last_error"].startswith(f"Pod {POD} ended (Failed) before its worker attached")
    assert "connection refused" in req["last_error"] and kube.pods() == {} and kube.secrets() == {}


def test_stop_deletes_the_pods_of_open_requests(plane, kube):
    gpu_job(plane)
    plane.tick()
    assert list(kube.pods()) == [POD]
    plane.stop()
    assert requests(plane)[0]["state"] == "cancelled" and kube.pods() == {} and kube.secrets() == {}


def test_a_refusal_is_a_row_of_the_explorers_workers_page(plane, kube):
    import falcon.testing
    from explorer import create_app
    kube.refuse("POST", "Pod", *REFUSALS[0])
    gpu_job(plane)
    plane.tick()
    page = falcon.testing.TestClient(create_app(str(plane.deps.config.layout.state))).simulate_get("/-/workers")
    assert page.status_code == 200
    assert "<h2>Provisioning</h2>" in page.text and "exceeded quota: gpu-quota" in page.text and "failed" in page.text


def test_a_pod_the_api_would_not_delete_is_deleted_later_and_stray_secrets_too(plane, kube, clock):
    gpu_job(plane)
    plane.tick()
    kube.refuse("DELETE", "Pod", 503, "ServiceUnavailable", "etcdserver: request timed out", times=2)
    clock.advance(600)
    plane.tick()                                       # timed out; the Pod's deletion failed (twice), and says so
    [req] = requests(plane)
    assert req["state"] == "cancelled" and "deleting Pod gpulayer-k8s-a100-1 failed" in req["last_error"]
    assert "503 ServiceUnavailable: etcdserver: request timed out" in req["last_error"] and POD in kube.pods()
    stray = kubernetes.secret_manifest(plane.provisioners["k8s"], plane.provisioners["k8s"].profiles[0], 99, "glj_x")
    plane.kube["k8s"].client.create(__import__("lightkube").codecs.from_dict(stray))
    clock.advance(prov_mod.REAP_EVERY_S)
    plane.tick()                                       # the next look deletes the Pending Pod and the stray Secret
    assert kube.pods() == {} and kube.secrets() == {}


# -- the control plane pod's init step (its `server init` run: tests/integration/test_kubernetes_smoke.py) --------

def test_init_step_keeps_a_present_secret_and_says_why_it_fails(home, kube, tmp_path, capsys):
    from gpulayer.server.kube import init
    argv = ["--home", str(home), "--namespace", "gpulayer", "--kubeconfig", str(kube.kubeconfig(tmp_path / "kc"))]
    kube.objects["Secret"][("gpulayer", "gpulayer-tokens")] = {"apiVersion": "v1", "kind": "Secret",
                                                                "metadata": {"name": "gpulayer-tokens"}, "data": {}}
    assert init.main(argv) == 0 and "nothing to do" in capsys.readouterr().out
    kube.refuse("GET", "Secret", 403, "Forbidden", 'secrets "gpulayer-tokens" is forbidden: User "system:'
                                                   'serviceaccount:gpulayer:default" cannot get resource "secrets"',
                times=1)
    assert init.main(argv) == 1
    assert "gpulayer init: get Secret gpulayer-tokens: 403 Forbidden: secrets" in capsys.readouterr().err
    bad = tmp_path / "provisioners.json"
    bad.write_text(json.dumps(changed("0.profiles.0.gpus", "one")))
    assert init.main([*argv, "--provisioners", str(bad)]) == 2
    assert "provisioners[0].profiles[0].gpus: must be a non-negative integer" in capsys.readouterr().err
    assert not (home / "provisioners.json").exists()
    good = tmp_path / "good.json"
    good.write_text(json.dumps(GOOD))
    assert init.main([*argv, "--provisioners", str(good)]) == 0
    assert json.loads((home / "provisioners.json").read_text()) == GOOD and (home / "provisioners.json").stat().st_mode & 0o077 == 0
