"""certs.py: a CA, a server certificate with the right SANs, fingerprints, key modes."""

from __future__ import annotations

import hashlib
import ipaddress
import os
import socket
import ssl
import stat
import time

import pytest
from cryptography import x509

from gpulayer.server.security import certs


def load_all(path):
    return x509.load_pem_x509_certificates(path.read_bytes())


def sans(path):
    san = load_all(path)[0].extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return set(san.get_values_for_type(x509.DNSName)), {str(a) for a in san.get_values_for_type(x509.IPAddress)}


def mode(path):
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def ca(tmp_path):
    return certs.make_ca(tmp_path)


def test_ca_is_a_ca_with_a_private_key_file(ca):
    cert_path, key_path = ca
    cert = load_all(cert_path)[0]
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert cert.subject == cert.issuer
    assert (cert.not_valid_after_utc - cert.not_valid_before_utc).days >= 3650
    assert mode(key_path) == 0o600


def test_key_is_0600_even_with_an_open_umask(tmp_path):
    old = os.umask(0)
    try:
        _, key_path = certs.make_ca(tmp_path)
    finally:
        os.umask(old)
    assert mode(key_path) == 0o600


def test_server_cert_has_sans_chain_and_ca_signature(tmp_path, ca):
    cert_path, key_path = certs.make_server_cert(tmp_path, *ca, ["localhost", "gpu-box"], ["127.0.0.1", "::1"])
    dns, ips = sans(cert_path)
    assert dns == {"localhost", "gpu-box"}
    assert ips == {"127.0.0.1", "::1"}
    leaf, issuer = load_all(cert_path)
    assert issuer == load_all(ca[0])[0]
    leaf.verify_directly_issued_by(issuer)
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert mode(key_path) == 0o600
    # the standard library accepts the pair as a server identity
    ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_path, key_path)


def test_server_cert_refuses_a_bad_ip(tmp_path, ca):
    with pytest.raises(ValueError):
        certs.make_server_cert(tmp_path, *ca, ["localhost"], ["not-an-ip"])


def test_fingerprint_is_sha256_of_the_first_der_cert_and_stable(tmp_path, ca):
    cert_path, _ = certs.make_server_cert(tmp_path, *ca, ["localhost"], [])
    first_pem = cert_path.read_text().split("-----END CERTIFICATE-----")[0] + "-----END CERTIFICATE-----\n"
    expected = "sha256:" + hashlib.sha256(ssl.PEM_cert_to_DER_cert(first_pem)).hexdigest()
    assert certs.fingerprint(cert_path) == expected == certs.fingerprint(cert_path)
    assert certs.fingerprint(ca[0]) != expected


def test_ensure_tls_creates_then_reuses(tmp_path):
    first = certs.ensure_tls(tmp_path)
    assert first["ca"] == tmp_path / "tls" / "ca.pem"
    assert first["fingerprint"] == certs.fingerprint(first["ca"])
    assert mode(tmp_path / "tls" / "ca-key.pem") == 0o600 and mode(first["key"]) == 0o600
    dns, ips = sans(first["cert"])
    assert {"localhost", socket.gethostname().lower()} <= dns
    assert {"127.0.0.1", "::1"} <= ips
    mtimes = {p: p.stat().st_mtime_ns for p in (tmp_path / "tls").iterdir()}

    assert certs.ensure_tls(tmp_path) == first
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "tls").iterdir()} == mtimes


def test_ensure_tls_reissues_the_server_cert_for_a_new_name_under_the_same_ca(tmp_path):
    first = certs.ensure_tls(tmp_path)
    second = certs.ensure_tls(tmp_path, ["cp.example.org", "10.9.8.7"])
    assert second["fingerprint"] == first["fingerprint"]
    assert second["cert_fingerprint"] != first["cert_fingerprint"]
    dns, ips = sans(second["cert"])
    assert "cp.example.org" in dns and "10.9.8.7" in ips


def test_local_addresses_are_non_loopback_ips():
    for text in certs.local_addresses():
        addr = ipaddress.ip_address(text)
        assert not addr.is_loopback and not addr.is_link_local


def test_ip_addr_output_is_parsed():
    out = (
        "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever\n"
        "4: eth0    inet 192.0.2.2/24 brd 192.0.2.255 scope global eth0\\       valid_lft forever\n"
        "4: eth0    inet6 fd00::2/64 scope global nodad \\       valid_lft forever\n"
    )
    assert certs._parse_ip_addr(out) == ["127.0.0.1", "192.0.2.2", "fd00::2"]


def test_a_hanging_name_lookup_is_abandoned():
    t0 = time.monotonic()
    assert certs._bounded(lambda: time.sleep(5), 0.05) is None
    assert time.monotonic() - t0 < 1
