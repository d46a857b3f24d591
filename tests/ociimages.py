"""Test OCI images: a static busybox (Debian's busybox-static) assembled with umoci, archived as an OCI layout tar.

`build_layout` makes the layout dir, `archive` the tar of it (what `skopeo copy ... oci-archive:` writes), and
`layer_tar` a hand-made layer for the bad-archive tests. Nothing here needs a registry or a daemon.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

BUSYBOX = shutil.which("busybox") or "/bin/busybox"
UMOCI = shutil.which("umoci")
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"

needs_umoci = pytest.mark.skipif(
    UMOCI is None or not os.path.exists(BUSYBOX) or shutil.which("bwrap") is None,
    reason="needs umoci, busybox-static and bubblewrap (Debian packages umoci busybox-static bubblewrap)")


def build_layout(root: Path, marker: str = "hello from the image", *, tag: str = "test", env: list[str] = (),
                 workdir: str | None = None, entrypoint: list[str] | None = None, glibc_for: str | None = None,
                 applets: tuple[str, ...] = (), programs: tuple[str, ...] = ()) -> Path:
    """An OCI layout at root/layout with one image (tag ``tag``): /bin/busybox and its applets, /etc/marker.

    With ``glibc_for`` (a host program), the host's C library and loader that the program needs (``ldd``) are in
    the image too, at their host paths, as in a glibc-based image (ubuntu, a CUDA base image): the image can run
    that program once it is bound in. ``applets``: more of busybox's in /bin; ``programs``: host programs copied
    in at their host paths, with the libraries they load (``rsync``)."""
    layout, tree = root / "layout", root / "tree"
    umoci = UMOCI or "umoci"
    subprocess.run([umoci, "init", "--layout", str(layout)], check=True)
    subprocess.run([umoci, "new", "--image", f"{layout}:{tag}"], check=True)
    (tree / "bin").mkdir(parents=True)
    (tree / "etc").mkdir()
    (tree / "srv").mkdir()
    shutil.copy(BUSYBOX, tree / "bin" / "busybox")
    for applet in ("sh", "cat", "echo", "env", "pwd", "id", "ls", "sleep", "true", "nc", "httpd", "printenv", "grep",
                   *applets):
        os.symlink("busybox", tree / "bin" / applet)
    (tree / "etc" / "marker").write_text(marker + "\n")
    if glibc_for:
        for path in _libraries_of(glibc_for):
            where = tree / path.lstrip("/")
            where.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(os.path.realpath(path), where)
    subprocess.run([umoci, "insert", "--rootless", "--image", f"{layout}:{tag}", str(tree), "/"], check=True,
                   capture_output=True)
    config = [umoci, "config", "--image", f"{layout}:{tag}", "--config.env", "PATH=/bin"]
    for item in env:
        config += ["--config.env", item]
    if workdir:
        config += ["--config.workingdir", workdir]
    for arg in entrypoint or []:
        config += [f"--config.entrypoint={arg}"]
    subprocess.run(config, check=True, capture_output=True)
    subprocess.run([umoci, "gc", "--layout", str(layout)], check=True)
    if programs:
        with_layer(layout, _programs_layer(programs))
    return layout


def _programs_layer(programs: tuple[str, ...]) -> bytes:
    """A layer of host programs at their host paths, with the libraries they load. Made here, not with umoci
    insert: umoci 0.4.7 cut such a layer's tar short (its end lost) in this suite's runs."""
    files = sorted({path for program in programs for path in (program, *_libraries_of(program))})
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        folders = sorted({str(parent) for path in files for parent in Path(path.lstrip("/")).parents if str(parent) != "."})
        for folder in folders:
            tar.addfile(member(folder + "/", tarfile.DIRTYPE))
        for path in files:
            data = Path(os.path.realpath(path)).read_bytes()
            info = member(path.lstrip("/"))
            info.mode, info.size = 0o755, len(data)
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue())


def _libraries_of(program: str) -> list[str]:
    """The absolute paths `ldd` resolves for program, outside the NVIDIA driver's own (which the sandbox binds)."""
    out = subprocess.run(["ldd", program], capture_output=True, text=True, check=True).stdout
    paths = []
    for line in out.splitlines():
        words = line.replace("=>", " ").split()
        path = next((w for w in words if w.startswith("/")), None)
        if path and "nvidia" not in path:
            paths.append(path)
    return paths


def archive(layout: Path, dest: Path) -> Path:
    """The layout dir as a tar (an oci-archive)."""
    with tarfile.open(dest, "w") as tar:
        for name in sorted(os.listdir(layout)):
            tar.add(layout / name, arcname=name)
    return dest


def blob(layout: Path, data: bytes) -> str:
    """Write ``data`` as a blob of the layout; its digest."""
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256" / digest[7:]).write_bytes(data)
    return digest


def layer_tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    """A gzipped layer of hand-made members."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return gzip.compress(raw.getvalue())


def member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, 0o755 if kind == tarfile.DIRTYPE else 0o644
    return info


def with_layer(layout: Path, layer: bytes) -> str:
    """Add ``layer`` on top of the layout's only image; the new manifest's digest (index.json names it alone)."""
    index = json.loads((layout / "index.json").read_text())
    old = index["manifests"][0]
    manifest = json.loads((layout / "blobs" / "sha256" / old["digest"][7:]).read_bytes())
    config = json.loads((layout / "blobs" / "sha256" / manifest["config"]["digest"][7:]).read_bytes())
    layer_digest = blob(layout, layer)
    config["rootfs"]["diff_ids"].append("sha256:" + hashlib.sha256(gzip.decompress(layer)).hexdigest())
    config_bytes = json.dumps(config).encode()
    manifest["config"] = {"mediaType": CONFIG, "digest": blob(layout, config_bytes), "size": len(config_bytes)}
    manifest["layers"].append({"mediaType": LAYER, "digest": layer_digest, "size": len(layer)})
    manifest_bytes = json.dumps(manifest).encode()
    digest = blob(layout, manifest_bytes)
    index["manifests"] = [{**old, "digest": digest, "size": len(manifest_bytes)}]
    (layout / "index.json").write_text(json.dumps(index))
    return digest


def manifest_of(layout: Path) -> tuple[str, dict]:
    """The digest and the parsed manifest of the layout's only image."""
    digest = json.loads((layout / "index.json").read_text())["manifests"][0]["digest"]
    return digest, json.loads((layout / "blobs" / "sha256" / digest[7:]).read_bytes())
