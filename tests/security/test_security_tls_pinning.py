"""The CA a worker or client pins is the only one trusted, whatever the environment says.

requests lets $REQUESTS_CA_BUNDLE / $CURL_CA_BUNDLE replace a Session's
`verify`; both the agent's Transport and gpulayer.client.api pass the pinned CA
per request so that an environment variable can neither break nor widen the
pinning.
"""
from __future__ import annotations

import pytest

from agent.errors import Unreachable
from agent.link.transport import Transport
from gpulayer.server.security.certs import make_ca, make_server_cert
from gpulayer.client.api import Client
from gpulayer.client.errors import ConnectionFailed
from gpulayer.server.frontends.cheroot_server import HTTPServer


def _hello(environ, start_response):
    start_response("200 OK", [("Content-Type", "application/json"), ("X-GpuLayer-Protocol", "1")])
    return [b'{"ok": true, "protocol": 1}']


@pytest.fixture
def tls_server(tmp_path):
    ca, ca_key = make_ca(tmp_path / "ca")
    cert, key = make_server_cert(tmp_path / "ca", ca, ca_key, ["localhost"], ["127.0.0.1"])
    other_ca, _ = make_ca(tmp_path / "other")
    srv = HTTPServer(_hello, "127.0.0.1", 0, certfile=str(cert), keyfile=str(key))
    srv.start()
    yield {"url": f"https://127.0.0.1:{srv.port}", "ca": str(ca), "other_ca": str(other_ca)}
    srv.stop(timeout=2)


@pytest.fixture(params=["REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"])
def system_bundle_env(request, monkeypatch, tmp_path):
    """An environment that names another CA bundle, as many hosts' do."""
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    bundle = tmp_path / "system-bundle.pem"
    bundle.write_text(make_ca(tmp_path / "system")[0].read_text())
    monkeypatch.setenv(request.param, str(bundle))


def test_agent_trusts_its_pinned_ca_even_when_the_environment_names_another(tls_server, system_bundle_env):
    assert Transport(tls_server["url"], verify=tls_server["ca"]).request("GET", "/health")["ok"] is True
    with pytest.raises(Unreachable):
        Transport(tls_server["url"], verify=tls_server["other_ca"]).request("GET", "/health")


def test_client_trusts_its_ca_file_even_when_the_environment_names_another(tls_server, system_bundle_env):
    assert Client(tls_server["url"], None, ca_file=tls_server["ca"]).request("GET", "/health").ok
    with pytest.raises(ConnectionFailed):
        Client(tls_server["url"], None, ca_file=tls_server["other_ca"]).request("GET", "/health")
