"""Standard Webhooks (https://www.standardwebhooks.com): the `whsec_` secret and the three headers.

`webhook-signature` is `v1,` and the base64 of HMAC-SHA256, keyed by the secret's base64-decoded bytes,
over `{webhook-id}.{webhook-timestamp}.{body}`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

PREFIX = "whsec_"


def new_secret() -> str:
    """A fresh signing secret: `whsec_` and 32 random bytes in base64."""
    return PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header's value."""
    key = base64.b64decode(secret[len(PREFIX) :] if secret.startswith(PREFIX) else secret)
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def headers(secret: str, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The headers a signed delivery carries."""
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp), "webhook-signature": sign(secret, msg_id, timestamp, body)}


def message_id(webhook_id: int, event_seq: int) -> str:
    """The same for every try of one event to one webhook, so receivers deduplicate."""
    return f"msg_gl{webhook_id}e{event_seq}"
