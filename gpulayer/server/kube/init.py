"""The control plane pod's init step: `python3 -m gpulayer.server.kube.init --home DIR --secret NAME`.

On a new volume it runs `gpulayer server init --json` and puts the client and join tokens into the Secret NAME
(keys `client` and `join`) of the pod's namespace, so that nothing secret is in the image or the manifests:
workers read `join` from it, people read `client` with kubectl. On a volume already initialised it leaves
both as they are, unless the Secret is gone (deleted, or a new cluster on an old volume): then it rotates the
tokens (`server init --force`) and makes the Secret again. With `--provisioners FILE` (a mounted ConfigMap) it
checks that file as `server start` would and copies it into the home. Exit 1 when the Kubernetes API refuses,
2 for a provisioners file `server start` would refuse, naming the field. docs/kubernetes.md.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from gpulayer.server.config import HomeLayout
from gpulayer.server.errors import ConfigError
from gpulayer.server.kube import api

NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def namespace(given: str) -> str:
    """--namespace, else $POD_NAMESPACE (the downward API), else the service account's, else "default"."""
    if given:
        return given
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        return NAMESPACE_FILE.read_text().strip() or "default"
    except OSError:
        return "default"


def server_init(home: Path, force: bool) -> dict:
    """`gpulayer server init --json` (with --force to rotate): {"client_token", "join_token", "home"}."""
    argv = [sys.executable, "-m", "gpulayer.cli", "server", "init", "--home", str(home), "--json"]
    done = subprocess.run([*argv, "--force"] if force else argv, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise SystemExit(f"gpulayer server init failed: {(done.stderr or done.stdout).strip()}")
    return json.loads(done.stdout)


def secret_object(name: str, ns: str, tokens: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": ns, "labels": {"app.kubernetes.io/part-of": "gpulayer"}},
            "stringData": {"client": tokens["client_token"], "join": tokens["join_token"]}}


def ensure_tokens(client, home: Path, name: str, ns: str) -> str:
    """Initialise the home and its Secret as the module says; what was done, in words."""
    from lightkube import codecs
    from lightkube.resources.core_v1 import Secret
    initialised = HomeLayout(home).credentials.exists()
    if initialised:
        try:
            api.call(f"get Secret {name}", client.get, Secret, name, namespace=ns)
            return f"{home} is initialised and Secret {ns}/{name} holds its tokens: nothing to do"
        except api.KubeError as exc:
            if exc.code != 404:
                raise
    tokens = server_init(home, force=initialised)
    try:  # a Secret left from an earlier volume holds tokens that no longer work
        api.call(f"delete Secret {name}", client.delete, Secret, name, namespace=ns)
    except api.KubeError as exc:
        if exc.code != 404:
            raise
    api.call(f"create Secret {name}", client.create, codecs.from_dict(secret_object(name, ns, tokens)), namespace=ns)
    if initialised:
        return f"Secret {ns}/{name} was missing: rotated the tokens of {home} and made it again"
    return f"initialised {home} and put its client and join tokens in Secret {ns}/{name}"


def copy_provisioners(source: Path, home: Path) -> str:
    """Check `source` as `server start` will, then copy it to the home's provisioners.json (0600)."""
    from gpulayer.server.provisioning import config
    found = config.load(source)
    if not source.exists():
        raise ConfigError(f"{source}: no such file")
    target = HomeLayout(home).provisioners
    shutil.copyfile(source, target)
    target.chmod(0o600)
    return f"copied {source} ({len(found)} provisioner(s)) to {target}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m gpulayer.server.kube.init", description=__doc__.split("\n")[0])
    parser.add_argument("--home", required=True, type=Path, help="the control plane's home (the PersistentVolume)")
    parser.add_argument("--secret", default="gpulayer-tokens", help="the Secret of the tokens (keys client, join)")
    parser.add_argument("--namespace", default="", help="default: $POD_NAMESPACE, else the service account's")
    parser.add_argument("--kubeconfig", default="", help="default: in-cluster, else $KUBECONFIG or ~/.kube/config")
    parser.add_argument("--provisioners", type=Path, help="a provisioners.json to check and copy into the home")
    args = parser.parse_args(argv)
    ns = namespace(args.namespace)
    try:
        if args.provisioners is not None:
            print(f"gpulayer init: {copy_provisioners(args.provisioners, args.home)}", flush=True)
        client = api.connect(args.kubeconfig, "", ns)
        print(f"gpulayer init: {ensure_tokens(client, args.home, args.secret, ns)}", flush=True)
    except ConfigError as exc:
        print(f"gpulayer init: {exc}", file=sys.stderr)
        return 2
    except api.KubeError as exc:
        print(f"gpulayer init: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
