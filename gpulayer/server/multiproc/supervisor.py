"""`--front-ends N` (N > 1): the supervisor that starts the writer process and N front ends, and restarts them.

The supervisor is the `gpulayer server start` (or `up`) process itself: it holds the home's lock and the port
(a socket bound with SO_REUSEPORT that does not listen, so a port 0 is one port for every front end and no
connection queues on it), starts the writer process, waits until its RPC socket is up, then starts the front
ends and waits until each listens. A child that exits is started again (a front end at once, the writer too:
the front ends answer 503 to writes meanwhile and reconnect); SIGTERM stops the front ends first (their
requests in progress finish), then the writer (its queued writes commit). A writer fenced by a restore exits 3
and the supervisor stops as one process would (`fenced`).

Each child is `python -m gpulayer.server.multiproc.child ROLE FD`: its settings come pickled on its stdin,
and it writes one byte to FD once it serves. It stops when the supervisor dies (child.py).
"""
from __future__ import annotations

import logging
import os
import pickle
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from gpulayer.server.config import ControlPlaneConfig
from gpulayer.server.errors import ConfigError
from gpulayer.server.homelock import HomeLock
from gpulayer.server.multiproc.frontend import bound_socket

log = logging.getLogger("gpulayer.server.multiproc.supervisor")
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
RESTART_PAUSE_S = 0.5   # between a child's exit and its restart (a child failing at once does not spin)
WRITER = "writer"
FENCED_EXIT = 3


class Supervisor:
    """The processes of `--front-ends N`: start() returns once all serve; the same stop/url/fenced as
    process.ControlPlane."""

    def __init__(self, config: ControlPlaneConfig, *, lock: HomeLock | None = None):
        """`config` checked already (process.new_plane: check_config)."""
        self.config = config
        self.lock = lock or HomeLock(config.layout.home, "gpulayer server start")
        self._own_lock = lock is None
        self.fenced = threading.Event()
        self.children: dict[str, subprocess.Popen] = {}
        self._stopping = threading.Event()
        self._port_holder: socket.socket | None = None
        self._dir: str | None = None
        self._monitor: threading.Thread | None = None
        self.port = config.port

    @property
    def socket_path(self) -> Path:
        assert self._dir is not None
        return Path(self._dir) / "writer.sock"

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.config.host in ("0.0.0.0", "::") else self.config.host
        host = f"[{host}]" if ":" in host else host
        return f"{'https' if self.config.tls_cert else 'http'}://{host}:{self.port}"

    def front_end_names(self) -> list[str]:
        return [f"front-end-{i}" for i in range(1, self.config.front_ends + 1)]

    def start(self) -> None:
        """Take the lock, start every process, return once all serve. Raises ConfigError (HomeInUse, a child
        that exited before it served), OSError (the port)."""
        self.lock.acquire()
        try:
            holder = self._port_holder = bound_socket(self.config.host, self.config.port, listen=False)
            self.port = holder.getsockname()[1]
            self._dir = tempfile.mkdtemp(prefix="gpulayer-")  # 0700: the writer's socket is the owner's alone
            self._start_child(WRITER)
            self._start_child(*self.front_end_names())
        except BaseException:
            self._stop_children()
            self._cleanup()
            raise
        self.lock.note(url=self.url)
        self._monitor = threading.Thread(target=self._watch, name="gpulayer-supervisor", daemon=True)
        self._monitor.start()
        log.info("server_started url=%s state=%s front_ends=%d", self.url, self.config.layout.state,
                 self.config.front_ends)

    def _start_child(self, *names: str) -> None:
        """Start the processes `names` at once; return once each serves (ConfigError if one does not)."""
        started = [self._spawn(name) for name in names]
        try:
            for name, proc, read_end in started:
                self._wait_ready(name, proc, read_end)
                log.info("process_started name=%s pid=%d", name, proc.pid)
        finally:
            for _, _, read_end in started:
                os.close(read_end)

    def _spawn(self, name: str) -> tuple[str, subprocess.Popen, int]:
        read_end, write_end = os.pipe()
        role = WRITER if name == WRITER else "front-end"
        try:
            proc = subprocess.Popen([sys.executable, "-m", "gpulayer.server.multiproc.child", role, str(write_end)],
                                    stdin=subprocess.PIPE, pass_fds=(write_end,), env=self._child_env())
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        assert proc.stdin is not None
        proc.stdin.write(pickle.dumps((self.config, str(self.socket_path), self.port, logging.getLogger().level)))
        proc.stdin.close()
        self.children[name] = proc
        return name, proc, read_end

    def _child_env(self) -> dict:
        """The children's environment: the shared directory of /metrics' histograms (http/metrics.py)."""
        assert self._dir is not None
        shared = Path(self._dir) / "metrics"
        shared.mkdir(exist_ok=True)
        return {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(shared)}

    def _wait_ready(self, name: str, proc: subprocess.Popen, read_end: int) -> None:
        ready, _, _ = select.select([read_end], [], [], READY_TIMEOUT_S)
        if ready and os.read(read_end, 1) == b"1":
            return
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        raise ConfigError(f"the {name} process did not start (exit status {proc.returncode}): see its lines above")

    def _watch(self) -> None:
        restarting: set[str] = set()
        while not self._stopping.wait(0.2):
            for name, proc in list(self.children.items()):
                code = proc.poll()
                if code is None or self._stopping.is_set() or name in restarting:
                    continue
                if name == WRITER and code == FENCED_EXIT:
                    self.fenced.set()
                    return
                log.warning("process_exited name=%s pid=%d status=%s: starting it again", name, proc.pid, code)
                restarting.add(name)
                threading.Thread(target=self._restart, args=(name, restarting), daemon=True,
                                 name=f"gpulayer-restart-{name}").start()

    def _restart(self, name: str, restarting: set[str]) -> None:
        """Start `name` again (each on its own thread: a writer's restart does not wait for a front end's)."""
        try:
            if not self._stopping.wait(RESTART_PAUSE_S):
                self._start_child(name)
        except (ConfigError, OSError) as exc:
            log.error("process_restart_failed name=%s error=%s", name, exc)
        finally:
            restarting.discard(name)

    def stop(self) -> None:
        """Stop the front ends (their requests in progress finish), then the writer; drop the lock."""
        self._stopping.set()
        if self._monitor is not None:
            self._monitor.join(READY_TIMEOUT_S)
        self._stop_children()
        self._cleanup()
        log.info("server_stopped")

    def _stop_children(self) -> None:
        front_ends = [proc for name, proc in self.children.items() if name != WRITER]
        for group in (front_ends, [self.children[WRITER]] if WRITER in self.children else []):
            for proc in group:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in group:
                try:
                    proc.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    log.error("process_stop_timeout pid=%d: killed", proc.pid)
                    proc.kill()
                    proc.wait()

    def _cleanup(self) -> None:
        if self._port_holder is not None:
            self._port_holder.close()
            self._port_holder = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        if self._own_lock:
            self.lock.release()
