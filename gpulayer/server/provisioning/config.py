"""provisioners.json: read and validated when the control plane starts (docs/operations.md, "Slurm provisioning",
and docs/kubernetes.md, "The Kubernetes provisioner").

`load(path)` raises ConfigError naming the bad field (`provisioners[0].profiles[1].gpus: ...`); `parse(data)`
validates the decoded file; `describe(provisioners)` is the configuration as /v1/provisioners shows it.
A provisioner's `type` is "slurm" (the default) or "kubernetes", each with its own fields.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from gpulayer.server.errors import ConfigError

TOKEN_TTL_S = 24 * 3600.0        # a provisioned worker's join token
MAX_IDLE_S = 300.0
PROVISION_TIMEOUT_S = 900.0
RETRY_AFTER_S = 60.0             # after a failed or cancelled request, before the profile asks again
LOOP_INTERVAL_S = 1.0
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")  # \Z: `$` would let a trailing newline through
_URL = re.compile(r"https?://[^/\s]+(?:/\S*)?")   # fullmatch: no space or newline anywhere
# A kubernetes provisioner's and profile's names make Pod names (gpulayer-<provisioner>-<profile>-<id>):
# DNS-1123 labels, short enough that the whole name stays under 63 characters.
_DNS_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,18}[a-z0-9])?\Z")
_K8S_KEY = re.compile(r"(?:[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?\Z")
_K8S_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?\Z")
_DNS_NAME = re.compile(r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?\Z")
_IMAGE = re.compile(r"[^\s]{1,512}\Z")


@dataclass(frozen=True)
class Profile:
    """One kind of worker a provisioner can ask for: a Slurm job, or a Kubernetes Pod (the last four fields)."""

    name: str
    cpus: float = 0
    gpus: int = 0
    ram_mb: int = 0
    labels: dict = field(default_factory=dict)
    sbatch: tuple = ()
    prerun: tuple = ()
    parallel: int = 1
    image: str = ""
    node_selector: dict = field(default_factory=dict)
    tolerations: tuple = ()
    pod_labels: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Provisioner:
    """One Slurm cluster, reached locally (`login` empty) or over ssh; or one Kubernetes namespace."""

    name: str
    control_plane_url: str
    profiles: tuple
    login: str = ""
    ssh_key: str = ""
    max_idle_s: float = MAX_IDLE_S
    provision_timeout_s: float = PROVISION_TIMEOUT_S
    retry_after_s: float = RETRY_AFTER_S
    ca_file: str = ""
    output: str = ""
    type: str = "slurm"
    namespace: str = ""
    kubeconfig: str = ""
    context: str = ""
    image: str = ""
    service_account: str = ""
    image_pull_secrets: tuple = ()


# -- configuration -------------------------------------------------------------

def _bad(path: str, message: str):
    return ConfigError(f"{path}: {message}")


def _fields(obj, path: str, known: dict, required: tuple) -> dict:
    if not isinstance(obj, dict):
        raise _bad(path, "must be an object")
    unknown = sorted(set(obj) - set(known))
    if unknown:
        raise _bad(f"{path}.{unknown[0]}", f"unknown field (known: {', '.join(sorted(known))})")
    for name in required:
        if name not in obj:
            raise _bad(f"{path}.{name}", "is required")
    out = {}
    for name, check in known.items():
        if name in obj:
            out[name] = check(obj[name], f"{path}.{name}")
    return out


def _name(value, path):
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise _bad(path, "must be 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit")
    return value


def _text(value, path):
    if not isinstance(value, str):
        raise _bad(path, "must be a string")
    return value


def _seconds(value, path):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or not math.isfinite(value):
        raise _bad(path, "must be a non-negative number of seconds (0 disables)")
    return float(value)


def _number(value, path):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or not math.isfinite(value):
        raise _bad(path, "must be a non-negative number")
    return value


def _count(value, path):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _bad(path, "must be a non-negative integer")
    return value


def _positive(value, path):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad(path, "must be a positive integer")
    return value


def _labels(value, path):
    if not isinstance(value, dict) or not all(isinstance(k, str) and k and isinstance(v, str)
                                              for k, v in value.items()):
        raise _bad(path, 'must be an object of non-empty string keys to string values, e.g. {"gpu": "h100"}')
    return dict(value)


def _lines(value, path):
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad(path, "must be a list of strings")
    for i, line in enumerate(value):
        if "\n" in line or "\r" in line:
            raise _bad(f"{path}[{i}]", "must be one line")
    return tuple(value)


def _url(value, path):
    if not isinstance(value, str) or not _URL.fullmatch(value):
        raise _bad(path, "must be the http:// or https:// URL that compute nodes reach the control plane at")
    return value.rstrip("/")


PROFILE_FIELDS = {"name": _name, "cpus": _number, "gpus": _count, "ram_mb": _count, "labels": _labels,
                  "sbatch": _lines, "prerun": _lines, "parallel": _positive}
PROVISIONER_FIELDS = {"type": _text, "name": _name, "login": _text, "ssh_key": _text,
                      "control_plane_url": _url, "max_idle_s": _seconds, "provision_timeout_s": _seconds,
                      "retry_after_s": _seconds, "ca_file": _text, "output": _text, "profiles": lambda v, p: v}


def _dns_label(value, path):
    if not isinstance(value, str) or not _DNS_LABEL.fullmatch(value):
        raise _bad(path, "must be 1-20 lowercase letters, digits or '-', starting and ending with a letter or digit "
                         "(it is part of Pod names)")
    return value


def _k8s_labels(value, path):
    if not isinstance(value, dict):
        raise _bad(path, 'must be an object of Kubernetes label keys to values, e.g. {"team": "vision"}')
    for key, item in value.items():
        if not isinstance(key, str) or not _K8S_KEY.fullmatch(key):
            raise _bad(f"{path}.{key}", "is not a valid Kubernetes label key")
        if not isinstance(item, str) or not _K8S_VALUE.fullmatch(item):
            raise _bad(f"{path}.{key}", "must be a valid Kubernetes label value (a string of at most 63 characters)")
    return dict(value)


def _image(value, path):
    if not isinstance(value, str) or not _IMAGE.fullmatch(value):
        raise _bad(path, "must be a container image reference, e.g. registry.example.com/gpulayer:0.1.0")
    return value


TOLERATION_FIELDS = {"key": _text, "operator": _text, "value": _text, "effect": _text, "toleration_seconds": _count}


def _tolerations(value, path):
    if not isinstance(value, list):
        raise _bad(path, 'must be a list of tolerations, e.g. [{"key": "nvidia.com/gpu", "operator": "Exists"}]')
    out = []
    for i, raw in enumerate(value):
        fields = _fields(raw, f"{path}[{i}]", TOLERATION_FIELDS, ())
        if fields.get("operator", "Equal") not in ("Equal", "Exists"):
            raise _bad(f"{path}[{i}].operator", 'must be "Equal" or "Exists"')
        if fields.get("effect", "") not in ("", "NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise _bad(f"{path}[{i}].effect", 'must be "NoSchedule", "PreferNoSchedule" or "NoExecute"')
        out.append(fields)
    return tuple(out)


def _names(value, path):
    if not isinstance(value, list) or not all(isinstance(v, str) and _DNS_NAME.fullmatch(v) for v in value):
        raise _bad(path, "must be a list of Secret names")
    return tuple(value)


def _dns_name(value, path):
    if not isinstance(value, str) or not _DNS_NAME.fullmatch(value):
        raise _bad(path, "must be a Kubernetes name: lowercase letters, digits, '-' and '.'")
    return value



def _file(value, path):
    if not isinstance(value, str):
        raise _bad(path, "must be a string")
    if value and not Path(value).expanduser().is_file():
        raise _bad(path, f"no such file: {value}")
    return value


KUBE_PROFILE_FIELDS = {"name": _dns_label, "cpus": _number, "gpus": _count, "ram_mb": _count, "labels": _labels,
                       "parallel": _positive, "image": _image, "node_selector": _k8s_labels,
                       "tolerations": _tolerations, "pod_labels": _k8s_labels}
KUBE_FIELDS = {"type": _text, "name": _dns_label, "control_plane_url": _url, "namespace": _dns_name,
               "kubeconfig": _file, "context": _text, "image": _image, "service_account": _dns_name,
               "image_pull_secrets": _names, "max_idle_s": _seconds, "provision_timeout_s": _seconds,
               "retry_after_s": _seconds, "ca_file": _text, "profiles": lambda v, p: v}


def _profiles(value, path: str, known: dict = PROFILE_FIELDS) -> tuple:
    if not isinstance(value, list) or not value:
        raise _bad(path, "must be a non-empty list of profiles")
    out, seen = [], set()
    for i, raw in enumerate(value):
        fields = _fields(raw, f"{path}[{i}]", known, ("name",))
        if fields["name"] in seen:
            raise _bad(f"{path}[{i}].name", f"duplicate profile name {fields['name']!r}")
        seen.add(fields["name"])
        out.append(Profile(**fields))
    return tuple(out)


def parse(data) -> list[Provisioner]:
    """Validate the decoded provisioners.json (a list, or {"provisioners": [...]}); raises ConfigError."""
    if isinstance(data, dict) and set(data) == {"provisioners"}:
        data = data["provisioners"]
    if not isinstance(data, list):
        raise _bad("provisioners", "must be a list of provisioners")
    out, seen = [], set()
    for i, raw in enumerate(data):
        path = f"provisioners[{i}]"
        kind = raw.get("type", "slurm") if isinstance(raw, dict) else "slurm"
        if kind not in ("slurm", "kubernetes"):
            raise _bad(f"{path}.type", 'must be "slurm" or "kubernetes"')
        if kind == "kubernetes":
            fields = _kubernetes(raw, path)
        else:
            fields = _slurm(raw, path)
        if fields["name"] in seen:
            raise _bad(f"{path}.name", f"duplicate provisioner name {fields['name']!r}")
        seen.add(fields["name"])
        out.append(Provisioner(**fields))
    return out


def _kubernetes(raw: dict, path: str) -> dict:
    fields = _fields(raw, path, KUBE_FIELDS, ("name", "control_plane_url", "profiles"))
    fields.setdefault("namespace", "gpulayer")
    fields["profiles"] = _profiles(fields["profiles"], f"{path}.profiles", KUBE_PROFILE_FIELDS)
    for i, profile in enumerate(fields["profiles"]):
        if not (profile.image or fields.get("image")):
            raise _bad(f"{path}.profiles[{i}].image", "is required when the provisioner has no image")
    return fields


def _slurm(raw: dict, path: str) -> dict:
    fields = _fields(raw, path, PROVISIONER_FIELDS, ("name", "control_plane_url", "profiles"))
    fields.pop("type", None)
    if fields.get("ssh_key") and not fields.get("login"):
        raise _bad(f"{path}.ssh_key", "is only used with login (user@host); login is empty")
    if fields.get("ssh_key") and not Path(fields["ssh_key"]).expanduser().is_file():
        raise _bad(f"{path}.ssh_key", f"no such file: {fields['ssh_key']}")
    if fields.get("login", "").startswith("-"):
        raise _bad(f"{path}.login", "must be user@host, not an option")
    fields["profiles"] = _profiles(fields["profiles"], f"{path}.profiles")
    return fields


def load(path: Path) -> list[Provisioner]:
    """The provisioners of `path`; [] when the file does not exist. Raises ConfigError naming the bad field."""
    path = Path(path)
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not readable JSON: {exc}") from None
    try:
        return parse(data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc.message}") from None


def describe(provisioners: list[Provisioner]) -> list[dict]:
    """The configuration as /v1/provisioners shows it (no prerun lines, which may hold secrets)."""
    return [_describe(p) for p in provisioners]


def _describe(p: Provisioner) -> dict:
    out: dict = {"name": p.name, "type": p.type, "login": p.login, "control_plane_url": p.control_plane_url,
           "max_idle_s": p.max_idle_s, "provision_timeout_s": p.provision_timeout_s,
           "retry_after_s": p.retry_after_s, "profiles": []}
    if p.type == "kubernetes":
        out.update(namespace=p.namespace, image=p.image, service_account=p.service_account)
    for f in p.profiles:
        profile = {"name": f.name, "cpus": f.cpus, "gpus": f.gpus, "ram_mb": f.ram_mb, "labels": f.labels,
                   "parallel": f.parallel, "sbatch": list(f.sbatch)}
        if p.type == "kubernetes":
            profile.update(image=f.image or p.image, node_selector=f.node_selector,
                           tolerations=list(f.tolerations), pod_labels=f.pod_labels)
        out["profiles"].append(profile)
    return out


