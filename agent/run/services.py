"""Service replicas: restarts with backoff, a fresh $PORT per run, endpoints, health checks."""

import http.client
import socket
import time
from typing import Callable, Protocol

from gpulayer.protocol import plural
from gpulayer.protocol.assignment import Assignment
from gpulayer.protocol.fields import field_of
from gpulayer.protocol.jobspec import HealthSpec, ServiceSpec

from ..events import log_event
from ..link.backoff import next_restart_delay
from ..link.logship import LogShipper
from ..sandbox.process import TaskProcess
from .rendezvous import free_port
from .supervision import Limits, Stop, StopRule, TaskHandle, TaskResult, result_of, supervise

#: Until the replica answers, probes go 20 ms apart for its first PROBE_FAST_S seconds (an interpreter's start,
#: a small server's bind: reported within 20 ms of it, which is what an autoscaler's new replicas wait for), then
#: back off to 250 ms (a model that loads for a minute is not probed 50 times a second).
PROBE_FIRST_S = 0.02
PROBE_FAST_S = 3.0
PROBE_EVERY_S = 0.25
HEALTH_TIMEOUT_S = 5.0
#: Once a replica without a health check answers, its port is probed this often (a check's default interval).
UNCHECKED_INTERVAL_S = float(field_of(HealthSpec, "interval_s").default)


