"""The Python client against a real control plane process and a real worker process."""
from __future__ import annotations

import pytest

import gpulayer as gl

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def client(cluster):
    with gl.connect(url=cluster.url, token=cluster.client_token) as c:
        yield c


def test_submit_wait_logs_status(client):
    job = client.submit(gl.job(["sh", "-c", "echo hello; echo warn >&2"], name="py"))
    assert isinstance(job.id, int)
    assert job.wait(timeout=60) == "succeeded"
    assert job.status() == "succeeded" and job.exit_code == 0
    lines = job.logs()
    assert {"hello", "warn"} <= {line["text"].rstrip("\n") for line in lines}
    assert {line["stream"] for line in lines} >= {"stdout", "stderr"}
    assert job.info()["name"] == "py"
    assert any(j["id"] == job.id for j in client.jobs(limit=20))


def test_follow_yields_lines_until_the_end(client):
    job = client.submit(gl.job(["sh", "-c", "for i in 1 2 3; do echo $i; sleep 0.2; done"]))
    texts = [line["text"].rstrip("\n") for line in job.logs(follow=True)]
    assert texts[-3:] == ["1", "2", "3"] or [t for t in texts if t in "123"] == ["1", "2", "3"]
    assert job.status() == "succeeded"


def test_wait_timeout_and_cancel(client):
    job = client.submit(gl.job(["sleep", "120"]))
    with pytest.raises(gl.WaitTimeout, match=f"job {job.id}"):
        job.wait(timeout=0.5)
    job.cancel()
    assert job.wait(timeout=30) == "cancelled"
    assert job.events()


def test_transfers_need_nothing_of_a_client_but_its_request(client, tmp_path):
    """client/transfers.py never calls back into the rest of the Client: a spec's local source, input and
    weights go up through its request alone."""
    from types import SimpleNamespace

    from gpulayer.client import transfers
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "run.sh").write_text("echo hi\n")
    (tmp_path / "in.txt").write_text("data")
    (tmp_path / "w.bin").write_bytes(b"weights")
    only_request = SimpleNamespace(request=client.request)
    spec = transfers.prepare_spec(only_request, {
        "command": ["true"], "source": str(tmp_path / "src"), "inputs": {"in.txt": str(tmp_path / "in.txt")},
        "service": {"weights": str(tmp_path / "w.bin")}})
    assert transfers.has_artifact(only_request, spec["source"])
    assert spec["inputs"]["in.txt"] == transfers.file_digest(tmp_path / "in.txt")
    assert spec["service"]["weights"] == transfers.file_digest(tmp_path / "w.bin")
    assert client.has_artifact(spec["inputs"]["in.txt"]) and client.has_artifact(spec["service"]["weights"])


def test_upload_is_by_digest_and_skipped_when_present(client, tmp_path):
    (tmp_path / "x.bin").write_bytes(b"\0" * 1000)
    digest = client.upload(tmp_path / "x.bin")
    assert digest.startswith("sha256:") and client.has_artifact(digest)
    assert client.upload(tmp_path / "x.bin") == digest
    client.download(digest, tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == b"\0" * 1000


def test_input_round_trip_through_a_job(client, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.txt").write_text("payload\n")
    job = client.submit(gl.job(["cat", "data/x.txt"], inputs=["data/x.txt"]))
    assert job.wait(timeout=60) == "succeeded"
    assert [line["text"].rstrip("\n") for line in job.logs() if line["stream"] == "stdout"] == ["payload"]


def test_inputs_outputs_and_upload_dedup(client, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.txt").write_text("payload\n")
    job = client.submit(gl.job(["sh", "-c", "mkdir -p out && tr a-z A-Z < data/x.txt > out/up.txt"],
                               inputs=["data/x.txt"], outputs=["out/"]))
    assert job.wait(timeout=60) == "succeeded"
    written = job.download_outputs(tmp_path / "dl")
    assert (tmp_path / "dl" / "out" / "up.txt").read_text() == "PAYLOAD\n"
    assert written


def test_typed_errors(client, cluster):
    with pytest.raises(gl.NotFound) as err:
        client.get_job(999999)
    assert err.value.code and err.value.status == 404
    with pytest.raises(gl.InvalidRequest):
        client.submit({"command": ["true"], "no_such_field": 1})
    with pytest.raises(gl.Unauthorized):
        gl.connect(url=cluster.url, token="glc_wrong").jobs()


def test_tokens_and_secrets(client):
    minted = client.create_token("py-token", {"pool": "x"}, expires_in_s=3600)
    assert minted["token"].startswith("glj_")
    assert any(t["jti"] == minted["jti"] for t in client.tokens())
    client.revoke_token(minted["jti"])
    with pytest.raises(gl.NotFound):
        client.revoke_token("no-such-jti")
    client.set_secret("PY_SECRET", "value-1", {"pool": "x"})
    assert [s for s in client.secrets() if s["name"] == "PY_SECRET"]
    assert "value-1" not in str(client.secrets())
    client.delete_secret("PY_SECRET")
    with pytest.raises(gl.NotFound):
        client.delete_secret("PY_SECRET")


def test_service_endpoints_and_cancel(client):
    import requests
    job = client.submit(gl.service(["sh", "-c", 'exec python3 -m http.server "$PORT" --bind 127.0.0.1']))
    endpoints = job.endpoints(wait=60)
    assert len(endpoints) == 1 and requests.get(f"http://{endpoints[0]}/", timeout=5).ok
    job.cancel()
    assert job.wait(timeout=30) == "cancelled"
    with pytest.raises(gl.ClientError, match="ended"):
        job.endpoints(wait=1)
