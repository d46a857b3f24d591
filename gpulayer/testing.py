"""A real control plane and real workers as child processes, for tests (ours and yours).

Like falcon.testing, a supported module: use it to test an integration against
the real thing rather than a mock::

    from gpulayer.testing import ControlPlaneProcess

    with ControlPlaneProcess(tmp_path, heartbeat_interval=0.5, lease_ttl=3) as plane:
        plane.start_worker("w1", parallel=2)            # returns once it is listed online
        job_id = plane.submit({"command": ["echo", "hello"]})
        assert plane.wait_job(job_id)["state"] == "succeeded"
        rc, out, err = plane.cli("job", "logs", str(job_id))

Every process is `python -m gpulayer.cli ...` with this interpreter and a clean
environment (the caller's GPULAYER_* variables removed), so little of the
server is imported here: only what `server init` calls, run in this process
(one process start less for each control plane). Under `root`:

    home/            the control plane's home (what `gpulayer server init` makes)
    server.log       its output, every start appended
    tls/             CA and server certificate, with tls=True
    NAME/ NAME.log   worker NAME's --state-dir and output (NAME-cache/: artifact cache)
    client-home/     GPULAYER_HOME of `cli()`

Every wait is bounded. A wait that runs out raises TimedOut; a process that
exits while waited on raises ProcessExited with the log tails. Both are
AssertionErrors, so a test runner reports them as failures. This module
imports only the standard library and requests (gpulayer.server.security.auth for the
home, gpulayer.server.security.certs for TLS, gpulayer.client.api for `client()`, when asked for).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Callable, NamedTuple, Sequence

import requests

#: The `gpulayer` command line for a child process: this interpreter, so the child runs this gpulayer.
CLI = [sys.executable, "-m", "gpulayer.cli"]
#: `server start --http` for every ControlPlaneProcess whose args name none (granian serves by default;
#: "cheroot" runs a suite under cheroot); read at each start, in this process (children never see
#: GPULAYER_* variables).
TEST_HTTP_VARIABLE = "GPULAYER_TEST_HTTP"
#: The job states that do not change any more.
FINAL_STATES = ("succeeded", "failed", "cancelled", "lost")
# The folder that holds gpulayer/ and agent/: first on a child's PYTHONPATH.
_SOURCE_ROOT = Path(__file__).resolve().parents[1]


class TimedOut(AssertionError):
    """A wait ran out of time."""


class ProcessExited(AssertionError):
    """A control plane or worker process exited while the harness waited on it."""


class CliResult(NamedTuple):
    """What `gpulayer ARGS` did: unpacks as (rc, stdout, stderr)."""

    returncode: int
    stdout: str
    stderr: str


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def clean_env(**extra: str) -> dict:
    """This process's environment without GPULAYER_* variables, this gpulayer importable, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_SOURCE_ROOT), env.get("PYTHONPATH")]))
    env["PYTHONFAULTHANDLER"] = "1"  # a hung child prints its threads' stacks on SIGABRT (see stop_process)
    env.update(extra)
    return env


def run_cli(*args: str, env: dict | None = None, input: str | None = None, timeout: float = 90,
            cwd: str | Path | None = None) -> CliResult:
    """Run `gpulayer ARGS` with clean_env(**env); raises subprocess.TimeoutExpired after `timeout` s."""
    done = subprocess.run([*CLI, *args], env=clean_env(**(env or {})), input=input, capture_output=True,
                          text=True, timeout=timeout, cwd=cwd)
    return CliResult(done.returncode, done.stdout, done.stderr)


def echo_round_trip(port: int, size: int, block: bytes, host: str = "127.0.0.1", timeout: float = 30) -> float:
    """`size` bytes (whole `block`s) written to the echo server at host:`port` and read back at once (a thread
    writes, this one reads), then a half-close; AssertionError unless the same bytes came back (count and
    sha256). The seconds it took (the port-forward tests and scripts/bench_forward.py)."""
    import hashlib
    import threading

    blocks = size // len(block)
    want = hashlib.sha256()
    for _ in range(blocks):
        want.update(block)
    began = time.perf_counter()
    with socket.create_connection((host, port), timeout) as conn:

        def send() -> None:
            for _ in range(blocks):
                conn.sendall(block)
            conn.shutdown(socket.SHUT_WR)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        got, count = hashlib.sha256(), 0
        while chunk := conn.recv(1 << 20):
            got.update(chunk)
            count += len(chunk)
        sender.join()
    elapsed = time.perf_counter() - began
    assert (count, got.hexdigest()) == (blocks * len(block), want.hexdigest()), f"{count} of {blocks * len(block)} bytes came back"
    return elapsed


