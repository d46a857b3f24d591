"""A real control plane and real worker agents as OS processes, for the fleet tests.

The server runs `gpulayer server start` on a free loopback port over a temporary
home made by `gpulayer server init --json`, with a short heartbeat (0.5 s) and
lease (3 s); workers run `gpulayer worker start`. Every wait is bounded.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

CLI = [sys.executable, "-m", "gpulayer.cli"]
REPO = Path(__file__).resolve().parents[2]
HEARTBEAT_S = 0.5
LEASE_TTL_S = 3.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra: str) -> dict:
    """This environment without GPULAYER_* settings, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def wait_for(predicate, timeout: float, what: str):
    """Poll `predicate` until it returns something truthy; fail naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def stop(proc: subprocess.Popen, timeout: float = 15.0) -> int:
    """SIGTERM, then SIGKILL after `timeout`; the exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Fleet:
    """One server process, any number of worker processes."""

    root: Path
    url: str = ""
    client_token: str = ""
    join_token: str = ""
    server: subprocess.Popen | None = None
    workers: dict = field(default_factory=dict)
    port: int = 0

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def state(self) -> Path:
        return self.home / "state.db"

    # -- processes -----------------------------------------------------------

    def start(self) -> "Fleet":
        init = subprocess.run([*CLI, "server", "init", "--home", str(self.home), "--json"],
                              env=clean_env(), capture_output=True, text=True, check=True, timeout=60)
        tokens = json.loads(init.stdout)
        self.client_token, self.join_token = tokens["client_token"], tokens["join_token"]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.start_server()
        return self

    def start_server(self) -> None:
        log = open(self.root / "server.log", "a")
        self.server = subprocess.Popen(
            [*CLI, "server", "start", "--home", str(self.home), "--host", "127.0.0.1", "--port", str(self.port),
             "--heartbeat-interval", str(HEARTBEAT_S), "--lease-ttl", str(LEASE_TTL_S)],
            env=clean_env(), stdout=log, stderr=subprocess.STDOUT, cwd=self.root)
        wait_for(self._healthy, 30, "the control plane to answer /v1/health")

    def restart_server(self) -> None:
        assert stop(self.server) == 0, self.logs()
        self.start_server()

    def _healthy(self) -> bool:
        if self.server.poll() is not None:
            raise AssertionError(f"the server exited early:\n{self.logs()}")
        try:
            return requests.get(f"{self.url}/v1/health", timeout=1).ok
        except requests.RequestException:
            return False

    def spawn_worker(self, name: str, *, token: str | None = None, labels: dict | None = None,
                     argv: list[str] | None = None, parallel: int = 1) -> subprocess.Popen:
        """Start a worker process (not waiting for it); its output goes to ROOT/NAME.log."""
        args = argv or [*CLI, "--url", self.url, "worker", "start", "--name", name, "--parallel", str(parallel),
                        "--state-dir", str(self.root / name)]
        for k, v in (labels or {}).items():
            args += ["--label", f"{k}={v}"]
        log = open(self.root / f"{name}.log", "w")
        proc = subprocess.Popen(args, env=clean_env(GPULAYER_JOIN_TOKEN=token or self.join_token,
                                                     GPULAYER_URL=self.url,
                                                     GPULAYER_ARTIFACT_CACHE=str(self.root / f"{name}-cache")),
                                stdout=log, stderr=subprocess.STDOUT, cwd=self.root)
        self.workers[name] = proc
        return proc

    def start_worker(self, name: str, listed_as: str | None = None, **kwargs) -> subprocess.Popen:
        """Start a worker process and wait until the control plane lists it online (as `listed_as`,
        the name of its join token when that was minted); returns the process."""
        proc = self.spawn_worker(name, **kwargs)
        wait_for(lambda: self.worker(listed_as or name, proc), 20, f"worker {listed_as or name} to be online")
        return proc

    def worker(self, name: str, proc: subprocess.Popen | None = None) -> dict | None:
        """The online worker called `name`, as GET /v1/workers lists it."""
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"worker {name} exited early:\n{self.log(name)}")
        for w in self.get("/v1/workers").json()["workers"]:
            if w["name"] == name and w["state"] == "online":
                return w
        return None

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text() if path.exists() else ""

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.root.glob("*.log")))

    def close(self) -> None:
        for proc in self.workers.values():
            stop(proc)
        if self.server is not None:
            stop(self.server)

    # -- HTTP, CLI and SQL -----------------------------------------------------

    def get(self, path: str, token: str | None = None, **kw) -> requests.Response:
        return requests.get(self.url + path, headers=bearer(token or self.client_token), timeout=10, **kw)

    def post(self, path: str, body=None, token: str | None = None, headers: dict | None = None):
        return requests.post(self.url + path, json=body if body is not None else {}, timeout=40,
                             headers={**bearer(token or self.client_token), **(headers or {})})

    def submit(self, spec: dict) -> int:
        answer = self.post("/v1/jobs", spec)
        assert answer.status_code == 201, answer.text
        return answer.json()["id"]

    def job(self, job_id: int) -> dict:
        return self.get(f"/v1/jobs/{job_id}").json()

    def wait_job(self, job_id: int, states=("succeeded", "failed", "cancelled", "lost"), timeout: float = 20) -> dict:
        return wait_for(lambda: (j := self.job(job_id))["state"] in states and j, timeout,
                        f"job {job_id} to reach {states}")

    def cli(self, *args: str, input: str | None = None, timeout: float = 60, **env: str):
        """Run `gpulayer ARGS` as a user of this fleet; the CompletedProcess."""
        return subprocess.run([*CLI, *args], input=input, capture_output=True, text=True, timeout=timeout,
                              cwd=self.root, env=clean_env(GPULAYER_URL=self.url, GPULAYER_TOKEN=self.client_token,
                                                           **env))

    def sql(self, query: str, params=()) -> list[tuple]:
        """Rows of a query over the state file, read-only."""
        conn = sqlite3.connect(f"file:{self.state}?mode=ro", uri=True, timeout=10)
        try:
            return conn.execute(query, params).fetchall()
        finally:
            conn.close()

    def register(self, token: str, *, name: str = "raw", labels: dict | None = None, protocol: str = "1"):
        """POST /v1/workers/register by hand, as an agent would."""
        body = {"name": name, "labels": labels or {}, "version": "test",
                "resources": {"cpus": 4, "gpus": 0, "memory_mb": 4096, "gpu_models": []}}
        return self.post("/v1/workers/register", body, token=token, headers={"X-GpuLayer-Protocol": protocol})

    def worker_call(self, session: str, path: str, body=None):
        return self.post(path, body, token=session, headers={"X-GpuLayer-Protocol": "1"})
