"""The Kubernetes smoke test (docs/kubernetes.md, "What the tests cover"): deploy/kubernetes/'s containers run as
processes, each pod in its own network namespace, and a service started on the worker pod is requested from the
server pod; then, with the provisioner overlay, the Pod the server asks the API for runs a job and is deleted.

No cluster runs here (no container runtime works, and no package ships an API server), so this does by hand what
the kubelet would, from the manifests themselves: the "server pod" and the "worker pod" are network namespaces on
one bridge, each with its pod IP; the Service's name (`gpulayer`) resolves to the server pod's address in the
worker pod (/etc/netns/NS/hosts, which `ip netns exec` mounts over /etc/hosts); each container's `command`,
`args` (with `$(VAR)` expanded), `env` (`secretKeyRef` read from the API, `fieldRef` from the pod) and volumes
(a directory each, in place of its mountPath) are used as written; the init container runs first, against the
Kubernetes API double (tests/kubeapi.py) on the host's bridge address in place of the API server, with a
kubeconfig in place of the in-cluster service account; the readiness and liveness probes are requested from the
host as the kubelet does; the device plugin's part is played by the fake NVML with one GPU. The one change to
the manifests: the server gets `--heartbeat-interval 0.5`, to keep the test short.
"""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from kubeapi import KubeAPI
from netns import BridgedNamespaces, netns_exec, netns_unavailable

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes" / "base"
FAKE_NVML = ROOT / "tests" / "agent" / "fake_nvml"
NAMESPACE = "gpulayer"

pytestmark = pytest.mark.netns


def manifest(name: str, kind: str) -> dict:
    [doc] = [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d and d["kind"] == kind]
    return doc


