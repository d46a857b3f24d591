"""The integration tests' control plane: gpulayer.testing's, with heartbeat 0.5 s and lease 3 s, whose
workers (`--gpus 0` unless told) may run in a network namespace (`ip netns exec`, tests/netns.py)."""
from __future__ import annotations

from netns import netns_exec

from gpulayer.testing import ControlPlaneProcess, WorkerProcess


class Cluster(ControlPlaneProcess):
    """One server process and N worker processes; `host` is the address the server listens on."""

    def __init__(self, root, host: str = "127.0.0.1", tls: bool = False):
        super().__init__(root, host=host, tls=tls, heartbeat_interval=0.5, lease_ttl=3.0)

    def start_server(self, lease_ttl: float = 3.0) -> "Cluster":
        self.lease_ttl = lease_ttl
        return self.start()

    def start_worker(self, name: str, *, netns: str | None = None, gpus: int | None = 0, wait: bool = True,
                     **options) -> WorkerProcess:
        """Start a worker process (in network namespace `netns`); with `wait`, until it is online.

        `gpus=None` leaves the count to the agent's inventory (GPULAYER_WORKER_GPUS in `env`).
        """
        prefix = netns_exec(netns) if netns else []
        worker = super().start_worker(name, wait=False, prefix=prefix, gpus=gpus, **options)
        if wait:
            self.wait_online(name)
        return worker

    def wait_online(self, name: str) -> int:
        """The id of worker `name` once the control plane lists it online."""
        return self.wait_worker_online(name, process=self.workers.get(name))["id"]

    def state_dir(self, name: str):
        """The --state-dir of worker `name`."""
        return self.workers[name].state_dir if name in self.workers else self.root / name

    def api(self, path: str) -> dict:
        """GET /v1PATH's JSON body."""
        return self.get_json(f"/v1{path}")

    def current_tasks(self, job_id: int) -> list[dict]:
        info = self.job(job_id)
        return sorted((t for t in info["tasks"] if t["attempt"] == info["attempt"]), key=lambda t: t["index"])

    def log_text(self, job_id: int) -> str:
        return "\n".join(line["text"] for line in self.api(f"/jobs/{job_id}/logs?limit=1000")["lines"])
