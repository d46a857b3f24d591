"""The GPU driver's user-space files for a task in an image, as the NVIDIA container toolkit binds them.

Where the worker has a CDI spec (``/etc/cdi/nvidia.yaml`` or ``.json``, or
under ``/var/run/cdi``; ``nvidia-ctk cdi generate`` writes one), its
``containerEdits`` (common, and those of the task's devices) say which device
nodes, files and symlinks the task gets and which environment variables. Else
the toolkit's own list of driver libraries and binaries is looked up in the
host's linker cache (``ldconfig -p``) and ``PATH``.

An image's ``/usr`` is bound read-only from the image, so nothing can be
mounted into it: the files go under ``/.gpulayer/driver/lib`` and ``bin``,
named as in the spec (the symlinks of its ``create-symlinks`` hook made
there too), with ``LD_LIBRARY_PATH`` and ``PATH`` pointing at them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

CDI_PATHS = ("/etc/cdi/nvidia.yaml", "/etc/cdi/nvidia.json", "/var/run/cdi/nvidia.yaml", "/var/run/cdi/nvidia.json")
DRIVER_DIR = "/.gpulayer/driver"
#: The libraries the NVIDIA container toolkit binds for compute and utility (without a CDI spec).
TOOLKIT_LIBRARIES = ("libcuda.so", "libcudadebugger.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so",
                     "libnvidia-nvvm.so", "libnvidia-gpucomp.so", "libnvidia-allocator.so", "libnvidia-cfg.so",
                     "libnvidia-opencl.so", "libnvidia-pkcs11.so", "libnvidia-pkcs11-openssl3.so")
TOOLKIT_BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
                    "nvidia-cuda-mps-server")


class CdiError(ValueError):
    """A CDI spec that cannot be read."""


@dataclass
class Edits:
    """What a task's GPUs add to its sandbox."""

    device_nodes: list[str] = field(default_factory=list)
    #: (host path, path the spec wants it at in the container)
    mounts: list[tuple[str, str]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    #: (target, link) as the spec's create-symlinks hook names them
    symlinks: list[tuple[str, str]] = field(default_factory=list)

    def add(self, edits: object) -> None:
        """Lay a spec's ``containerEdits`` object over these."""
        if not isinstance(edits, dict):
            return
        for node in edits.get("deviceNodes") or []:
            path = node.get("hostPath") or node.get("path") if isinstance(node, dict) else None
            if isinstance(path, str) and path not in self.device_nodes:
                self.device_nodes.append(path)
        for mount in edits.get("mounts") or []:
            if isinstance(mount, dict) and isinstance(mount.get("hostPath"), str):
                self.mounts.append((mount["hostPath"], str(mount.get("containerPath") or mount["hostPath"])))
        for item in edits.get("env") or []:
            name, _, value = str(item).partition("=")
            if name:
                self.env[name] = value
        for hook in edits.get("hooks") or []:
            args = [str(arg) for arg in (hook.get("args") or [])] if isinstance(hook, dict) else []
            if "create-symlinks" not in args:
                continue
            for flag, value in zip(args, args[1:]):
                if flag == "--link" and "::" in value:
                    target, link = value.split("::", 1)
                    self.symlinks.append((target, link))


def parse_spec(text: str) -> dict:
    """A CDI spec (JSON, or YAML where PyYAML is installed) as a dict; CdiError otherwise."""
    try:
        spec = json.loads(text)
    except ValueError:
        try:
            import yaml  # type: ignore[import-untyped]
        except ImportError:
            raise CdiError("a YAML CDI spec needs PyYAML (or write it as JSON: nvidia-ctk cdi generate "
                           "--format json)") from None
        try:
            spec = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise CdiError(f"not a CDI spec: {exc}") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("devices"), list):
        raise CdiError("not a CDI spec: no devices")
    return spec


def edits_for(spec: dict, devices: list[str]) -> Edits:
    """The edits of the spec's common ``containerEdits`` and of each named device (``"0"``, a UUID, ``"all"``)."""
    edits = Edits()
    edits.add(spec.get("containerEdits"))
    for device in spec["devices"]:
        if isinstance(device, dict) and str(device.get("name")) in devices:
            edits.add(device.get("containerEdits"))
    return edits


def toolkit_edits(ldconfig: str | None = None) -> Edits:
    """The toolkit's list of driver files found on this host (no CDI spec)."""
    edits = Edits()
    text = ldconfig
    if text is None:
        tool = shutil.which("ldconfig") or "/sbin/ldconfig"
        try:
            text = subprocess.run([tool, "-p"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            text = ""
    seen: set[str] = set()
    for line in text.splitlines():
        name, _, path = line.strip().partition(" => ")
        soname = name.split(" ", 1)[0]
        if "x86-64" not in name and "(libc6)" not in name and "," in name:
            continue  # a 32-bit copy
        if soname.split(".so", 1)[0] + ".so" in TOOLKIT_LIBRARIES and soname not in seen and path:
            seen.add(soname)
            edits.mounts.append((os.path.realpath(path), f"/usr/lib/x86_64-linux-gnu/{soname}"))
    for binary in TOOLKIT_BINARIES:
        found = shutil.which(binary)
        if found:
            edits.mounts.append((found, f"/usr/bin/{binary}"))
    return edits


def load(devices: list[str], paths: tuple[str, ...] = CDI_PATHS) -> Edits:
    """The edits for these devices: from the first CDI spec found, else the toolkit's list."""
    for path in paths:
        if os.path.isfile(path):
            return edits_for(parse_spec(Path(path).read_text()), devices)
    return toolkit_edits()


def driver_mounts(edits: Edits) -> tuple[list[str], dict[str, str]]:
    """bwrap arguments binding the edits' files under /.gpulayer/driver, and the environment that finds them."""
    args = ["--perms", "0755", "--dir", DRIVER_DIR, "--perms", "0755", "--dir", f"{DRIVER_DIR}/lib",
            "--perms", "0755", "--dir", f"{DRIVER_DIR}/bin"]
    placed: set[str] = set()
    for host, container in edits.mounts:
        if not os.path.exists(host):
            continue
        kind = "bin" if "/bin/" in container or "/sbin/" in container else "lib"
        target = f"{DRIVER_DIR}/{kind}/{os.path.basename(container)}"
        if target in placed or os.path.isdir(host):
            continue
        placed.add(target)
        args += ["--ro-bind", host, target]
    for target, link in edits.symlinks:
        where = f"{DRIVER_DIR}/lib/{os.path.basename(link)}"
        if where not in placed:
            placed.add(where)
            args += ["--symlink", os.path.basename(target), where]
    for node in edits.device_nodes:
        args += ["--dev-bind-try", node, node]
    env = dict(edits.env)
    return args, env
