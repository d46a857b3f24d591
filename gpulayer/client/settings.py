"""Where the client connects: an argument, GPULAYER_URL/TOKEN/CA_FILE, or what `gpulayer up` left in client.json."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from gpulayer.protocol import default_home


@dataclass(frozen=True)
class Settings:
    """Where a client connects: the resolved URL, token and CA file."""

    url: str | None
    token: str | None
    ca_file: str | None
    from_file: bool = False  # the URL came from client.json (left by `gpulayer up`)


def read_client_file(home: Path | str | None = None) -> dict:
    """What `gpulayer up` left in `$GPULAYER_HOME/client.json`, or {} when absent or unreadable."""
    path = Path(home).expanduser() if home else default_home()
    try:
        data = json.loads((path / "client.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def resolve_settings(url=None, token=None, ca_file=None, home=None) -> Settings:
    """Arguments first, then GPULAYER_URL/TOKEN/CA_FILE, then `$GPULAYER_HOME/client.json`.

    The token and CA file of client.json are used only for client.json's own URL,
    so a token is never sent to a server it was not made for.
    """
    url = url or os.environ.get("GPULAYER_URL") or None
    token = token or os.environ.get("GPULAYER_TOKEN") or None
    ca_file = ca_file or os.environ.get("GPULAYER_CA_FILE") or None
    saved = read_client_file(home)
    from_file = False
    if saved.get("url") and (url is None or url.rstrip("/") == str(saved["url"]).rstrip("/")):
        from_file = url is None
        url = url or saved["url"]
        token = token or saved.get("token")
        ca_file = ca_file or saved.get("ca_file")
    return Settings(url.rstrip("/") if url else None, token, ca_file, from_file)


def server_configured(url=None, home=None) -> bool:
    """True when a URL comes from an argument, GPULAYER_URL or client.json."""
    return resolve_settings(url=url, home=home).url is not None

