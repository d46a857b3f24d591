"""deploy/kubernetes/: every manifest validated offline against the Kubernetes OpenAPI schemas (kubernetes-validate,
strict: an unknown field fails) for the oldest and newest Kubernetes it ships, the overlays rendered by kubectl's
kustomize and validated the same way, and what the pieces must agree on: one image tag, the package's version;
the Secret the init step writes and the workers read; the probes on /v1/health; least-privilege RBAC."""
from __future__ import annotations

import json
import shutil
import subprocess
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from gpulayer.server.kube import init
from gpulayer.server.provisioning import config as prov_config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
VERSIONS = ("1.28.0", "1.37.0")   # the oldest still commonly run, and the newest kubernetes-validate knows
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
OVERLAYS = ("base", "replicate", "provisioner")


def manifests() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*.yaml") if p.name != "kustomization.yaml")


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def by_kind(kind: str) -> list[dict]:
    return [d for p in manifests() for d in documents(p) if d["kind"] == kind]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", manifests(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_manifest_is_valid_against_the_kubernetes_schema(path, version):
    docs = documents(path)
    assert docs, f"{path} holds no object"
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_kustomization_renders_to_valid_objects(overlay):
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl (its built-in kustomize) is not installed")
    rendered = subprocess.run(["kubectl", "kustomize", str(DEPLOY / overlay)], capture_output=True, text=True,
                              timeout=60, check=True).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    kinds = sorted(d["kind"] for d in docs)
    assert {"StatefulSet", "DaemonSet", "Service", "Role", "RoleBinding", "Namespace", "Ingress"} <= set(kinds)
    for doc in docs:
        kubernetes_validate.validate(doc, VERSIONS[-1], strict=True)
    [server] = [d for d in docs if d["kind"] == "StatefulSet"]
    args = server["spec"]["template"]["spec"]["containers"][0]["args"]
    if overlay == "replicate":
        assert args[-2:] == ["--replicate", "/var/lib/gpulayer-replica"]
        assert [t["metadata"]["name"] for t in server["spec"]["volumeClaimTemplates"]] == ["home", "replica"]
    if overlay == "provisioner":
        init_args = server["spec"]["template"]["spec"]["initContainers"][0]["args"]
        assert init_args[-2:] == ["--provisioners", "/etc/gpulayer/provisioners.json"]
        [cm] = [d for d in docs if d["kind"] == "ConfigMap"]
        assert prov_config.parse(json.loads(cm["data"]["provisioners.json"]))[0].type == "kubernetes"


def test_images_carry_the_package_version():
    images = [c["image"] for kind in ("StatefulSet", "DaemonSet") for d in by_kind(kind)
              for c in d["spec"]["template"]["spec"].get("initContainers", []) + d["spec"]["template"]["spec"]["containers"]]
    assert images and set(images) == {f"gpulayer/gpulayer:{VERSION}"}
    kustomization = yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text())
    assert kustomization["images"] == [{"name": "gpulayer/gpulayer", "newTag": VERSION}]
    example = prov_config.parse(json.loads((DEPLOY / "provisioner" / "provisioners.json").read_text()))
    assert {p.image for p in example} == {f"gpulayer/gpulayer:{VERSION}"}
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "COPY dist/gpulayer-${VERSION}-py3-none-any.whl" in dockerfile and "[server,replicate]" in dockerfile
    assert '-t "$name:$version"' in (DEPLOY / "build-image.sh").read_text()


def test_the_server_statefulset_keeps_its_home_and_secrets_out_of_the_image():
    [server] = by_kind("StatefulSet")
    spec = server["spec"]
    pod = spec["template"]["spec"]
    assert spec["replicas"] == 1 and spec["volumeClaimTemplates"][0]["metadata"]["name"] == "home"
    [step] = pod["initContainers"]
    assert step["command"] == ["python3", "-m", "gpulayer.server.kube.init"]
    secret = step["args"][step["args"].index("--secret") + 1]
    [container] = pod["containers"]
    assert container["command"] == ["gpulayer"] and container["args"][:2] == ["server", "start"]
    home = container["args"][container["args"].index("--home") + 1]
    assert step["args"][step["args"].index("--home") + 1] == home
    assert {m["mountPath"] for m in container["volumeMounts"] if m["name"] == "home"} == {home}
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/v1/health", "port": "http"}
    assert 30 <= pod["terminationGracePeriodSeconds"] <= 120
    [service] = by_kind("Service")
    assert service["spec"]["selector"] == server["spec"]["selector"]["matchLabels"]
    # the workers read the join token from the Secret the init step writes, under the key it writes
    [workers] = by_kind("DaemonSet")
    env = {e["name"]: e for e in workers["spec"]["template"]["spec"]["containers"][0]["env"]}
    ref = env["GPULAYER_JOIN_TOKEN"]["valueFrom"]["secretKeyRef"]
    made = init.secret_object(secret, "gpulayer", {"client_token": "c", "join_token": "j"})
    assert ref["name"] == secret and made["stringData"][ref["key"]] == "j"
    assert workers["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] >= 1
    assert f"http://{service['metadata']['name']}:8470" in workers["spec"]["template"]["spec"]["containers"][0]["args"]


def test_rbac_is_least_privilege():
    [role] = by_kind("Role")
    assert not by_kind("ClusterRole") and not by_kind("ClusterRoleBinding")
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in role["rules"]}
    assert rules == {
        (("",), ("pods",)): {"create", "list", "delete"},
        (("",), ("pods/log",)): {"get"},
        (("",), ("secrets",)): {"create", "get", "list", "delete"}}
    [binding] = by_kind("RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    [server] = by_kind("StatefulSet")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": server["spec"]["template"]["spec"]["serviceAccountName"],
                                    "namespace": "gpulayer"}]
    accounts = {a["metadata"]["name"]: a for a in by_kind("ServiceAccount")}
    assert accounts["gpulayer-worker"]["automountServiceAccountToken"] is False
