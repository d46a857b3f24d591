"""The worker Pods of a `kubernetes` provisioner (docs/kubernetes.md, "The Kubernetes provisioner").

Each request is one Pod, `gpulayer-<provisioner>-<profile>-<request id>`, that runs `gpulayer worker start`
with `--max-idle`, and one Secret beside it holding that Pod's join token alone (the Pod reads it as
$GPULAYER_JOIN_TOKEN). `pod_manifest` and `secret_manifest` are the objects exactly as created.
`Kube` talks to the API (through server/kube/api.py; every failure is a KubeError with the API's own
message): `create` (the Secret, then the Pod; a refused Pod takes its Secret with it), `phases`,
`delete`, `tail` (the Pod's last log lines) and `reap` (deletes the Pods whose worker has exited, after
`max_idle_s` idle, and Secrets whose Pod is gone). Nothing here touches the state file.
"""
from __future__ import annotations

from typing import Any, Callable

from gpulayer.server.kube import api
from gpulayer.server.provisioning.config import Profile, Provisioner

ENDED = frozenset({"Succeeded", "Failed"})
# A container waiting for one of these will not start by itself: said in the request's last_error at once.
STUCK = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                   "CreateContainerError", "CrashLoopBackOff"})
STATE_DIR = "/var/lib/gpulayer-worker"
LABEL = "gpulayer.dev"


def pod_name(prov: Provisioner, profile: Profile, request_id: int) -> str:
    return f"gpulayer-{prov.name}-{profile.name}-{request_id}"


def _labels(prov: Provisioner, profile: Profile, request_id: int) -> dict:
    return {**profile.pod_labels, "app.kubernetes.io/name": "gpulayer-worker", "app.kubernetes.io/managed-by": "gpulayer",
            f"{LABEL}/provisioner": prov.name, f"{LABEL}/profile": profile.name, f"{LABEL}/request": str(request_id)}


def _seconds(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".")  # never 1e+06


def worker_args(prov: Provisioner, profile: Profile, worker: str) -> list[str]:
    """`gpulayer`'s arguments in the Pod: the worker, with the profile's labels and resources, leaving when idle."""
    args = ["--url", prov.control_plane_url]
    if prov.ca_file:
        args += ["--ca-file", prov.ca_file]
    args += ["worker", "start", "--name", worker, "--advertise-address", "$(POD_IP)"]
    if prov.control_plane_url.startswith("http://"):
        args.append("--insecure")  # plain HTTP to the Service inside the cluster, as the operator chose
    for key, value in sorted(profile.labels.items()):
        args += ["--label", f"{key}={value}"]
    if profile.cpus:
        args += ["--cpus", _seconds(profile.cpus)]
    if profile.ram_mb:
        args += ["--ram-mb", str(profile.ram_mb)]
    return [*args, "--parallel", str(profile.parallel), "--max-idle", _seconds(prov.max_idle_s),
            "--state-dir", STATE_DIR, "--sandbox", "none"]


def _resources(profile: Profile) -> dict:
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if profile.cpus:
        millis = round(profile.cpus * 1000)
        requests["cpu"] = str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"
    if profile.ram_mb:
        requests["memory"] = limits["memory"] = f"{profile.ram_mb}Mi"
    if profile.gpus:
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = str(profile.gpus)
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


def _toleration(t: dict) -> dict:
    out = {k: t[k] for k in ("key", "operator", "value", "effect") if k in t}
    if "toleration_seconds" in t:
        out["tolerationSeconds"] = t["toleration_seconds"]
    return out


def pod_manifest(prov: Provisioner, profile: Profile, request_id: int, worker: str) -> dict:
    """The Pod of one request: restartPolicy Never (a worker that exits is done), no API token mounted."""
    name = pod_name(prov, profile, request_id)
    container: dict[str, Any] = {
        "name": "worker", "image": profile.image or prov.image, "command": ["gpulayer"],
        "args": worker_args(prov, profile, worker),
        "env": [{"name": "GPULAYER_JOIN_TOKEN", "valueFrom": {"secretKeyRef": {"name": name, "key": "token"}}},
                {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "HOME", "value": STATE_DIR}],   # the image's user has no home of its own here
        "volumeMounts": [{"name": "state", "mountPath": STATE_DIR}],
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    resources = _resources(profile)
    if resources:
        container["resources"] = resources
    # shareProcessNamespace: the pod's pause container is PID 1 and reaps what tasks leave behind.
    spec: dict[str, Any] = {"restartPolicy": "Never", "automountServiceAccountToken": False, "shareProcessNamespace": True,
                            "terminationGracePeriodSeconds": 60, "containers": [container],
                            "volumes": [{"name": "state", "emptyDir": {}}]}
    if prov.service_account:
        spec["serviceAccountName"] = prov.service_account
    if profile.node_selector:
        spec["nodeSelector"] = dict(profile.node_selector)
    if profile.tolerations:
        spec["tolerations"] = [_toleration(t) for t in profile.tolerations]
    if prov.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in prov.image_pull_secrets]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": prov.namespace, "labels": _labels(prov, profile, request_id)},
            "spec": spec}


