"""`--image`: an OCI image archive or layout on this machine, shipped as artifacts (docs/workers.md, "Images").

An image is read from an OCI layout directory, or a tar of one (what `podman
save --format oci-archive`, `skopeo copy ... oci-archive:X` and Docker 25's
`docker save` write). Its manifest is picked from `index.json` (one for this
machine's platform where several are offered), its media types checked, and
its manifest, config and layers uploaded as artifacts: an OCI digest is an
artifact digest (`sha256:` of the bytes), so a blob the control plane has is
not sent again. Each blob sent is checked against its digest and size first.
An older `docker save` archive (`manifest.json`, no `oci-layout`) is refused
with the `skopeo copy docker-archive:X oci-archive:Y` that converts it. A value
that names no local file is a name the worker has cached (`{"ref": NAME}`).
"""
from __future__ import annotations

import hashlib
import json
import platform
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Callable

from gpulayer.client.errors import BadInput
from gpulayer.protocol.jobspec import OCI_CONFIG, OCI_INDEX, OCI_LAYERS, OCI_MANIFEST

CHUNK = 1024 * 1024
MAX_JSON_BYTES = 4 * 1024 * 1024
REF_ANNOTATION = "org.opencontainers.image.ref.name"
DOCKER_HINT = "convert it with `skopeo copy docker-archive:{path} oci-archive:{path}.oci`"
ARCHES = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64", "ppc64le": "ppc64le", "s390x": "s390x"}


def looks_like_path(value: str) -> bool:
    """Whether `--image VALUE` means a local file (else a name the worker has cached)."""
    return "/" in value or value.endswith((".tar", ".tgz", ".tar.gz", ".oci")) or Path(value).exists()


class Layout:
    """The blobs of an OCI layout, read from a directory or from a tar of one."""

    def __init__(self, path: Path):
        self.path = path
        self.tar: tarfile.TarFile | None = None
        self.members: dict[str, tarfile.TarInfo] = {}
        if path.is_dir():
            if not (path / "oci-layout").is_file():
                raise BadInput(f"--image {path}: not an OCI layout (no oci-layout file)")
            return
        try:
            self.tar = tarfile.open(path, "r:*")
            self.members = {info.name.removeprefix("./"): info for info in self.tar.getmembers() if info.isreg()}
        except (tarfile.TarError, EOFError):
            raise BadInput(f"--image {path}: not an OCI image archive (a tar of an OCI layout): not a tar") from None
        except OSError as exc:
            raise BadInput(f"--image {path}: cannot be read: {exc.strerror or exc}") from None
        if "oci-layout" not in self.members:
            if "manifest.json" in self.members:
                raise BadInput(f"--image {path}: a `docker save` archive, not an OCI one; "
                               + DOCKER_HINT.format(path=path))
            raise BadInput(f"--image {path}: not an OCI image archive (no oci-layout file in the tar)")

    def close(self) -> None:
        if self.tar is not None:
            self.tar.close()

    def open(self, name: str) -> Any:
        """A binary file object of `name` in the layout; BadInput when it is missing."""
        if self.tar is None:
            try:
                return open(self.path / name, "rb")
            except OSError:
                raise BadInput(f"--image {self.path}: {name} is missing") from None
        info = self.members.get(name)
        handle = self.tar.extractfile(info) if info is not None else None
        if handle is None:
            raise BadInput(f"--image {self.path}: {name} is missing from the archive")
        return handle

    def json(self, name: str) -> dict:
        with self.open(name) as handle:
            data = handle.read(MAX_JSON_BYTES + 1)
        try:
            obj = json.loads(data) if len(data) <= MAX_JSON_BYTES else None
        except (ValueError, UnicodeDecodeError):
            obj = None
        if not isinstance(obj, dict):
            raise BadInput(f"--image {self.path}: {name} is not a JSON object")
        return obj

    def blob(self, digest: str, size: int | None, dest: Path) -> Path:
        """The blob `digest` as a file (copied out of a tar), checked against its digest and size."""
        name = f"blobs/sha256/{digest.removeprefix('sha256:')}"
        sha = hashlib.sha256()
        total = 0
        with self.open(name) as source, open(dest, "wb") as out:
            for chunk in iter(lambda: source.read(CHUNK), b""):
                sha.update(chunk)
                total += len(chunk)
                out.write(chunk)
        if f"sha256:{sha.hexdigest()}" != digest:
            raise BadInput(f"--image {self.path}: blob {digest} does not match its digest "
                           f"(its bytes hash to sha256:{sha.hexdigest()})")
        if size is not None and size != total:
            raise BadInput(f"--image {self.path}: blob {digest} is {total} bytes, its manifest says {size}")
        return dest


