"""TLS trust for the control plane: a CA file, or a CA pinned by fingerprint.

With ``--ca-fingerprint sha256:HEX`` the worker fetches ``GET /v1/ca.pem``
once without verification, accepts it only when the SHA-256 of its DER bytes
equals the fingerprint, saves it as ``<state_dir>/ca.pem`` and verifies every
later connection against it.
"""

import hashlib
import os
import ssl
import warnings
from pathlib import Path

import requests

from .. import PROTOCOL
from ..errors import AgentError
from ..events import log_event


def normalize_fingerprint(fingerprint: str) -> str:
    """``sha256:AB:CD...`` or ``sha256:abcd...`` → lower-case hex without separators."""
    text = fingerprint.strip().lower()
    if text.startswith("sha256:"):
        text = text[len("sha256:") :]
    text = text.replace(":", "")
    if len(text) != 64 or any(ch not in "0123456789abcdef" for ch in text):
        raise AgentError(f"invalid CA fingerprint {fingerprint!r}: expected sha256:<64 hex>")
    return text


def pem_fingerprint(pem: str) -> str:
    """Hex SHA-256 of the DER bytes of the first certificate in a PEM text."""
    end_marker = "-----END CERTIFICATE-----"
    first = pem[: pem.index(end_marker) + len(end_marker)] if end_marker in pem else pem
    try:
        der = ssl.PEM_cert_to_DER_cert(first.strip() + "\n")
    except ValueError as exc:
        raise AgentError(f"the control plane's CA is not a PEM certificate: {exc}") from None
    return hashlib.sha256(der).hexdigest()


def _fetch_ca(base_url: str) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the InsecureRequestWarning is the point here
        try:
            response = requests.get(
                base_url + "/v1/ca.pem", verify=False, timeout=30, headers={"X-GpuLayer-Protocol": str(PROTOCOL)}
            )
        except requests.RequestException as exc:
            raise AgentError(f"cannot fetch the control plane's CA from {base_url}: {type(exc).__name__}") from None
    if response.status_code != 200:
        raise AgentError(f"cannot fetch the control plane's CA from {base_url}: HTTP {response.status_code}")
    return response.text


def pin_ca(base_url: str, fingerprint: str, state_dir: str | os.PathLike) -> str:
    """The path of the pinned CA file, fetching and checking it on first contact.

    Raises AgentError when the served CA does not match the fingerprint.
    """
    expected = normalize_fingerprint(fingerprint)
    path = Path(state_dir) / "ca.pem"
    if path.exists() and pem_fingerprint(path.read_text()) == expected:
        return str(path)
    pem = _fetch_ca(base_url)
    actual = pem_fingerprint(pem)
    if actual != expected:
        raise AgentError(f"the control plane's CA has fingerprint sha256:{actual}, expected sha256:{expected}: refusing to trust it")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(pem)
    log_event("ca_pinned", path=str(path), fingerprint="sha256:" + actual)
    return str(path)


def resolve_verify(base_url: str, ca_file: str | None, ca_fingerprint: str | None, state_dir: str) -> bool | str:
    """The ``verify`` value for requests: a CA path, or True for the system CAs."""
    if not base_url.startswith("https://"):
        return True
    if ca_file:
        if not os.path.exists(ca_file):
            raise AgentError(f"CA file {ca_file} does not exist")
        return ca_file
    if ca_fingerprint:
        return pin_ca(base_url, ca_fingerprint, state_dir)
    return True