def secret_manifest(prov: Provisioner, profile: Profile, request_id: int, token: str) -> dict:
    """The Secret holding one Pod's join token (key `token`), labelled like its Pod."""
    name = pod_name(prov, profile, request_id)
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": prov.namespace, "labels": _labels(prov, profile, request_id)},
            "stringData": {"token": token}}


def describe_phase(pod: dict) -> tuple[str, str]:
    """(phase, what keeps it from running) of a Pod as the API returns it; the second part "" when nothing does."""
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    for c in status.get("containerStatuses") or []:
        waiting = (c.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK:
            return phase, f"container {c.get('name')}: {waiting['reason']}: {waiting.get('message') or ''}".rstrip(": ")
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return phase, f"not scheduled ({cond.get('reason') or 'Unschedulable'}): {cond.get('message') or ''}".rstrip(": ")
    return phase, ""


class Kube:
    """The Kubernetes API of one provisioner; the client is made at first use (a bad kubeconfig fails a request)."""

    def __init__(self, prov: Provisioner):
        self.prov = prov
        self._client: Any = None

    @property
    def client(self):
        if self._client is None:
            self._client = api.connect(self.prov.kubeconfig, self.prov.context, self.prov.namespace)
        return self._client

    def _resource(self, kind: str):
        from lightkube.resources.core_v1 import Pod, Secret
        return {"Pod": Pod, "Secret": Secret}[kind]

    def create(self, pod: dict, secret: dict) -> str:
        """Create the Secret, then the Pod; the Pod's name. When the Pod is refused, its Secret is deleted."""
        from lightkube import codecs
        name = pod["metadata"]["name"]
        api.call(f"create Secret {name}", lambda: self.client.create(codecs.from_dict(secret)))
        try:
            api.call(f"create Pod {name}", lambda: self.client.create(codecs.from_dict(pod)))
        except api.KubeError:
            self._delete_quietly("Secret", name)
            raise
        return name

    def phases(self) -> dict[str, dict]:
        """{Pod name: the Pod as a dict} of this provisioner's Pods in its namespace."""
        found = api.call(f"list Pods in {self.prov.namespace}", lambda: list(
            self.client.list(self._resource("Pod"), labels={f"{LABEL}/provisioner": self.prov.name})))
        return {p.metadata.name: p.to_dict() for p in found}

    def delete(self, name: str) -> None:
        """Delete a request's Pod and Secret (either already gone is fine); KubeError when the API refuses."""
        for kind in ("Pod", "Secret"):
            try:
                api.call(f"delete {kind} {name}", self.client.delete, self._resource(kind), name)
            except api.KubeError as exc:
                if exc.code != 404:
                    raise

    def _delete_quietly(self, kind: str, name: str) -> None:
        try:
            self.client.delete(self._resource(kind), name)
        except Exception:  # noqa: BLE001 - best effort; reap() retries what is left
            pass

    def tail(self, name: str, lines: int = 20) -> str:
        """The Pod's last log lines ("" when they cannot be read)."""
        try:
            return "".join(api.call(f"log of {name}", lambda: list(self.client.log(name, tail_lines=lines)))).strip()
        except api.KubeError:
            return ""

    def reap(self, open_names: set[str], closed: Callable[[list[int]], set[int]]) -> list[str]:
        """Delete, of this provisioner's Pods not of an open request (the loop judges those): the ended ones (their
        worker exited: idle past max_idle_s, or failed), the Pending ones whose request `closed` says failed or
        was cancelled (the API would not delete the Pod then), and the Secrets whose Pod is gone; the names
        deleted. A Running Pod of a closed request is left to end: its token is revoked, so its worker cannot
        register, and exits."""
        pods = self.phases()
        gone = {n for n, p in pods.items() if n not in open_names and describe_phase(p)[0] in ENDED}
        pending = {n: int(p["metadata"]["labels"][f"{LABEL}/request"]) for n, p in pods.items()
                   if n not in open_names and describe_phase(p)[0] == "Pending"
                   and (p["metadata"].get("labels") or {}).get(f"{LABEL}/request", "").isdigit()}
        if pending:
            ended = closed(sorted(pending.values()))
            gone |= {n for n, request in pending.items() if request in ended}
        secrets = api.call(f"list Secrets in {self.prov.namespace}", lambda: list(
            self.client.list(self._resource("Secret"), labels={f"{LABEL}/provisioner": self.prov.name})))
        gone |= {s.metadata.name for s in secrets if s.metadata.name not in pods and s.metadata.name not in open_names}
        for name in sorted(gone):
            self.delete(name)
        return sorted(gone)
