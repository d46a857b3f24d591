"""A service's ingress as the API takes it (issue 26): `service.ingress` checked field by field, `ingress_url`
in the job read (null without one), the ingress's routes under `--http cheroot` (501: it streams on granian
only), and the CLI's --ingress options refused before anything is sent."""

from __future__ import annotations

import hashlib

import pytest

from gpulayer.client.specs import service

KEY = "k" * 40


def _submit(api, client_h, ingress):
    return api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["serve"], "service": {"ingress": ingress}})


@pytest.mark.parametrize(
    "ingress, field",
    [
        ({"access": "bogus"}, "service.ingress.access"),
        ({"access": "key"}, "service.ingress.key_sha256"),
        ({"access": "key", "key_sha256": "abc"}, "service.ingress.key_sha256"),
        ({"access": "public", "key_sha256": "0" * 64}, "service.ingress.key_sha256"),
        ({"access": "token", "extra": 1}, "service.ingress"),
        ("token", "service.ingress"),
    ],
)
def test_bad_ingress_settings_are_refused_by_field(api, client_h, ingress, field):
    answer = _submit(api, client_h, ingress)
    assert answer.status_code == 400, answer.text
    assert field in answer.json["error"]["message"]
    assert api.simulate_get("/v1/jobs", headers=client_h).json["jobs"] == []  # nothing was made


def test_an_ingress_needs_the_port(api, client_h):
    answer = api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["serve"], "service": {"port": False, "ingress": {"access": "token"}}})
    assert answer.status_code == 400 and "port" in answer.json["error"]["message"]


def test_the_job_read_has_its_ingress_url(api, client_h):
    plain = api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["serve"], "service": {}})
    assert plain.status_code == 201 and plain.json["ingress_url"] is None
    made = _submit(api, client_h, {"access": "key", "key_sha256": hashlib.sha256(KEY.encode()).hexdigest()})
    assert made.status_code == 201, made.text
    job_id = made.json["id"]
    assert made.json["ingress_url"] == f"http://falconframework.org/ingress/{job_id}"
    read = api.simulate_get(f"/v1/jobs/{job_id}", headers=client_h).json
    assert read["ingress_url"] == f"http://falconframework.org/ingress/{job_id}"
    assert read["spec"]["service"]["ingress"] == {"access": "key", "key_sha256": hashlib.sha256(KEY.encode()).hexdigest()}
    batch = api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["x"]}).json
    assert api.simulate_get(f"/v1/jobs/{batch['id']}", headers=client_h).json["ingress_url"] is None


def test_under_cheroot_the_ingress_answers_501(api):
    for method in ("GET", "POST", "PUT", "DELETE"):
        answer = api.simulate_request(method, "/ingress/1/v1/models")
        assert answer.status_code == 501, answer.text
        assert answer.json["error"]["code"] == "relay_unavailable" and "granian" in answer.json["error"]["message"]
    assert api.simulate_get("/ingress/1").status_code == 501


def test_the_python_api_hashes_the_key():
    spec = service(["serve"], ingress_key=KEY)
    assert spec["service"]["ingress"] == {"access": "key", "key_sha256": hashlib.sha256(KEY.encode()).hexdigest()}
    assert service(["serve"], ingress="public")["service"]["ingress"] == {"access": "public"}
    assert "ingress" not in service(["serve"])["service"]  # an older server knows no such field
    for bad in (dict(ingress="bogus"), dict(ingress="key"), dict(ingress_key="short"), dict(ingress="token", ingress_key=KEY)):
        with pytest.raises(ValueError):
            service(["serve"], **bad)