def wait_for(what: str, check, timeout: float = 30.0, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


class Pod:
    """One pod: its network namespace and IP, its volumes (directories), its containers' processes."""

    def __init__(self, spec: dict, ns: str, ip: str, root: Path, api: KubeAPI, kubeconfig: Path):
        self.spec, self.ns, self.ip, self.api, self.kubeconfig = spec, ns, ip, api, kubeconfig
        self.volumes = {v["name"]: root / v["name"] for v in spec.get("volumes", [])}
        self.root = root
        self.procs: list[subprocess.Popen] = []

    def volume(self, name: str) -> Path:
        path = self.volumes.setdefault(name, self.root / name)   # a volumeClaimTemplate: its PersistentVolume
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _value(self, env: dict) -> str:
        if "value" in env:
            return env["value"]
        source = env["valueFrom"]
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            secret = self.api.secrets(NAMESPACE)[ref["name"]]
            return base64.b64decode(secret["data"][ref["key"]]).decode()
        field = source["fieldRef"]["fieldPath"]
        return {"metadata.namespace": NAMESPACE, "status.podIP": self.ip, "spec.nodeName": f"node-{self.ns}"}[field]

    def argv_env(self, container: dict, extra_env: dict) -> tuple[list[str], dict]:
        """The container's command line and environment as the kubelet makes them, volumes mapped to directories."""
        mounts = {m["mountPath"]: str(self.volume(m["name"])) for m in container.get("volumeMounts", [])}

        def mapped(text: str) -> str:   # once, by the longest mountPath that the text starts with
            for path in sorted(mounts, key=len, reverse=True):
                if text == path or text.startswith(path + "/"):
                    return mounts[path] + text[len(path):]
            return text

        env = {e["name"]: mapped(self._value(e)) for e in container.get("env", [])}
        expand = lambda s: re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), s)  # noqa: E731
        argv = [mapped(expand(a)) for a in container.get("command", []) + container.get("args", [])]
        program = {"gpulayer": [sys.executable, "-m", "gpulayer.cli"], "python3": [sys.executable]}[argv[0]]
        return [*program, *argv[1:]], {**os.environ, **env, **extra_env}

    def start(self, container: dict, extra_env: dict, args: tuple = ()) -> subprocess.Popen:
        argv, env = self.argv_env(container, extra_env)
        log = open(self.root / f"{container['name']}.log", "wb")
        proc = subprocess.Popen([*netns_exec(self.ns), *argv, *args], env=env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def run(self, container: dict, extra_env: dict) -> subprocess.CompletedProcess:
        argv, env = self.argv_env(container, extra_env)
        return subprocess.run([*netns_exec(self.ns), *argv], env=env, capture_output=True, text=True, timeout=60)

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def probe(pod: Pod, container: dict, kind: str) -> bool:
    """The container's `kind` probe, from the host (as the kubelet): an httpGet on the pod IP and its named port."""
    get = container[kind]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    port = ports.get(get["port"], get["port"])
    try:
        with urllib.request.urlopen(f"http://{pod.ip}:{port}{get['path']}", timeout=2) as answer:
            return 200 <= answer.status < 400
    except OSError:
        return False


def cli(server: Pod, tokens: dict) -> list[str]:
    """`gpulayer` with the URL and the client token, from the host (a user outside, through the Ingress)."""
    return [sys.executable, "-m", "gpulayer.cli", "--url", f"http://{server.ip}:8470", "--token", tokens["client"]]


def get_json(server: Pod, tokens: dict, path: str):
    """GET `path` of the control plane with the client token, from the host (cheaper to poll than the CLI)."""
    request = urllib.request.Request(f"http://{server.ip}:8470{path}", headers={"Authorization": f"Bearer {tokens['client']}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def start_server(server: Pod, init_args: tuple = ()) -> tuple[subprocess.Popen, dict]:
    """The init step (with `init_args` added, as an overlay adds them), then the server container once ready;
    (its process, the tokens of the Secret)."""
    [init] = server.spec["initContainers"]
    init = {**init, "args": [*init["args"], *init_args]}
    done = server.run(init, {"KUBECONFIG": str(server.kubeconfig)})   # in place of the in-cluster service account
    assert done.returncode == 0, done.stdout + done.stderr
    secret = server.api.secrets(NAMESPACE)["gpulayer-tokens"]
    tokens = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    [container] = server.spec["containers"]
    serving = server.start(container, {}, ("--heartbeat-interval", "0.5"))
    wait_for("the readiness probe", lambda: probe(server, container, "readinessProbe") or serving.poll() is not None)
    assert serving.poll() is None, server.log("server")
    return serving, tokens


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)
    net = BridgedNamespaces(3)   # the server pod, a worker pod of the DaemonSet, a Pod of the provisioner
    try:
        net.create()
    except (subprocess.CalledProcessError, OSError) as exc:
        net.delete()
        pytest.skip(f"cannot make network namespaces here: {getattr(exc, 'stderr', None) or exc}")
    root = tmp_path_factory.mktemp("k8s")
    hosts = []
    server_ip, worker_ip, _ = net.addresses
    for ns in net.names:  # the cluster DNS: the Service's names resolve to the server pod
        etc = Path("/etc/netns") / ns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n{server_ip} gpulayer gpulayer.gpulayer.svc "
                                   "gpulayer.gpulayer.svc.cluster.local\n")
        hosts.append(etc)
    api = KubeAPI(host=net.host).__enter__()
    pods: list[Pod] = []
    try:
        kubeconfig = api.kubeconfig(root / "kubeconfig", NAMESPACE)
        statefulset = manifest("server.yaml", "StatefulSet")
        daemonset = manifest("workers.yaml", "DaemonSet")
        server = Pod(statefulset["spec"]["template"]["spec"], net.names[0], server_ip, root / "server", api, kubeconfig)
        worker = Pod(daemonset["spec"]["template"]["spec"], net.names[1], worker_ip, root / "worker", api, kubeconfig)
        pods += [server, worker]
        nvml = root / "nvml.json"
        nvml.write_text(json.dumps({"gpus": [{"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-0", "mig": None}]}))
        device_plugin = {"PYTHONPATH": f"{FAKE_NVML}:{os.environ.get('PYTHONPATH', ROOT)}",
                         "FAKE_NVML_STATE": str(nvml), "NVIDIA_VISIBLE_DEVICES": "0"}
        yield {"net": net, "api": api, "server": server, "worker": worker, "statefulset": statefulset,
               "daemonset": daemonset, "root": root, "pods": pods, "device_plugin": device_plugin}
    finally:
        for pod in pods:
            pod.stop()
        api.__exit__()
        net.delete()
        for etc in hosts:
            shutil.rmtree(etc, ignore_errors=True)


def test_server_pod_and_worker_pod_serve_a_gpu_service_requested_from_the_server_pod(cluster):
    api, server, worker = cluster["api"], cluster["server"], cluster["worker"]
    spec = server.spec
    [init] = spec["initContainers"]
    [container] = spec["containers"]
    in_cluster = {"KUBECONFIG": str(server.kubeconfig)}  # in place of the in-cluster service account

    # 1. the init step: `server init` on the empty volume, the tokens into the Secret the workers read
    done = server.run(init, in_cluster)
    assert done.returncode == 0, done.stdout + done.stderr
    secret = api.secrets(NAMESPACE)["gpulayer-tokens"]
    tokens = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert tokens["client"].startswith("glc_") and tokens["join"].startswith("glj_")
    again = server.run(init, in_cluster)            # a restarted pod keeps its volume and its tokens
    assert again.returncode == 0 and "nothing to do" in again.stdout
    assert api.secrets(NAMESPACE)["gpulayer-tokens"]["data"] == secret["data"]

    # 2. the server container; the kubelet's probes on the pod IP
    serving = server.start(container, {}, ("--heartbeat-interval", "0.5"))
    wait_for("the readiness probe", lambda: probe(server, container, "readinessProbe") or serving.poll() is not None)
    assert serving.poll() is None, server.log("server")
    assert probe(server, container, "livenessProbe")

    # 3. the worker DaemonSet's container in the worker pod: the join token from the Secret, the Service by name,
    #    one GPU from the device plugin (here the fake NVML)
    [wcontainer] = worker.spec["containers"]
    agent = worker.start(wcontainer, cluster["device_plugin"])
    client = cli(server, tokens)

    def online():
        assert agent.poll() is None, worker.log("worker")
        return next((w for w in get_json(server, tokens, "/v1/workers")["workers"] if w["state"] == "online"), None)
    listed = wait_for("the worker pod's worker to be online", online)
    assert listed["name"] == f"node-{worker.ns}" and listed["resources"]["gpus"] == 1
    assert listed["advertise_address"] == worker.ip

    # 4. `gpulayer submit --service --gpus 1`: it runs on the worker pod; the server pod requests it
    submitted = subprocess.run([*client, "submit", "--service", "--gpus", "1", "--", "sh", "-c",
                                'exec python3 -m http.server "$PORT" --bind 0.0.0.0'],
                               capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr + server.log("server") + worker.log("worker")
    endpoint = submitted.stdout.split()[-1]
    assert endpoint.startswith(f"{worker.ip}:"), submitted.stdout
    fetched = subprocess.run([*netns_exec(server.ns), sys.executable, "-c",
                              f"import urllib.request; print(urllib.request.urlopen('http://{endpoint}/', timeout=5).status)"],
                             capture_output=True, text=True, timeout=30)
    assert fetched.stdout.strip() == "200", fetched.stderr

    # 5. SIGTERM, as the kubelet stops a pod: the worker drains, the server stops within its grace period
    job_id = submitted.stdout.split()[0]
    subprocess.run([*client, "job", "cancel", job_id], capture_output=True, timeout=30)
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(30) == 0, worker.log("worker")
    started = time.monotonic()
    serving.send_signal(signal.SIGTERM)
    assert serving.wait(spec["terminationGracePeriodSeconds"]) == 0, server.log("server")
    assert time.monotonic() - started < spec["terminationGracePeriodSeconds"]


def test_the_provisioner_creates_a_worker_pod_that_runs_the_job_and_is_deleted_once_idle(cluster):
    """The provisioner overlay: provisioners.json through the init step; a GPU job no worker can take makes the
    server create a Pod in the API; that Pod, run as the kubelet would (its spec as the API stored it, the token
    from its Secret), joins, runs the job, leaves after max_idle_s, and the server deletes it and its Secret."""
    api, server, net = cluster["api"], cluster["server"], cluster["net"]
    example = json.loads((DEPLOY.parent / "provisioner" / "provisioners.json").read_text())
    example[0].update(kubeconfig=str(server.kubeconfig), max_idle_s=1)   # the API is not in-cluster here
    config = cluster["root"] / "provisioners.json"
    config.write_text(json.dumps(example))
    serving, tokens = start_server(server, ("--provisioners", str(config)))
    client = cli(server, tokens)
    submitted = subprocess.run([*client, "submit", "--gpus", "1", "--label", "pool=k8s", "--", "echo", "hello from a pod"],
                               capture_output=True, text=True, timeout=30)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.split()[0]

    name = wait_for("the provisioner's Pod", lambda: next(iter(api.pods(NAMESPACE)), None))
    pod_object = api.pods(NAMESPACE)[name]
    assert name == "gpulayer-k8s-a100-1" and name in api.secrets(NAMESPACE)
    assert pod_object["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    pod = Pod(pod_object["spec"], net.names[2], net.addresses[2], cluster["root"] / "pod", api, server.kubeconfig)
    cluster["pods"].append(pod)
    [container] = pod_object["spec"]["containers"]
    agent = pod.start(container, cluster["device_plugin"])
    api.set_phase(name, "Running", podIP=pod.ip)

    def ended():
        state = get_json(server, tokens, f"/v1/jobs/{job_id}")["state"]
        return state if state not in ("queued", "waiting", "running") else None
    assert wait_for("the job on the provisioned Pod", ended) == "succeeded", pod.log("worker") + server.log("server")
    assert agent.wait(30) == 0, pod.log("worker")          # idle for max_idle_s: the worker leaves
    api.set_phase(name, "Succeeded")
    wait_for("the Pod and its Secret deleted", lambda: name not in api.pods(NAMESPACE) and name not in api.secrets(NAMESPACE))
    listed = subprocess.run([*client, "worker", "list"], capture_output=True, text=True, timeout=30).stdout
    assert "Provisioning (Kubernetes): k8s [a100]" in listed and name in listed and "attached" in listed, listed
    serving.send_signal(signal.SIGTERM)
    assert serving.wait(server.spec["terminationGracePeriodSeconds"]) == 0, server.log("server")
