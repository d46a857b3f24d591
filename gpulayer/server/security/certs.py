"""CA and server certificates for the control plane, and their fingerprints.

`gpulayer server init` calls `ensure_tls(home)` once: it makes a private CA
(ECDSA P-256, 10 years) and a server certificate signed by it (2 years) under
`$GPULAYER_HOME/tls/`. Workers and clients trust `ca.pem`, or pin the CA
fingerprint printed by the server, so a reissued server certificate needs no
change on any worker.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import os
import socket
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_VALIDITY = dt.timedelta(days=3650)
SERVER_VALIDITY = dt.timedelta(days=730)
# Back-date notBefore so a worker whose clock runs a little behind still accepts the cert.
CLOCK_SKEW = dt.timedelta(hours=1)
# ensure_tls reissues the server certificate when less than this is left.
RENEW_BEFORE = dt.timedelta(days=30)
# getfqdn() may wait on a reverse DNS lookup; give up on it after this.
NAME_LOOKUP_TIMEOUT_S = 1.0

CA_CERT, CA_KEY = "ca.pem", "ca-key.pem"
SERVER_CERT, SERVER_KEY = "server.pem", "server-key.pem"


def make_ca(dir: Path, common_name: str = "GPUlayer CA") -> tuple[Path, Path]:
    """Create a self-signed CA in `dir`; return (ca.pem, ca-key.pem).

    The key is ECDSA P-256, written with mode 0600; the certificate is valid
    for 10 years and may sign only end-entity certificates (path length 0).
    Existing files are overwritten.
    """
    dir = Path(dir)
    dir.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = dir / CA_CERT, dir / CA_KEY
    _write_private(key_path, _key_pem(key))
    _write_public(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def make_server_cert(
    dir: Path, ca_cert: Path, ca_key: Path, hostnames: list[str], ips: list[str]
) -> tuple[Path, Path]:
    """Issue a server certificate signed by the CA; return (server.pem, server-key.pem).

    server.pem holds the chain (leaf, then CA) so a TLS server can send both.
    SANs are the DNS `hostnames` and the `ips` (IPv4 or IPv6 strings; raises
    ValueError on one that does not parse). Valid 2 years; key mode 0600.
    """
    dir = Path(dir)
    dir.mkdir(parents=True, exist_ok=True)
    ca_pem = Path(ca_cert).read_bytes()
    ca = x509.load_pem_x509_certificates(ca_pem)[0]
    signer = serialization.load_pem_private_key(Path(ca_key).read_bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    sans = _unique([x509.DNSName(h) for h in hostnames] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips])
    if not sans:
        raise ValueError("a server certificate needs at least one hostname or IP")
    subject_cn = hostnames[0] if hostnames else ips[0]
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject_cn[:64])]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(min(now + SERVER_VALIDITY, ca.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        # The CA is ours (an EC key, make_ca), though loading it from PEM types it as any kind of key.
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.public_key()),  # type: ignore[arg-type]
                       critical=False)
        .sign(signer, hashes.SHA256())  # type: ignore[arg-type]
    )
    cert_path, key_path = dir / SERVER_CERT, dir / SERVER_KEY
    _write_private(key_path, _key_pem(key))
    _write_public(cert_path, cert.public_bytes(serialization.Encoding.PEM) + ca.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def ensure_tls(home: Path, extra_names: Sequence[str] = ()) -> dict:
    """Make or reuse the CA and server certificate under `home/tls/`.

    The server certificate names localhost, 127.0.0.1, ::1, this host's name
    and FQDN, its local addresses and `extra_names` (hostnames or IPs). The
    CA is made once and never replaced. The server certificate is reused
    unless it lacks one of those names or expires within 30 days; then it is
    reissued from the same CA, so workers that trust the CA notice nothing.

    Returns {"ca", "cert", "key": Path, "fingerprint": "sha256:HEX" of the CA
    certificate (what a worker pins), "cert_fingerprint": same for the leaf}.
    """
    tls = Path(home) / "tls"
    tls.mkdir(parents=True, exist_ok=True, mode=0o700)
    ca_cert, ca_key = tls / CA_CERT, tls / CA_KEY
    if not (ca_cert.exists() and ca_key.exists()):
        make_ca(tls)
    hostnames, ips = _split_names(_default_names() + list(extra_names))
    cert, key = tls / SERVER_CERT, tls / SERVER_KEY
    if not (cert.exists() and key.exists() and _still_good(cert, hostnames, ips)):
        make_server_cert(tls, ca_cert, ca_key, hostnames, ips)
    return {
        "ca": ca_cert,
        "cert": cert,
        "key": key,
        "fingerprint": fingerprint(ca_cert),
        "cert_fingerprint": fingerprint(cert),
    }


def fingerprint(cert_pem_path: Path) -> str:
    """Return "sha256:" + hex SHA-256 of the DER of the first certificate in the file.

    Raises ValueError when the file holds no PEM certificate.
    """
    cert = x509.load_pem_x509_certificates(Path(cert_pem_path).read_bytes())[0]
    return "sha256:" + hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def local_addresses() -> list[str]:
    """Return this host's non-loopback, non-link-local IPv4/IPv6 addresses, best effort.

    Reads `ip -o addr` when available (2 s cap); otherwise asks the kernel
    which source address it would use for a route (no packet is sent) and
    reads /proc/net/if_inet6. Never raises; may return [].
    """
    found = _ip_command_addresses() or _fallback_addresses()
    keep = []
    for text in found:
        try:
            addr = ipaddress.ip_address(text)
        except ValueError:
            continue
        if not (addr.is_loopback or addr.is_link_local or addr.is_unspecified):
            keep.append(str(addr))
    return _unique(keep)


def _ip_command_addresses() -> list[str]:
    try:
        out = subprocess.run(
            ["ip", "-o", "addr", "show"], capture_output=True, text=True, timeout=2, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return _parse_ip_addr(out)


def _parse_ip_addr(out: str) -> list[str]:
    """Addresses from `ip -o addr show` lines ("2: eth0    inet 10.0.0.5/24 brd ...")."""
    addrs = []
    for line in out.splitlines():
        fields = line.split()
        for family in ("inet", "inet6"):
            if family in fields[:-1]:
                addrs.append(fields[fields.index(family) + 1].split("/")[0])
    return addrs


def _fallback_addresses() -> list[str]:
    addrs = []
    # connect() on a UDP socket only picks a route and source address.
    for family, target in ((socket.AF_INET, "192.0.2.1"), (socket.AF_INET6, "2001:db8::1")):
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect((target, 9))
                addrs.append(s.getsockname()[0])
        except OSError:
            pass
    try:
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            hexaddr = line.split()[0]
            addrs.append(str(ipaddress.IPv6Address(bytes.fromhex(hexaddr))))
    except (OSError, ValueError, IndexError):
        pass
    return addrs


def _default_names() -> list[str]:
    names = ["localhost", "127.0.0.1", "::1", socket.gethostname()]
    fqdn = _bounded(socket.getfqdn, NAME_LOOKUP_TIMEOUT_S)
    if fqdn:
        names.append(fqdn)
    return names + local_addresses()


def _split_names(names: list[str]) -> tuple[list[str], list[str]]:
    """Split into (DNS names, IP strings), dropping blanks and duplicates."""
    hostnames, ips = [], []
    for name in names:
        name = name.strip().strip("[]")
        if not name:
            continue
        try:
            ips.append(str(ipaddress.ip_address(name)))
        except ValueError:
            hostnames.append(name.lower().rstrip("."))
    return _unique(hostnames), _unique(ips)


def _still_good(cert_path: Path, hostnames: list[str], ips: list[str]) -> bool:
    try:
        cert = x509.load_pem_x509_certificates(cert_path.read_bytes())[0]
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return False
    have_dns = {n.lower() for n in san.get_values_for_type(x509.DNSName)}
    have_ips = {str(a) for a in san.get_values_for_type(x509.IPAddress)}
    fresh = cert.not_valid_after_utc - _now() > RENEW_BEFORE
    return fresh and set(hostnames) <= have_dns and set(ips) <= have_ips


def _bounded(fn, timeout_s: float):
    """Call fn() in a daemon thread; return its result, or None after timeout_s or on error."""
    result = []

    def run():
        try:
            result.append(fn())
        except Exception:
            pass

    t = threading.Thread(target=run, name="gpulayer-name-lookup", daemon=True)
    t.start()
    t.join(timeout_s)
    return result[0] if result else None


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _key_pem(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write_private(path: Path, data: bytes) -> None:
    """Write atomically with mode 0600 from the first byte (never world-readable, even briefly)."""
    _write_atomic(path, data, 0o600)


def _write_public(path: Path, data: bytes) -> None:
    _write_atomic(path, data, 0o644)


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(fd, mode)  # O_CREAT's mode is masked by umask and ignored for an existing file
        f.write(data)
        f.flush()
        os.fsync(fd)
    os.replace(tmp, path)


def _unique(items: list) -> list:
    return list(dict.fromkeys(items))


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)