def wait_for(predicate: Callable[[], object], timeout: float, what: str = "the condition", *,
             interval: float = 0.05, details: Callable[[], str] | None = None):
    """Call `predicate` until it returns something truthy, and return that.

    Raises TimedOut naming `what` (and the text of `details()`) after `timeout`
    seconds; what `predicate` raises goes through (ProcessExited, say).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            extra = f"\n{details()}" if details else ""
            raise TimedOut(f"timed out after {timeout} s waiting for {what}{extra}")
        time.sleep(interval)


def stop_process(proc: subprocess.Popen, timeout: float = 20.0) -> int:
    """SIGTERM; after `timeout` s SIGABRT (its stacks go to its output), after 5 s more SIGKILL; the status."""
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


def pid_alive(pid: int) -> bool:
    """True while a process with this pid exists and is not a zombie (Linux /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def task_dirs(state_dir: Path) -> list[Path]:
    """The working directories a worker holds now under `state_dir`: `tasks/<task>-<attempt>`, a plain task's
    in a sandbox made ahead `tasks/box-<n>/<task>-<attempt>`, an array element's `tasks/job-<id>/<task>-<attempt>`
    (docs/workers.md, "What a task gets"). A spare sandbox's empty box is none."""
    tasks = Path(state_dir) / "tasks"
    found = [*tasks.glob("*-*"), *tasks.glob("box-*/*-*"), *tasks.glob("job-*/*-*")]
    return sorted(path for path in found if path.is_dir() and path.name[:1].isdigit())


def host_pids(marker: str, *, env: str | Sequence[str] = ()) -> list[int]:
    """Live processes (host pids) whose command line holds `marker` and whose environment holds each of
    `env` ("KEY=VALUE"). A sandboxed task sees the pids of its own PID namespace (os.getpid() is 2
    there): this finds its processes from outside, as the agent's group kill must end them."""
    wanted = [item.encode() for item in ([env] if isinstance(env, str) else env)]
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if marker not in argv or (wanted and not set(wanted) <= set((entry / "environ").read_bytes().split(b"\0"))):
                continue
        except OSError:
            continue
        if pid_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def _loopback(host: str) -> bool:
    return host.startswith("127.") or host in ("localhost", "::1")


class ChildProcess:
    """One child process whose output goes to `log_path`: start, stop, kill, pause, resume."""

    label = "process"  # in messages

    def __init__(self, log_path: Path):
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen | None = None
        self._log: IO[str] | None = None

    def _spawn(self, argv: list[str], env: dict, cwd: Path, mode: str = "w") -> None:
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"{self.label} is already running (pid {self.proc.pid})")
        self._log = open(self.log_path, mode)
        self.proc = subprocess.Popen(argv, env=env, stdout=self._log, stderr=subprocess.STDOUT, cwd=cwd)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def _started(self) -> subprocess.Popen:
        """The process; raises RuntimeError when it was never started."""
        if self.proc is None:
            raise RuntimeError(f"{self.label} was never started")
        return self.proc

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait(self, timeout: float | None = None) -> int:
        """Its exit status; raises subprocess.TimeoutExpired after `timeout` s."""
        return self._started().wait(timeout)

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM and wait (see stop_process); the exit status, None if it never started."""
        if self.proc is None:
            return None
        code = stop_process(self.proc, timeout)
        self._close_log()
        return code

    def kill(self) -> int | None:
        """SIGKILL, as a crash or the OOM killer would: no shutdown code runs. The exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.kill()
        code = self.proc.wait(10)
        self._close_log()
        return code

    def pause(self) -> None:
        """SIGSTOP: the process (not its children in sessions of their own) stops answering."""
        os.kill(self._started().pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after pause()."""
        os.kill(self._started().pid, signal.SIGCONT)

    def log(self, chars: int | None = None) -> str:
        """Its output so far (the last `chars` characters)."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text[-chars:] if chars else text

    def check_alive(self) -> None:
        """Raises ProcessExited, with its log tail, when it has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise ProcessExited(f"{self.label} exited with {self.proc.returncode}:\n{self.log(4000)}")

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


class WorkerProcess(ChildProcess):
    """`gpulayer worker start` with a join token, as a child process; start() does not wait for it.

    `parallel`, `gpus`, `cpus`: None leaves them to the agent. `prefix` runs the
    command under another (["ip", "netns", "exec", NAME]); `argv` replaces the
    command whole (the environment stays); `env` adds to the environment.
    """

    def __init__(self, url: str, join_token: str, name: str, root: str | Path, *, ca_file: str | Path | None = None,
                 insecure: bool = False, parallel: int | None = 1, gpus: int | None = None, cpus: int | None = None,
                 labels: dict | None = None, advertise: str | None = None, state_dir: str | Path | None = None,
                 args: Sequence[str] = (), env: dict | None = None, prefix: Sequence[str] = (),
                 argv: list[str] | None = None):
        self.root = Path(root)
        super().__init__(self.root / f"{name}.log")
        self.url, self.join_token, self.name = url, join_token, name
        self.label = f"worker {name}"
        self.state_dir = Path(state_dir) if state_dir else self.root / name
        command = [*CLI, "--url", url, *(["--ca-file", str(ca_file)] if ca_file else []), "worker", "start",
                   "--name", name, "--state-dir", str(self.state_dir)]
        for flag, value in (("--parallel", parallel), ("--gpus", gpus), ("--cpus", cpus),
                            ("--advertise-address", advertise)):
            if value is not None:
                command += [flag, str(value)]
        for key, value in (labels or {}).items():
            command += ["--label", f"{key}={value}"]
        command += [*(["--insecure"] if insecure else []), *args]
        self.argv = [*prefix, *(argv or command)]
        self.env = {"GPULAYER_URL": url, "GPULAYER_JOIN_TOKEN": join_token,
                    "GPULAYER_ARTIFACT_CACHE": str(self.root / f"{name}-cache"), **(env or {})}

    def start(self) -> "WorkerProcess":
        self._spawn(self.argv, clean_env(**self.env), self.root)
        return self


class ControlPlaneProcess(ChildProcess):
    """`gpulayer server init` and `server start` as a child process, with workers and API helpers.

    `root` None: a temporary folder, removed by close(). `port` 0: a free one,
    kept across restarts. `tls`: a CA and a certificate for `host` (gpulayer.server.security.certs);
    `ca_file` and `verify` then name the CA. A plain-HTTP `host` off loopback gets
    --allow-insecure-remote. `args` go after the others (`--synchronous full`);
    `env` adds to the server's environment. GPULAYER_TEST_HTTP=cheroot in this
    process's environment adds `--http cheroot` where `args` name no front end.
    Use as a context manager, or start() and close().
    """

    label = "the control plane"

    def __init__(self, root: str | Path | None = None, *, host: str = "127.0.0.1", port: int = 0, tls: bool = False,
                 heartbeat_interval: float | None = None, lease_ttl: float | None = None, args: Sequence[str] = (),
                 env: dict | None = None):
        self._temporary = root is None
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="gpulayer-test-"))
        self.root.mkdir(parents=True, exist_ok=True)
        super().__init__(self.root / "server.log")
        self.host, self.port, self.tls = host, port or free_port(host), tls
        self.heartbeat_interval, self.lease_ttl = heartbeat_interval, lease_ttl
        self.args, self.env = list(args), dict(env or {})
        self.client_token = self.join_token = ""
        self.workers: dict[str, WorkerProcess] = {}
        self.starts = 0

    # -- the process ---------------------------------------------------------------

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def state(self) -> Path:
        """The state file."""
        return self.home / "state.db"

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    @property
    def ca_file(self) -> Path | None:
        """The CA that signed the server's certificate; None over plain HTTP."""
        return self.root / "tls" / "ca.pem" if self.tls else None

    @property
    def verify(self) -> str | bool:
        """`verify=` for requests: the CA file, or True over plain HTTP."""
        return str(self.ca_file) if self.tls else True

    @property
    def tokens(self) -> dict:
        return {"client_token": self.client_token, "join_token": self.join_token}

    def init(self) -> None:
        """What `gpulayer server init` does (--force on a home initialised before: new tokens), in this process:
        the function the command calls, without a process start for it; TLS files."""
        from gpulayer.server.security.auth import init_home
        tokens = init_home(self.home, force=(self.home / "server-credentials.json").exists())
        self.client_token, self.join_token = tokens["client_token"], tokens["join_token"]
        ca_file = self.ca_file  # None over plain HTTP
        if ca_file is not None and not ca_file.exists():
            from gpulayer.server.security.certs import make_ca, make_server_cert
            ca, ca_key = make_ca(self.root / "tls")
            make_server_cert(self.root / "tls", ca, ca_key, ["localhost"], [self.host])

    def start(self, timeout: float = 30.0) -> "ControlPlaneProcess":
        """Start the server (init first, once) and wait until /v1/health answers."""
        if not self.client_token:
            self.init()
        argv = [*CLI, "server", "start", "--home", str(self.home), "--host", self.host, "--port", str(self.port)]
        if self.heartbeat_interval is not None:
            argv += ["--heartbeat-interval", str(self.heartbeat_interval)]
        if self.lease_ttl is not None:
            argv += ["--lease-ttl", str(self.lease_ttl)]
        if self.tls:
            argv += ["--tls-cert", str(self.root / "tls" / "server.pem"),
                     "--tls-key", str(self.root / "tls" / "server-key.pem")]
        elif not _loopback(self.host):
            argv.append("--allow-insecure-remote")
        front_end = os.environ.get(TEST_HTTP_VARIABLE)
        if front_end and "--http" not in self.args:
            argv += ["--http", front_end]
        self.starts += 1
        self._spawn([*argv, *self.args], clean_env(**self.env), self.root, mode="a")
        wait_for(self.healthy, timeout, "the control plane to answer /v1/health")
        return self

    def restart(self, timeout: float = 30.0) -> int | None:
        """stop() then start() on the same port; the exit status of the stop."""
        code = self.stop()
        self.start(timeout)
        return code

    def healthy(self) -> bool:
        """True when /v1/health answers; ProcessExited when the server has exited."""
        self.check_alive()
        try:
            return requests.get(f"{self.url}/v1/health", timeout=1, verify=self.verify).ok
        except requests.RequestException:
            return False

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise ProcessExited(f"the control plane exited with {self.proc.returncode}:\n{self.logs()}")

    def logs(self, chars: int = 3000) -> str:
        """The tail of every log under root (for failure messages)."""
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}"
                         for p in sorted(self.root.glob("*.log")))

    def close(self) -> dict:
        """Stop the workers, then the server; their exit statuses by name ("server" last)."""
        codes = {name: worker.stop() for name, worker in reversed(list(self.workers.items()))}
        codes["server"] = self.stop()
        if self._temporary:
            shutil.rmtree(self.root, ignore_errors=True)
        return codes

    def __enter__(self) -> "ControlPlaneProcess":
        return self if self.running else self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- workers -----------------------------------------------------------------------

    def start_worker(self, name: str, *, wait: bool = True, listed_as: str | None = None, timeout: float = 30,
                     **options) -> WorkerProcess:
        """Start WorkerProcess `name` (WorkerProcess's options; the server's join token unless
        `join_token=`) and, with `wait`, return once it is listed online (as `listed_as`: a minted
        join token registers its worker under the token's name)."""
        if name in self.workers and self.workers[name].running:
            raise RuntimeError(f"worker {name} is already running")
        options.setdefault("join_token", self.join_token)
        options.setdefault("insecure", not self.tls and not _loopback(self.host))
        worker = WorkerProcess(self.url, options.pop("join_token"), name, self.root, ca_file=self.ca_file,
                               **options).start()
        self.workers[name] = worker
        if wait:
            self.wait_worker_online(listed_as or name, timeout, process=worker)
        return worker

    def online_worker(self, name: str) -> dict | None:
        """Worker `name` as GET /v1/workers lists it, when it is online."""
        return next((w for w in self.get_json("/v1/workers")["workers"]
                     if w["name"] == name and w["state"] == "online"), None)

    def wait_worker_online(self, name: str, timeout: float = 30, *, process: WorkerProcess | None = None) -> dict:
        """Worker `name` once listed online; ProcessExited when `process` or the server exits first."""
        def online():
            if process is not None:
                process.check_alive()
            self.check_alive()
            return self.online_worker(name)
        return wait_for(online, timeout, f"worker {name} to be online", details=self.logs)

    def wait_workers_online(self, count: int, timeout: float = 30) -> list[dict]:
        """The online workers, once there are at least `count`."""
        def enough():
            self.check_alive()
            online = [w for w in self.get_json("/v1/workers")["workers"] if w["state"] == "online"]
            return online if len(online) >= count else None
        return wait_for(enough, timeout, f"{count} workers to be online", details=self.logs)

    # -- the API, the CLI, the state file ---------------------------------------------

    def headers(self, token: str | None = None) -> dict:
        return {"Authorization": f"Bearer {token or self.client_token}"}

    def request(self, method: str, path: str, *, token: str | None = None, headers: dict | None = None,
                timeout: float = 10, **kwargs) -> requests.Response:
        """`METHOD PATH` (from the root: "/v1/jobs") with the client token or `token`; any status."""
        return requests.request(method, self.url + path, headers={**self.headers(token), **(headers or {})},
                                verify=self.verify, timeout=timeout, **kwargs)

    def get_json(self, path: str, **kwargs):
        """The JSON body of GET PATH; requests.HTTPError on an error status."""
        answer = self.request("GET", path, **kwargs)
        answer.raise_for_status()
        return answer.json()

    def submit(self, spec: dict) -> int:
        """POST /v1/jobs; the job id. AssertionError with the body unless 201."""
        answer = self.request("POST", "/v1/jobs", json=spec)
        assert answer.status_code == 201, answer.text
        return answer.json()["id"]

    def job(self, job_id: int) -> dict:
        return self.get_json(f"/v1/jobs/{job_id}")

    def events(self, job_id: int) -> list[dict]:
        """Every event of the job, oldest first: its pages, following `next` (as the Python client does)."""
        with self.client() as client:
            return client.get_job_events(job_id)

    def wait_job(self, job_id: int, states=FINAL_STATES, timeout: float = 30) -> dict:
        """The job once its state is one of `states`."""
        return wait_for(lambda: (j := self.job(job_id))["state"] in states and j, timeout,
                        f"job {job_id} to reach {states}")

    def wait_task_running(self, job_id: int, timeout: float = 60) -> dict:
        """The job once a task of it runs (the job reads `running` from the moment its task is assigned)."""
        def running() -> dict | None:
            job = self.job(job_id)
            return job if any(t["state"] == "running" for t in job["tasks"]) else None
        return wait_for(running, timeout, f"a task of job {job_id} to run")

    def cli_env(self, **extra: str) -> dict:
        """The GPULAYER_* settings of a CLI user of this control plane, plus `extra`."""
        settings = {"GPULAYER_URL": self.url, "GPULAYER_TOKEN": self.client_token,
                    "GPULAYER_HOME": str(self.root / "client-home")}
        if self.tls:
            settings["GPULAYER_CA_FILE"] = str(self.ca_file)
        return {**settings, **extra}

    def cli(self, *args: str, input: str | None = None, timeout: float = 90, **env: str) -> CliResult:
        """Run `gpulayer ARGS` in root as a user of this control plane (cli_env(**env))."""
        return run_cli(*args, env=self.cli_env(**env), input=input, timeout=timeout, cwd=self.root)

    def client(self):
        """A gpulayer.Client of this control plane."""
        from gpulayer.client.api import connect
        return connect(url=self.url, token=self.client_token, ca_file=str(self.ca_file) if self.ca_file else None)

    def sql(self, query: str, params=()) -> list[tuple]:
        """The rows of a query over the state file, opened read-only."""
        conn = sqlite3.connect(f"file:{self.state}?mode=ro", uri=True, timeout=10)
        try:
            return conn.execute(query, params).fetchall()
        finally:
            conn.close()