def _digest(value: object, where: str, path: Path) -> str:
    text = str(value)
    if not (text.startswith("sha256:") and len(text) == 71 and all(c in "0123456789abcdef" for c in text[7:])):
        raise BadInput(f"--image {path}: {where} has no sha256 digest ({text!r})")
    return text


def pick_manifest(layout: Layout) -> tuple[dict, str | None]:
    """The descriptor of the image to run (this machine's platform where an index offers several) and its name."""
    found: list[tuple[dict, str | None]] = []
    entries = [(entry, None) for entry in layout.json("index.json").get("manifests") or []]
    while entries:
        entry, name = entries.pop(0)
        if not isinstance(entry, dict):
            continue
        ref = (entry.get("annotations") or {}).get(REF_ANNOTATION) or name
        kind = entry.get("mediaType")
        if kind == OCI_INDEX:
            digest = _digest(entry.get("digest"), "an index entry", layout.path)
            nested = layout.json(f"blobs/sha256/{digest[7:]}").get("manifests") or []
            entries += [(child, ref) for child in nested]
        elif kind == OCI_MANIFEST:
            found.append((entry, ref))
        else:
            raise BadInput(f"--image {layout.path}: an image of media type {kind!r}, not an OCI manifest; "
                           + DOCKER_HINT.format(path=layout.path))
    arch = ARCHES.get(platform.machine(), platform.machine())
    fits = [(entry, ref) for entry, ref in found
            if not entry.get("platform") or (entry["platform"].get("os"), entry["platform"].get("architecture"))
            == ("linux", arch)]
    if not fits:
        raise BadInput(f"--image {layout.path}: no image for linux/{arch} in it")
    if len(fits) > 1:
        names = ", ".join(str(ref) for _, ref in fits)
        raise BadInput(f"--image {layout.path}: {len(fits)} images in it ({names}); keep one "
                       "(`skopeo copy oci-archive:X:NAME oci-archive:Y`)")
    return fits[0]


def prepare_image(client: Any, value: str, upload: Callable[[Any, Path], str],
                  has: Callable[[Any, str], bool]) -> dict:
    """The JobSpec `image` of `--image VALUE`: its blobs uploaded (those the server lacks), or `{"ref": VALUE}`
    for a name the worker has cached. BadInput for what is not an OCI image, before anything is uploaded."""
    if not looks_like_path(value):
        return {"ref": value}
    path = Path(value)
    if not path.exists():
        raise BadInput(f"--image {value}: does not exist")
    layout = Layout(path)
    try:
        entry, ref = pick_manifest(layout)
        manifest_digest = _digest(entry.get("digest"), "the manifest", path)
        manifest = layout.json(f"blobs/sha256/{manifest_digest[7:]}")
        if manifest.get("mediaType", OCI_MANIFEST) != OCI_MANIFEST:
            raise BadInput(f"--image {value}: its manifest is {manifest.get('mediaType')!r}, not OCI; "
                           + DOCKER_HINT.format(path=value))
        config = manifest.get("config") or {}
        if config.get("mediaType") != OCI_CONFIG:
            raise BadInput(f"--image {value}: its config is {config.get('mediaType')!r}, not {OCI_CONFIG}")
        wanted = [(manifest_digest, entry.get("size")), (_digest(config.get("digest"), "the config", path),
                                                         config.get("size"))]
        for layer in manifest.get("layers") or []:
            if not isinstance(layer, dict) or layer.get("mediaType") not in OCI_LAYERS:
                kind = layer.get("mediaType") if isinstance(layer, dict) else layer
                raise BadInput(f"--image {value}: a layer of media type {kind!r}; workers unpack "
                               f"{' and '.join(OCI_LAYERS)}")
            wanted.append((_digest(layer.get("digest"), "a layer", path), layer.get("size")))
        with tempfile.TemporaryDirectory(prefix="gpulayer-image-") as tmp:
            missing = [(digest, size) for digest, size in dict(wanted).items() if not has(client, digest)]
            files = [layout.blob(digest, size, Path(tmp) / digest[7:]) for digest, size in missing]
            for file in files:  # every blob read and checked: now send them
                upload(client, file)
                file.unlink()
    finally:
        layout.close()
    blobs = [digest for digest, _ in wanted[1:]]
    return {"manifest": manifest_digest, "blobs": list(dict.fromkeys(blobs)),
            "ref": ref or path.name.removesuffix(".tar")}
