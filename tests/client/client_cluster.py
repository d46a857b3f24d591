"""A real control plane and worker as OS processes, for the client's integration tests."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

CLI = [sys.executable, "-m", "gpulayer.cli"]
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra: str) -> dict:
    """This environment without GPULAYER_* settings, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env["PYTHONFAULTHANDLER"] = "1"  # a hung process shows its stacks on SIGABRT
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


def stop(proc: subprocess.Popen, timeout: float = 20.0) -> int:
    """SIGTERM; after `timeout` SIGABRT (its threads' stacks go to its log), then SIGKILL; the status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
    return proc.wait()


@dataclass
class Cluster:
    """One server process and one worker process over plain HTTP on 127.0.0.1."""

    root: Path
    url: str = ""
    client_token: str = ""
    join_token: str = ""
    procs: list = field(default_factory=list)

    @property
    def home(self) -> Path:
        return self.root / "home"

    def env(self, **extra: str) -> dict:
        """The environment a CLI user of this cluster has."""
        settings = {"GPULAYER_URL": self.url, "GPULAYER_TOKEN": self.client_token,
                    "GPULAYER_HOME": str(self.root / "client-home")}
        return clean_env(**{**settings, **extra})

    def cli(self, *args: str, input: str | None = None, timeout: float = 90, **env: str):
        """Run `gpulayer ARGS` against this cluster; the CompletedProcess."""
        return subprocess.run([*CLI, *args], env=self.env(**env), input=input, capture_output=True,
                              text=True, timeout=timeout, cwd=self.root)

    def start(self) -> "Cluster":
        init = subprocess.run([*CLI, "server", "init", "--home", str(self.home), "--json"],
                              env=clean_env(), capture_output=True, text=True, check=True)
        tokens = json.loads(init.stdout)
        self.client_token, self.join_token = tokens["client_token"], tokens["join_token"]
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self._spawn("server", [*CLI, "server", "start", "--home", str(self.home), "--host", "127.0.0.1",
                               "--port", str(port), "--heartbeat-interval", "0.5", "--lease-ttl", "5"],
                    clean_env())
        wait_for(self._healthy, 30, "the control plane to answer /v1/health")
        self.start_worker("w1")
        return self

    def start_worker(self, name: str, parallel: int = 2) -> subprocess.Popen:
        """Start one more worker process and wait until the control plane lists it online."""
        proc = self._spawn(name, [*CLI, "--url", self.url, "worker", "start", "--name", name,
                                  "--parallel", str(parallel), "--state-dir", str(self.root / name)],
                           clean_env(GPULAYER_JOIN_TOKEN=self.join_token,
                                     GPULAYER_ARTIFACT_CACHE=str(self.root / f"{name}-cache")))
        wait_for(lambda: self._online(name), 30, f"worker {name} to be online")
        return proc

    def _spawn(self, name: str, argv: list[str], env: dict) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "w")
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.root)
        self.procs.append(proc)
        return proc

    def _healthy(self) -> bool:
        if any(p.poll() is not None for p in self.procs):
            raise AssertionError(f"a process exited early:\n{self.logs()}")
        try:
            return requests.get(f"{self.url}/v1/health", timeout=1).ok
        except requests.RequestException:
            return False

    def _online(self, name: str) -> bool:
        self._healthy()
        answer = requests.get(f"{self.url}/v1/workers", timeout=5,
                              headers={"Authorization": f"Bearer {self.client_token}"}).json()
        return any(w["name"] == name and w["state"] == "online" for w in answer["workers"])

    def logs(self) -> str:
        """Every process's output so far (for failure messages)."""
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.root.glob("*.log")))

    def stop(self) -> list[int]:
        """Stop the workers, then the server; their exit statuses."""
        return [stop(p) for p in reversed(self.procs)]
