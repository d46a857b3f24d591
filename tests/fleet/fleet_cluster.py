"""The fleet tests' control plane: gpulayer.testing's, with a short heartbeat (0.5 s) and lease (3 s),
plus the protocol calls the tests make by hand, as an agent would (register, worker_call)."""
from __future__ import annotations

import requests

from gpulayer.testing import ControlPlaneProcess, WorkerProcess

HEARTBEAT_S = 0.5
LEASE_TTL_S = 3.0


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


class Fleet(ControlPlaneProcess):
    """One server process, any number of worker processes (`start_worker`, `workers`)."""

    def __init__(self, root):
        super().__init__(root, heartbeat_interval=HEARTBEAT_S, lease_ttl=LEASE_TTL_S)

    def restart_server(self) -> None:
        assert self.restart() == 0, self.logs()

    def spawn_worker(self, name: str, **options) -> WorkerProcess:
        """Start a worker process, not waiting for it to be online."""
        return self.start_worker(name, wait=False, **options)

    def get(self, path: str, token: str | None = None, **kw) -> requests.Response:
        return self.request("GET", path, token=token, **kw)

    def post(self, path: str, body=None, token: str | None = None, headers: dict | None = None):
        return self.request("POST", path, json=body if body is not None else {}, token=token, headers=headers,
                            timeout=40)

    def register(self, token: str, *, name: str = "raw", labels: dict | None = None, protocol: str = "1"):
        """POST /v1/workers/register by hand, as an agent would."""
        body = {"name": name, "labels": labels or {}, "version": "test",
                "resources": {"cpus": 4, "gpus": 0, "memory_mb": 4096, "gpu_models": []}}
        return self.post("/v1/workers/register", body, token=token, headers={"X-GpuLayer-Protocol": protocol})

    def worker_call(self, session: str, path: str, body=None):
        return self.post(path, body, token=session, headers={"X-GpuLayer-Protocol": "1"})
