"""A real control plane and several real worker agents as OS processes (plain HTTP, or TLS).

Used by the integration tests of services, multi-node jobs and remote workers.
Every worker is its own `gpulayer worker start` process with its own
--state-dir; a worker may run inside a network namespace (`ip netns exec`)
with its own address. With `tls=True` the server gets a CA and a certificate
for its address (gpulayer.certs), workers get `--ca-file`, and CLI users
`GPULAYER_CA_FILE`.
"""
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


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def clean_env(**extra: str) -> dict:
    """This environment without GPULAYER_* settings, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def wait_for(predicate, timeout: float, what: str, every: float = 0.05):
    """Poll `predicate` until it returns something truthy; fail naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


def pid_alive(pid: int) -> bool:
    """True while a process with this pid exists (and is not a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> int:
    """SIGTERM, then SIGKILL after `timeout`; the exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


@dataclass
class Cluster:
    """One server process and N worker processes; `host` is the address the server listens on."""

    root: Path
    host: str = "127.0.0.1"
    tls: bool = False
    url: str = ""
    client_token: str = ""
    join_token: str = ""
    procs: dict = field(default_factory=dict)

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def ca_file(self) -> Path | None:
        """The CA that signed the server's certificate (None over plain HTTP)."""
        return self.root / "tls" / "ca.pem" if self.tls else None

    @property
    def verify(self) -> str | bool:
        """`verify=` for requests: the cluster's CA, or True over plain HTTP."""
        return str(self.ca_file) if self.tls else True

    def env(self, **extra: str) -> dict:
        """The environment a CLI user of this cluster has."""
        if self.tls:
            extra = {"GPULAYER_CA_FILE": str(self.ca_file), **extra}
        return clean_env(GPULAYER_URL=self.url, GPULAYER_TOKEN=self.client_token,
                         GPULAYER_HOME=str(self.root / "client-home"), **extra)

    def cli(self, *args: str, timeout: float = 30):
        """Run `gpulayer ARGS` against this cluster; the CompletedProcess."""
        return subprocess.run([*CLI, *args], env=self.env(), capture_output=True, text=True,
                              timeout=timeout, cwd=self.root)

    def client(self):
        import gpulayer as gl
        return gl.connect(url=self.url, token=self.client_token, ca_file=self.ca_file and str(self.ca_file))

    def request(self, method: str, path: str, **kwargs) -> requests.Response:
        """`METHOD /v1PATH` with the client token; the response, whatever its status."""
        headers = {"Authorization": f"Bearer {self.client_token}", **kwargs.pop("headers", {})}
        return requests.request(method, f"{self.url}/v1{path}", headers=headers, verify=self.verify,
                                timeout=kwargs.pop("timeout", 10), **kwargs)

    def api(self, path: str) -> dict:
        r = self.request("GET", path)
        r.raise_for_status()
        return r.json()

    def start_server(self, lease_ttl: float = 3.0) -> "Cluster":
        init = subprocess.run([*CLI, "server", "init", "--home", str(self.home), "--json"],
                              env=clean_env(), capture_output=True, text=True, check=True)
        tokens = json.loads(init.stdout)
        self.client_token, self.join_token = tokens["client_token"], tokens["join_token"]
        port = free_port(self.host)
        if self.tls:
            from gpulayer.certs import make_ca, make_server_cert
            ca, ca_key = make_ca(self.root / "tls")
            cert, key = make_server_cert(self.root / "tls", ca, ca_key, ["localhost"], [self.host])
            self.url = f"https://{self.host}:{port}"
            extra = ["--tls-cert", str(cert), "--tls-key", str(key)]
        else:
            self.url = f"http://{self.host}:{port}"
            extra = [] if self.host.startswith("127.") else ["--allow-insecure-remote"]
        self._spawn("server", [*CLI, "server", "start", "--home", str(self.home), "--host", self.host,
                               "--port", str(port), "--heartbeat-interval", "0.5", "--lease-ttl", str(lease_ttl),
                               *extra], clean_env())
        wait_for(self._healthy, 30, "the control plane to answer /v1/health")
        return self

    def start_worker(self, name: str, *, advertise: str | None = None, netns: str | None = None,
                     parallel: int = 1, gpus: int | None = 0, labels: dict | None = None,
                     env: dict | None = None, wait: bool = True) -> subprocess.Popen:
        """Start a worker process (optionally in a network namespace); wait until it is online.

        `gpus=None` leaves the count to the agent's inventory (GPULAYER_WORKER_GPUS in `env`);
        `env` adds to the worker's environment.
        """
        argv = [*CLI, "--url", self.url, "worker", "start", "--name", name, "--parallel", str(parallel),
                "--state-dir", str(self.state_dir(name))]
        if gpus is not None:
            argv += ["--gpus", str(gpus)]
        for key, value in (labels or {}).items():
            argv += ["--label", f"{key}={value}"]
        if advertise:
            argv += ["--advertise-address", advertise]
        if self.tls:
            argv[len(CLI):len(CLI)] = ["--ca-file", str(self.ca_file)]
        elif not self.host.startswith("127."):
            argv += ["--insecure"]
        if netns:
            argv = ["ip", "netns", "exec", netns, *argv]
        proc = self._spawn(name, argv, clean_env(GPULAYER_JOIN_TOKEN=self.join_token,
                                                 GPULAYER_ARTIFACT_CACHE=str(self.root / f"{name}-cache"),
                                                 **(env or {})))
        if wait:
            self.wait_online(name)
        return proc

    def wait_online(self, name: str) -> int:
        """The id of worker `name` once the control plane lists it online."""
        return wait_for(lambda: self._online(name), 30, f"worker {name} to be online")

    def state_dir(self, name: str) -> Path:
        """The --state-dir of worker `name`."""
        return self.root / name

    def _spawn(self, name: str, argv: list[str], env: dict) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "w")
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.root)
        self.procs[name] = proc
        return proc

    def _healthy(self) -> bool:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited early ({proc.returncode}):\n{self.logs()}")
        try:
            return requests.get(f"{self.url}/v1/health", timeout=1, verify=self.verify).ok
        except requests.RequestException:
            return False

    def _online(self, name: str) -> int | None:
        self._healthy()
        return next((w["id"] for w in self.api("/workers")["workers"]
                     if w["name"] == name and w["state"] == "online"), None)

    def job(self, job_id: int) -> dict:
        return self.api(f"/jobs/{job_id}")

    def wait_job(self, job_id: int, states=("succeeded", "failed", "cancelled", "lost"),
                 timeout: float = 30) -> dict:
        """The job once its state is one of `states`; fails after `timeout` seconds."""
        return wait_for(lambda: (j := self.job(job_id))["state"] in states and j, timeout,
                        f"job {job_id} to reach {states}")

    def events(self, job_id: int) -> list[dict]:
        return self.api(f"/jobs/{job_id}/events")["events"]

    def current_tasks(self, job_id: int) -> list[dict]:
        info = self.job(job_id)
        return sorted((t for t in info["tasks"] if t["attempt"] == info["attempt"]), key=lambda t: t["index"])

    def log_text(self, job_id: int) -> str:
        return "\n".join(line["text"] for line in self.api(f"/jobs/{job_id}/logs?limit=1000")["lines"])

    def logs(self) -> str:
        """Every process's output so far (for failure messages)."""
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.root.glob("*.log")))

    def stop(self) -> dict:
        """Stop the workers, then the server; their exit statuses by name."""
        codes = {}
        for name in [n for n in self.procs if n != "server"] + ["server"]:
            if name in self.procs:
                codes[name] = stop_process(self.procs[name])
        return codes
