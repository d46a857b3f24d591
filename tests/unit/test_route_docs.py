"""Every /v1 route the app serves is documented in docs/protocol.md (and the reverse)."""
from __future__ import annotations

import re
from pathlib import Path

from gpulayer.server.http.app import ROUTES

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def _plain(template: str) -> str:
    """The route with every parameter written `{}` (the docs say {id} where the code says {job_id:int})."""
    return re.sub(r"\{[^}]*\}", "{}", template)


def test_every_route_is_documented():
    text = _plain(DOC.read_text())
    missing = [_plain(path) for path, _, _ in ROUTES if _plain(path) not in text]
    assert not missing, f"routes missing from docs/protocol.md: {missing}"


def test_every_documented_route_exists():
    served = {_plain(path) for path, _, _ in ROUTES} | {"/v1/openapi.json"}
    documented = {_plain(p) for p in re.findall(r"`(?:GET|POST|PUT|DELETE|HEAD)(?:/\w+)* (/v1/[^ `?]*)", DOC.read_text())}
    unknown = sorted(p for p in documented if p not in served and not p.endswith("..."))
    assert not unknown, f"docs/protocol.md documents routes the app does not serve: {unknown}"
