"""Headers for API tests."""
from __future__ import annotations

PROTO = {"X-GpuLayer-Protocol": "1"}


def bearer(token, **extra):
    return {"Authorization": f"Bearer {token}", **PROTO, **extra}
