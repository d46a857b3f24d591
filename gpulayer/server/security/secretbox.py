"""Secret values encrypted at rest, with a key kept beside the server secret.

The key (Fernet: AES-128-CBC with HMAC-SHA256) lives in $GPULAYER_HOME/secrets.key
(0600), never in the state file, so a copy of the state file reveals nothing.
What is stored, and who gets a value, is scheduler/secrets.py's.
"""
from __future__ import annotations

from cryptography.fernet import Fernet

from gpulayer.server.config import HomeLayout
from gpulayer.server.security.auth import write_private


class SecretBox:
    """Encrypts and decrypts secret values with the home's key (made on first use)."""

    def __init__(self, layout: HomeLayout):
        if not layout.secrets_key.exists():
            write_private(layout.secrets_key, Fernet.generate_key().decode() + "\n")
        self._fernet = Fernet(layout.secrets_key.read_text().strip().encode())

    def seal(self, value: str) -> bytes:
        return self._fernet.encrypt(value.encode("utf-8"))

    def open(self, ciphertext: bytes) -> str:
        return self._fernet.decrypt(ciphertext).decode("utf-8")
