"""`--image` on the client's side (gpulayer/client/images.py): which manifest is picked, what is refused before
anything is sent, and that a blob the server has is not sent again. Hand-made layouts: no umoci needed."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import platform
import tarfile
from pathlib import Path

import pytest

from gpulayer.client.errors import BadInput
from gpulayer.client.images import Layout, looks_like_path, pick_manifest, prepare_image
from gpulayer.client.transfers import file_digest
from gpulayer.protocol.jobspec import OCI_CONFIG, OCI_INDEX, OCI_MANIFEST

LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


def put(layout: Path, data: bytes) -> dict:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (layout / "blobs" / "sha256" / digest[7:]).write_bytes(data)
    return {"digest": digest, "size": len(data)}


def image(layout: Path, marker: bytes = b"x", layer_type: str = LAYER) -> dict:
    """One image's blobs in the layout; its manifest's descriptor."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("etc/marker")
        info.size = len(marker)
        tar.addfile(info, io.BytesIO(marker))
    layer = put(layout, gzip.compress(raw.getvalue()))
    config = put(layout, json.dumps({"os": "linux", "architecture": ARCH, "rootfs": {"type": "layers"}}).encode())
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": {"mediaType": OCI_CONFIG, **config},
                "layers": [{"mediaType": layer_type, **layer}]}
    return {"mediaType": OCI_MANIFEST, **put(layout, json.dumps(manifest).encode())}


def write_layout(layout: Path, manifests: list[dict]) -> Path:
    layout.mkdir(parents=True, exist_ok=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": manifests}))
    return layout


class FakeServer:
    """What prepare_image asks of a client: has / upload, counted."""

    def __init__(self):
        self.stored: set[str] = set()
        self.sent: list[str] = []

    def has(self, _client, digest: str) -> bool:
        return digest in self.stored

    def upload(self, _client, path: Path) -> str:
        digest = file_digest(path)
        self.stored.add(digest)
        self.sent.append(digest)
        return digest


def test_an_index_of_platforms_gives_this_machines_image_and_a_second_send_uploads_nothing(tmp_path):
    layout = tmp_path / "layout"
    ours, other = image(layout, b"ours"), image(layout, b"other")
    nested = put(layout, json.dumps({"schemaVersion": 2, "manifests": [
        {**other, "platform": {"os": "linux", "architecture": "riscv64"}},
        {**ours, "platform": {"os": "linux", "architecture": ARCH}}]}).encode())
    write_layout(layout, [{"mediaType": OCI_INDEX, **nested,
                           "annotations": {"org.opencontainers.image.ref.name": "multi"}}])
    entry, ref = pick_manifest(Layout(layout))
    assert entry["digest"] == ours["digest"] and ref == "multi"
    server = FakeServer()
    spec = prepare_image(None, str(layout), server.upload, server.has)
    assert spec["manifest"] == ours["digest"] and spec["ref"] == "multi" and len(spec["blobs"]) == 2
    assert len(server.sent) == 3
    again = prepare_image(None, str(layout), server.upload, server.has)
    assert again == spec and len(server.sent) == 3  # nothing sent the second time
    # The same layout as a tar (an oci-archive) reads alike.
    archive = tmp_path / "multi.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(layout, arcname=".")
    assert prepare_image(None, str(archive), server.upload, server.has) == spec


@pytest.mark.parametrize("damage, words", [
    ("zstd", r"tar\+zstd"),
    ("two", "2 images in it"),
    ("docker", "not an OCI manifest"),
    ("size", "its manifest says"),
    ("lie", "does not match its digest"),
    ("no-layout", "no oci-layout"),
])
def test_what_is_not_a_usable_oci_image_is_refused_before_anything_is_sent(tmp_path, damage, words):
    layout = tmp_path / "layout"
    entry = image(layout, layer_type="application/vnd.oci.image.layer.v1.tar+zstd" if damage == "zstd" else LAYER)
    manifests = [entry]
    if damage == "two":
        manifests.append(image(layout, b"second"))
    if damage == "docker":
        manifests = [{**entry, "mediaType": "application/vnd.docker.distribution.manifest.v2+json"}]
    if damage == "size":
        manifests = [{**entry, "size": entry["size"] + 1}]
    write_layout(layout, manifests)
    if damage == "lie":
        manifest = json.loads((layout / "blobs" / "sha256" / entry["digest"][7:]).read_bytes())
        path = layout / "blobs" / "sha256" / manifest["layers"][0]["digest"][7:]
        path.write_bytes(path.read_bytes() + b"!")
    if damage == "no-layout":
        (layout / "oci-layout").unlink()
    server = FakeServer()
    with pytest.raises(BadInput, match=words):
        prepare_image(None, str(layout), server.upload, server.has)
    assert server.sent == []


def test_a_name_is_a_cached_image_and_a_docker_save_archive_names_skopeo(tmp_path):
    assert not looks_like_path("pytorch-2.3") and looks_like_path("./img") and looks_like_path("img.tar")
    server = FakeServer()
    assert prepare_image(None, "pytorch-2.3", server.upload, server.has) == {"ref": "pytorch-2.3"}
    docker = tmp_path / "docker.tar"
    with tarfile.open(docker, "w") as tar:
        info = tarfile.TarInfo("manifest.json")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"[]"))
    with pytest.raises(BadInput, match="skopeo copy docker-archive:"):
        prepare_image(None, str(docker), server.upload, server.has)