def tcp_accepts(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """True when ``host:port`` accepts a TCP connection."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def http_status(host: str, port: int, path: str, timeout_s: float) -> int | str:
    """The status of ``GET path``, or a short error text."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        connection.request("GET", path if path.startswith("/") else "/" + path)
        return connection.getresponse().status
    except (OSError, http.client.HTTPException) as exc:
        return type(exc).__name__
    finally:
        connection.close()


class EndpointProbe:
    """Reports the endpoint once the port answers, then runs the health checks.

    ``tick()`` is called by the supervisor; it returns a restart reason when
    ``failures`` consecutive health checks failed.
    """

    def __init__(self, handle, port: int, advertise: str, health: HealthSpec | None,
                 clock: Callable[[], float] = time.monotonic):
        self.handle = handle
        self.port = port
        self.advertise = advertise
        self.health = health
        self.clock = clock
        self.ready = False
        self.failures = 0
        self.next_at = self.started = clock()
        self.probe_wait_s = PROBE_FIRST_S

    def _interval_s(self) -> float:
        """Seconds between health checks (a replica without a check: between TCP probes once ready)."""
        return float(self.health.interval_s if self.health else UNCHECKED_INTERVAL_S)

    def _hosts(self) -> list[str]:
        return ["127.0.0.1"] if self.advertise in ("127.0.0.1", "localhost") else ["127.0.0.1", self.advertise]

    def _check(self) -> tuple[bool, str]:
        path = self.health.http_path if self.health else None
        for host in self._hosts():
            if not path:
                if tcp_accepts(host, self.port):
                    return True, "accepts TCP"
                continue
            timeout = min(HEALTH_TIMEOUT_S, max(1.0, self._interval_s()))
            status = http_status(host, self.port, path, timeout)
            last = f"GET {path}: {status}"
            if isinstance(status, int):  # the service answered: that is its health, whatever the host
                return 200 <= status < 300, last
        return False, last if path else "does not accept TCP"

    def tick(self) -> str | None:
        """Probe when due; returns a restart reason or None."""
        now = self.clock()
        if now < self.next_at:
            return None
        ok, detail = self._check()
        if not self.ready:
            self.next_at = now + self.probe_wait_s
            if now - self.started >= PROBE_FAST_S:
                self.probe_wait_s = min(PROBE_EVERY_S, self.probe_wait_s * 1.5)
            if ok:
                self.ready = True
                self.handle.endpoint = f"{self.advertise}:{self.port}"
                self.next_at = now + self._interval_s()
                log_event("service_endpoint", task_id=self.handle.task_id, endpoint=self.handle.endpoint)
            return None
        return self._health_result(ok, detail, now)

    def wait_s(self) -> float:
        """Seconds until the next probe is due (0 when it is): how long the supervisor may wait before a tick."""
        return max(0.0, self.next_at - self.clock())

    def _health_result(self, ok: bool, detail: str, now: float) -> str | None:
        if not self.health or not self.health.http_path:
            return None
        self.next_at = now + self._interval_s()
        self.failures = 0 if ok else self.failures + 1
        limit = self.health.failures
        if self.failures >= limit:
            return f"health check failed {plural(self.failures, 'time')} in a row ({detail})"
        return None


def should_restart(policy: str, exit_code: int, health_failed: bool) -> bool:
    """``always`` restarts after any exit, ``on_failure`` after a non-zero one (or a failed health check)."""
    return policy == "always" or health_failed or exit_code != 0


class ReplicaContext(Protocol):
    """What a service replica needs of its worker's settings (state.TaskContext is one)."""

    @property
    def advertise_address(self) -> str: ...

    @property
    def kill_grace_s(self) -> float: ...


class ReplicaRunner(Protocol):
    """What a service replica needs of the runner of its task (runner.TaskRunner is one, and calls
    run_service with itself): this module imports nothing of runner.py."""

    @property
    def assignment(self) -> Assignment: ...

    @property
    def handle(self) -> TaskHandle: ...

    @property
    def ctx(self) -> ReplicaContext: ...

    @property
    def shipper(self) -> LogShipper: ...

    def spawn(self, extra: dict[str, str]) -> TaskProcess | TaskResult:
        """Start the command with `extra` in its environment; a failed result when it cannot start."""

    def exit_code(self, proc: TaskProcess) -> int:
        """The ended process's exit code."""

    def stop_rule(self) -> StopRule:
        """How the job's process is stopped (its `signal` and `grace_seconds`)."""


def run_service(runner: ReplicaRunner, service: ServiceSpec, extra_env: dict[str, str]) -> TaskResult:
    """Run a service replica until it ends for good, is cancelled or times out."""
    handle = runner.handle
    limits = Limits(runner.assignment.timeout_seconds, runner.assignment.silence_timeout_seconds, time.monotonic())
    delay: float | None = None
    while True:
        port = free_port() if service.port else None
        env = dict(extra_env, **({"PORT": str(port)} if port else {}))
        handle.state, handle.endpoint = "running", None
        proc = runner.spawn(env)
        if isinstance(proc, TaskResult):
            return proc
        probe = EndpointProbe(handle, port, runner.ctx.advertise_address, service.health) if port else None
        run_limits = Limits(limits.timeout_s, limits.silence_s, limits.since)
        stop = supervise(proc, handle, run_limits, runner.shipper.system, runner.ctx.kill_grace_s, probe.tick if probe else None,
                         rule=runner.stop_rule(), tick_in=probe.wait_s if probe else None)
        proc.finish_readers()
        handle.endpoint = None
        exit_code = runner.exit_code(proc)
        run_seconds = time.monotonic() - proc.started
        if stop is not None and stop.kind != "restart":
            return result_of(stop, exit_code)
        why = stop.reason if stop else f"exited with code {exit_code}"
        ended = _ended_for_good(service, handle.restarts, exit_code, stop, why, runner.shipper.system)
        if ended is not None:
            return ended
        delay = next_restart_delay(delay, run_seconds)
        handle.state = "restarting"
        handle.restarts += 1
        runner.shipper.system(f"restart {handle.restarts}: {why}; next run in {delay:g} s")
        log_event("service_restart", task_id=handle.task_id, restarts=handle.restarts, reason=why, delay_s=delay)
        waited = _wait_restart(handle, limits, delay)
        if waited is not None:
            runner.shipper.system(waited.reason)
            return result_of(waited, exit_code)


def _ended_for_good(service: ServiceSpec, restarts: int, exit_code: int, stop: Stop | None, why: str, system_line) -> "TaskResult | None":
    """The replica's final result when it must not restart, else None."""

    health_failed = stop is not None
    outcome = "succeeded" if exit_code == 0 and not health_failed else "failed"
    if not should_restart(service.restart, exit_code, health_failed):
        system_line(f"service ended: {why} (restart policy {service.restart})")
        return TaskResult(exit_code, outcome, why)
    max_restarts = service.max_restarts
    if max_restarts is not None and restarts >= int(max_restarts):
        system_line(f"service ended: {why}; it restarted {plural(int(max_restarts), 'time')}, its max_restarts")
        return TaskResult(exit_code, outcome, f"{why}; restarts used up ({max_restarts})")
    return None


def _wait_restart(handle, limits: Limits, delay: float) -> Stop | None:
    """Sleep ``delay`` unless a cancel or the service's timeout comes first."""
    limits.timeout_s = handle.limit_from(limits.timeout_s)  # as `job update --time` left it
    if limits.timeout_s is not None:
        left = limits.since + limits.timeout_s - time.monotonic()
        if left < delay:
            if handle.wait_cancel(max(0.0, left)):
                return Stop("cancelled", handle.stop_reason())
            return Stop("timed_out", f"timeout: ran longer than timeout_seconds={limits.timeout_s:g}")
    if handle.wait_cancel(delay):
        return Stop("cancelled", handle.stop_reason())
    return None
