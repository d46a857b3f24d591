"""An image whose top layer Debian's `umoci insert` 0.4.7 wrote (issue 36, item 15), submitted end to end.

When a layer's last entry is a file, that umoci ends the layer's tar right after the file's data: no
padding to the 512-byte block, no end-of-archive blocks. `umoci unpack`, which the worker runs, reads
such a layer; the worker's safety check (agent/sandbox/images.py, check_layer) refused it ("a layer of the image
is not a readable tar: unexpected end of data"). It reads it now as `umoci unpack` does, and still
refuses a layer whose last file's data is cut short.
"""
from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import pytest
from integration_cluster import Cluster
from ociimages import UMOCI, archive, build_layout, manifest_of, needs_umoci

from agent.sandbox.images import ImageError, check_layer

pytestmark = [needs_umoci, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="bubblewrap needs Linux"),
              pytest.mark.timeout(240)]
INSERTED = "inserted by umoci insert, the layer's last entry, not a multiple of 512 bytes\n"


def inserted_layout(root: Path) -> tuple[Path, Path]:
    """A busybox layout with a file added by `umoci insert` as its own top layer; (layout, that layer)."""
    layout = build_layout(root)
    (root / "inserted").write_text(INSERTED)
    subprocess.run([UMOCI or "umoci", "insert", "--rootless", "--image", f"{layout}:test", str(root / "inserted"),
                    "/etc/inserted"], check=True, capture_output=True)
    subprocess.run([UMOCI or "umoci", "gc", "--layout", str(layout)], check=True)
    _, manifest = manifest_of(layout)
    return layout, layout / "blobs" / "sha256" / manifest["layers"][-1]["digest"][7:]


def test_umoci_insert_writes_a_layer_without_its_end(tmp_path):
    """The premise, and the check's limits: the layer ends inside its file's last block; that layer passes,
    the same layer cut inside the file's data does not."""
    _, layer = inserted_layout(tmp_path)
    raw = gzip.decompress(layer.read_bytes())
    assert len(raw) % 512 != 0, "this umoci wrote a complete tar: nothing to test"
    assert check_layer(layer, 1 << 30) == 1
    cut = tmp_path / "cut.tar"
    cut.write_bytes(raw[:-10])
    with pytest.raises(ImageError, match="not a readable tar"):
        check_layer(cut, 1 << 30)


def test_an_image_made_by_umoci_insert_runs(tmp_path):
    image = archive(inserted_layout(tmp_path / "image")[0], tmp_path / "inserted.tar")
    cluster = Cluster(tmp_path / "cluster").start_server()
    try:
        cluster.start_worker("ins", labels={"pool": "ins"}, args=["--sandbox", "bwrap"])
        done = cluster.cli("submit", "--label", "pool=ins", "--image", str(image), "--wait", "--",
                           "/bin/sh", "-c", "cat /etc/inserted /etc/marker", timeout=180)
        assert done.returncode == 0, (done.stdout, done.stderr)
        job_id = int(done.stdout.split()[0])
        job = cluster.wait_job(job_id, timeout=120)
        text = cluster.log_text(job_id)
        assert job["state"] == "succeeded", text
        assert INSERTED.strip() in text and "hello from the image" in text
    finally:
        cluster.close()
