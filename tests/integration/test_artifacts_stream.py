"""Artifacts stream through a real server: memory stays flat whatever their size."""
from __future__ import annotations

import hashlib
import os

import pytest

from gpulayer.testing import ControlPlaneProcess

SIZE = 256 * 1024 * 1024        # far past any request-body buffer
CHUNK = 1024 * 1024


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


BLOCK = os.urandom(CHUNK)


def _chunks():
    """The same 256 MiB every time, generated (never held in memory whole); sent chunked."""
    for i in range(SIZE // CHUNK):
        yield BLOCK[:-8] + i.to_bytes(8, "big")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ControlPlaneProcess(tmp_path_factory.mktemp("artifacts")) as plane:
        yield plane


def test_a_large_artifact_streams_up_and_down_with_flat_memory(server):
    digest = hashlib.sha256()
    for chunk in _chunks():
        digest.update(chunk)
    name = "sha256:" + digest.hexdigest()
    before = _rss_kb(server.pid)

    put = server.request("PUT", f"/v1/artifacts/{name}", data=_chunks(), timeout=120,
                         headers={"Content-Type": "application/octet-stream"})
    assert put.status_code == 201, put.text
    after_put = _rss_kb(server.pid)

    back = hashlib.sha256()
    with server.request("GET", f"/v1/artifacts/{name}", stream=True, timeout=120) as got:
        assert got.status_code == 200
        assert int(got.headers["Content-Length"]) == SIZE
        for chunk in got.iter_content(CHUNK):
            back.update(chunk)
    after_get = _rss_kb(server.pid)

    assert back.hexdigest() == digest.hexdigest()
    # 256 MiB went through each way; the server grew by a few buffers at most.
    assert after_put - before < 48 * 1024, (before, after_put)
    assert after_get - before < 48 * 1024, (before, after_get)


def test_a_wrong_digest_stores_nothing_even_when_large(server):
    name = "sha256:" + "0" * 64
    put = server.request("PUT", f"/v1/artifacts/{name}", data=_chunks(), timeout=120)
    assert put.status_code == 400 and put.json()["error"]["code"] == "digest_mismatch"
    assert server.request("HEAD", f"/v1/artifacts/{name}").status_code == 404
    assert not list((server.home / "artifacts" / "tmp").iterdir())


def test_a_chunked_json_body_is_read(server):
    def body():
        yield b'{"command": '
        yield b'["true"]}'
    r = server.request("POST", "/v1/jobs", data=body(), headers={"Content-Type": "application/json"})
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["command"] == ["true"]
